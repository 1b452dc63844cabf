# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which families and persistent concerns a run's Ansible tags select, and the tags the role's tasks carry.

Each flow of the role is two tasks (roles/tuning/tasks): one tagged with the flow's own tag (``runtime``,
``persistent``, ``rollback``) that runs it for every family its tags leave selected, and one tagged with
the tags of the flow's families and concerns (``flow_task_tags``, generated into the role by
tools/generate.py) so that ``--tags pcie_mrrs`` reaches the flow and ``--list-tags`` shows every tag. When
the first one runs, the second returns at once; either way the flow is one module run. A family or concern
counts as tagged with the flow's tag, its own tags and the tags the task inherits, as a task of its own
would be, so ``--tags runtime --skip-tags pcie_mrrs`` runs every runtime family but MRRS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families, persist

# The flows with a task of their own tag and one of their families' tags.
TAGGED_FLOWS = ("runtime", "persistent", "rollback")
# Ansible's special tags: never a family's.
SPECIAL = ("always", "never", "all", "tagged", "untagged")


def run_tags(task_vars: Mapping) -> tuple:
    """``(only, skip)``: the run's ``--tags`` and ``--skip-tags`` (``ansible_run_tags``, ``ansible_skip_tags``)."""
    only = [str(t) for t in task_vars.get("ansible_run_tags") or ["all"]]
    skip = [str(t) for t in task_vars.get("ansible_skip_tags") or []]
    return only, skip


def family_tags(fam) -> set:
    """Tags that select a family: its name and its settings' tags."""
    return set(all_families.selecting_tags(fam))


def tags_select(tags: Iterable[str], only: Iterable[str] | None, skip: Iterable[str] | None) -> bool:
    """Whether Ansible would run a task tagged ``tags`` with ``--tags only --skip-tags skip``."""
    tags, only, skip = set(tags), set(only or ["all"]), set(skip or [])
    run = bool(tags & only) or ("all" in only and "never" not in tags) or ("tagged" in only and bool(tags))
    if run and ("all" in skip or tags & skip or ("tagged" in skip and tags)):
        run = False
    return run


def selected_families(flow: str, only, skip, inherited: Iterable[str] = ()) -> list:
    """The families of the registry that ``flow`` runs under these tags, in registry order.

    A family counts as tagged with the flow's tag, its own tags and the tags the task inherits
    (from the play, the role import, a block), as a task of its own would be.
    """
    base = {flow, *inherited} - {"always"}
    return [fam for fam in registry.FAMILIES if tags_select(base | family_tags(fam), only, skip)]


def selected_concerns(flow: str, only, skip, inherited: Iterable[str] = ()) -> list:
    """The persistent concerns (persist.concerns()) that ``flow`` (persistent or rollback) runs under these tags."""
    base = {flow, *inherited} - {"always"}
    return [c for c in persist.concerns() if tags_select(base | {c.name, *c.tags}, only, skip)]


def rollback_selection(only, skip, inherited: Iterable[str] = ()) -> tuple:
    """``(concerns, families)`` rollback undoes under these tags.

    Rollback's persistent part counts as tagged ``persistent`` and its runtime part ``runtime``:
    ``rollback.yml --tags persistent`` removes only what the persistent flow wrote,
    ``--tags runtime`` restores only the journal, and ``--tags runtime,persistent`` (or none) both.
    """
    inherited = tuple(inherited)
    return (selected_concerns("rollback", only, skip, inherited + ("persistent",)),
            selected_families("rollback", only, skip, inherited + ("runtime",)))


def _unique(tags: Iterable[str]) -> list:
    out: list = []
    for tag in tags:
        if tag not in out and tag not in SPECIAL:
            out.append(tag)
    return out


def flow_task_tags(flow: str) -> list:
    """The tags of a flow's family task, in registry order: every tag that selects one of its families or concerns.

    ``reboot``: the tags of the families whose settings only a reboot applies (the persistent flow's reboot).
    """
    concern_tags = [t for c in persist.concerns() for t in (c.name, *c.tags)]
    if flow == "runtime":
        return _unique(t for fam in registry.FAMILIES if fam.runtime_options is not None
                       for t in all_families.selecting_tags(fam))
    if flow == "persistent":
        return _unique(concern_tags)
    if flow == "rollback":
        return _unique(["runtime", "persistent"] + [t for fam in registry.FAMILIES if fam.restore_options is not None
                                                    for t in all_families.selecting_tags(fam)] + concern_tags)
    if flow == "reboot":
        return _unique(t for fam in registry.FAMILIES if fam.kernel_args is not None or fam.reboot_only
                       or fam.persist_reboots
                       for t in all_families.selecting_tags(fam))
    raise KeyError("no family task for flow %r; known: %s, reboot" % (flow, ", ".join(TAGGED_FLOWS)))


def own_task_runs(flow: str, task_tags: Iterable[str], only, skip) -> bool:
    """Whether the flow's own task runs too: then its family task (tagged ``task_tags``) has nothing to do.

    The family task carries the flow's family tags and what it inherits (a block's, the role import's);
    the flow's own task carries the flow's tag and the same inherited tags.
    """
    inherited = set(task_tags) - set(flow_task_tags(flow)) - {"always"}
    return tags_select(inherited | {flow}, only, skip)


def inherited_tags(flow: str, task_tags: Iterable[str], by_family: bool) -> set:
    """The tags a flow's task inherits: its own minus the ones it carries itself."""
    own = set(flow_task_tags(flow)) if by_family else {flow}
    return set(task_tags) - own - {"always"}
