#!/usr/bin/env bash
# Whether a change leaves an NVIDIA node as it was: the same simulated NVIDIA node (audited-epyc-8gpu, nvidia-smi
# stand-in) tuned with tune.yml --tags runtime, then --tags persistent, then verified (verify.yml), from two
# checkouts; stdout (durations removed), every file of the node and the reports are kept per side for diff.
#
#   benchmarks/nvidia_unchanged.sh OLD_CHECKOUT NEW_CHECKOUT OUTDIR
#   diff OUTDIR/old/runtime.stdout OUTDIR/new/runtime.stdout; diff OUTDIR/old/files.sha256 OUTDIR/new/files.sha256
#
# A checkout needs .venv and .collections/ansible_collections/gpunode/tuning -> the checkout (git archive REV | tar
# -x -C DIR, then the two links). The boot runner embeds the collection's code and the journal records times: those
# two files differ between any two revisions.
set -eu
export old=$1 new=$2  # read through ${!side}
out=$3
work=$(mktemp -d)
for side in old new; do
  tree=${!side}
  root=$work/node
  rm -rf "$root" "$work/reports"
  mkdir -p "$out/$side"
  (cd "$tree" && .venv/bin/python tools/simnode build --preset audited-epyc-8gpu "$root" --cpus 4 --nvidia-smi >/dev/null)
  cat > "$work/hosts.yml" <<INV
all:
  vars: {ansible_connection: local, ansible_python_interpreter: $tree/.venv/bin/python, gpunode_tuning_report_dir: $work/reports}
  children: {gpunodes: {hosts: {nvidia: {gpunode_tuning_root: $root}}}}
INV
  for step in "tune.yml --tags runtime" "tune.yml --tags persistent" "verify.yml"; do
    name=$(echo "$step" | awk '{print $NF}' | sed 's/\.yml//')
    # shellcheck disable=SC2086
    (cd "$tree" && ANSIBLE_COLLECTIONS_PATH=$tree/.collections PATH=$tree/.venv/bin:$PATH ansible-playbook \
      -i "$work/hosts.yml" playbooks/$step -e gpunode_tuning_preset=inference-throughput \
      -e gpunode_tuning_iommu_mode=passthrough) | sed -E "s/[0-9]+\.[0-9]+ ?s(econds)?//g; s#$tree#CHECKOUT#g" \
      > "$out/$side/$name.stdout" || true
  done
  (cd "$root" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$out/$side/files.sha256"
  cp -a "$root" "$out/$side/node"
  cp -a "$work/reports" "$out/$side/reports"
done
rm -rf "$work"
