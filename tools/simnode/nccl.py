"""An nccl-tests ``all_reduce_perf`` stand-in for simulated nodes (issue 44), answering from real captures.

``write(root, kind)`` puts an executable ``all_reduce_perf`` on the node (``opt/nccl-tests/build`` by default, the
path users give ``gpunode_tuning_gpu_p2p_nccl_tests``) that prints one of the real outputs of tests/data/real
(``CAPTURES``), as a real run would: NCCL's ``NCCL INFO`` lines only when ``NCCL_DEBUG=INFO`` is in its environment
(what the P2P check sets), everything else always. Each call appends its arguments and its ``NCCL_DEBUG`` to
``<root>/var/lib/simnode/nccl-tests.calls``. ``rc`` and ``sleep`` make it fail or hang (the command timeout).

Used by tests (``tests/unit/test_nccl_tests.py``) and by ``simnode build --nccl-tests KIND`` (its PART below).
"""

from __future__ import annotations

import os

from . import parts

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(os.path.dirname(TOOLS), "tests", "data", "real")
MARK = "==> capture follows <==\n"
# The kinds of answer, each a real capture: P2P between 4 RTX 4090s (12.7 GB/s at 32 MiB), NCCL through host
# memory between 8 L20s (no table in the stored copy), and a 2-node run's table at ~95 GB/s.
CAPTURES = {
    "p2p": "nccl-tests-all-reduce-4x4090-p2p-cut-tinygrad-ogkm-22.txt",
    "shm": "nccl-tests-all-reduce-8xl20-shm-cut-nccl-1817.txt",
    "table": "nccl-tests-all-reduce-tail-2node-nccl-tests-252.txt",
    "mi300x": "rccl-tests-all-reduce-8xmi300x-cut-hpc-ai-envs-30.txt",
}
DEFAULT_PATH = "opt/nccl-tests/build/all_reduce_perf"
CALLS = "var/lib/simnode/nccl-tests.calls"

SCRIPT = """#!/bin/sh
# all_reduce_perf stand-in (tools/simnode/nccl.py): a real capture, NCCL's INFO lines only with NCCL_DEBUG=INFO.
mkdir -p '{root}/var/lib/simnode'
echo "NCCL_DEBUG=$NCCL_DEBUG $*" >> '{root}/{calls}'
sleep {sleep}
if [ "$NCCL_DEBUG" = INFO ]; then
  cat '{output}'
else
  grep -v 'NCCL INFO' '{output}'
fi
exit {rc}
"""


def capture(kind: str) -> str:
    """The output part of the capture of ``kind``."""
    if kind not in CAPTURES:
        raise ValueError("nccl-tests stand-in %r is not one of %s" % (kind, ", ".join(sorted(CAPTURES))))
    with open(os.path.join(REAL, CAPTURES[kind]), encoding="utf-8") as fh:
        return fh.read().split(MARK, 1)[1]


def write(root: str, kind: str = "p2p", path: str = DEFAULT_PATH, rc: int = 0, sleep: float = 0) -> str:
    """Ship the stand-in at ``path`` below ``root``; returns its absolute path on the node (``/`` + path)."""
    text = capture(kind)
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    output = full + ".output"
    with open(output, "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(full, "w", encoding="utf-8") as fh:
        fh.write(SCRIPT.format(root=root, calls=CALLS, sleep=sleep, output=output, rc=int(rc)))
    os.chmod(full, 0o755)
    return "/" + path.lstrip("/")


def calls(root: str) -> list:
    """The recorded calls: ``["NCCL_DEBUG=INFO -b 8 ...", ...]``."""
    try:
        with open(os.path.join(root, CALLS), encoding="utf-8") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def _add_arguments(parser) -> None:
    parser.add_argument("--nccl-tests", choices=sorted(CAPTURES),
                        help="ship an all_reduce_perf stand-in answering from this real capture (simnode/nccl.py)")


def _write_part(tree, _preset, _funcs, opts) -> None:
    if opts["nccl_tests"]:
        write(tree.root, opts["nccl_tests"])


def _check(_preset, _funcs, opts) -> None:
    if opts["nccl_tests"] and opts["nccl_tests"] not in CAPTURES:
        raise ValueError("nccl-tests stand-in %r is not one of %s" % (opts["nccl_tests"], ", ".join(sorted(CAPTURES))))


# `build(nccl_tests=KIND)` and `simnode build --nccl-tests KIND` (parts.py).
PART = parts.Part("nccl", options={"nccl_tests": None}, check=_check, write=_write_part,
                  add_arguments=_add_arguments, from_args=lambda args: {"nccl_tests": args.nccl_tests})
