#!/usr/bin/env bash
# Run the Molecule scenarios (molecule/*/molecule.yml) in podman: make sure the local Debian
# images exist (scripts/molecule_images.sh), then `molecule test` each scenario with the shared
# base configuration molecule/base.yml, and print the wall time of each one.
# Usage: scripts/molecule.sh [SCENARIO...]   (default: every scenario; `make test-molecule`)
# Environment: MOLECULE_ARGS (extra arguments for `molecule test`, e.g. --destroy=never),
#              plus those of scripts/molecule_images.sh.
set -uo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1
export PATH=$PWD/.venv/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$PWD/.collections
# runc, cgroupfs and ulimits the host grants (see the file); also set in molecule/base.yml for
# the playbooks, here for the image import and the podman calls outside Ansible.
export CONTAINERS_CONF=$PWD/molecule/containers.conf
# The scenarios live in molecule/ at the collection root (not extensions/molecule/).
export MOLECULE_GLOB='molecule/*/molecule.yml'
[[ -t 1 ]] || export NO_COLOR=1 ANSIBLE_NOCOLOR=1

if (($#)); then
    scenarios=("$@")
else
    mapfile -t scenarios < <(for f in molecule/*/molecule.yml; do basename "$(dirname "$f")"; done)
fi

start=$SECONDS
scripts/molecule_images.sh || exit 1
printf 'molecule: images ready in %d s\n' "$((SECONDS - start))"

read -r -a extra <<<"${MOLECULE_ARGS:-}"
failed=()
summary=()
for scenario in "${scenarios[@]}"; do
    printf '=== molecule test -s %s\n' "$scenario"
    t0=$SECONDS
    if molecule --base-config molecule/base.yml test --scenario-name "$scenario" "${extra[@]}"; then
        result=passed
    else
        result=FAILED
        failed+=("$scenario")
    fi
    summary+=("$(printf '%-12s %-7s %4d s' "$scenario" "$result" "$((SECONDS - t0))")")
done

printf 'molecule: wall time per scenario (both releases each)\n'
printf '  %s\n' "${summary[@]}"
printf 'molecule: total %d s\n' "$((SECONDS - start))"
if ((${#failed[@]})); then
    printf 'molecule: FAILED: %s\n' "${failed[*]}" >&2
    exit 1
fi
