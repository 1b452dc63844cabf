"""Serving-benchmark stand-ins for simulated nodes (the rollout's measure gate, issue 45).

``write(root, fmt, ...)`` ships ``<root>/usr/bin/gpunode-sim-serve``: a stand-in for ``python -m
sglang.bench_serving`` or ``vllm bench serve`` that answers from a real capture (tests/data/real: its
result block, line by line, and the metrics read from it), each metric scaled

- by ``tuned[metric]`` once the node is tuned (its tuning journal exists: before tuning there is none), and
- by the run's noise: runs cycle through ``1 - noise``, ``1``, ``1 + noise`` (a counter on the node), so
  three runs have a spread of exactly ``2 * noise`` of their median.

It prints the result block and, like the real tools, writes the JSON result where asked: sglang's
``--output-file PATH`` gains one JSON line per run; vLLM's ``--result-filename PATH`` is written whole.

    python tools/simbench.py ROOT sglang --tuned output_throughput=1.1 p99_ttft_ms=2 --noise 0.01
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(os.path.dirname(HERE), "tests", "data", "real")
CAPTURES = {"sglang": "bench-sglang-text-fa4-32k-cut-sglang-9428.txt",
            "vllm": "bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt"}
BIN = "usr/bin/gpunode-sim-serve"
CONFIG = "etc/gpunode-sim-serve.json"
COUNTER = "var/lib/gpunode-sim-serve/runs"
JOURNAL = "var/lib/gpunode-tuning/journal.json"

SCRIPT = r'''#!/usr/bin/env python3
# Serving-benchmark stand-in of a simulated node (tools/simbench.py): answers from a real capture.
import json, os, re, sys
ROOT = os.environ.get("GPUNODE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "@CONFIG@")) as fh:
    cfg = json.load(fh)
counter = os.path.join(ROOT, "@COUNTER@")
os.makedirs(os.path.dirname(counter), exist_ok=True)
runs = int(open(counter).read() or 0) if os.path.exists(counter) else 0
with open(counter, "w") as fh:
    fh.write(str(runs + 1))
tuned = os.path.exists(os.path.join(ROOT, "@JOURNAL@"))
noise = 1 + cfg["noise"] * (-1, 0, 1)[runs % 3]
# Counts stay as captured; the throughputs and latencies move with the noise and the tuning.
values = {k: v * noise * (cfg["tuned"].get(k, 1.0) if tuned else 1.0) if "throughput" in k or k.endswith("_ms")
          else v for k, v in cfg["values"].items()}
lines = []
for line, key in cfg["lines"]:
    if key in values and values[key] != cfg["values"][key]:
        line = "%-40s %-10.2f" % (line.split(":", 1)[0] + ":", values[key])
    lines.append(line)
print("\n".join(lines))
args = sys.argv[1:]
for flag, mode in (("--output-file", "a"), ("--result-filename", "w")):
    if flag in args:
        with open(args[args.index(flag) + 1], mode) as fh:
            fh.write(json.dumps(dict(values, backend=cfg["format"])) + "\n")
'''


def capture_values(fmt: str) -> tuple[list, dict]:
    """``(the capture's result block as [line, metric key or None], its metrics)``."""
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import benchmark

    with open(os.path.join(REAL, CAPTURES[fmt]), encoding="utf-8") as fh:
        text = fh.read().partition("==> capture follows <==\n")[2]
    values = benchmark.serving_text(text)
    lines = []
    for line in text.splitlines():
        one = benchmark.serving_text("Serving Benchmark Result\n" + line)
        lines.append([line.rstrip(), next(iter(one)) if len(one) == 1 else None])
    return lines, values


def write(root: str, fmt: str = "sglang", tuned: dict | None = None, noise: float = 0.0) -> str:
    """Ship the stand-in of ``fmt`` (sglang or vllm) on the node at ``root``; return its path."""
    if fmt not in CAPTURES:
        raise ValueError("simbench answers as %s, not %r" % (" or ".join(CAPTURES), fmt))
    lines, values = capture_values(fmt)
    unknown = sorted(set(tuned or {}) - set(values))
    if unknown:
        raise ValueError("the %s capture has no %s (it has %s)" % (fmt, ", ".join(unknown), ", ".join(sorted(values))))
    config = {"format": fmt, "lines": lines, "values": values, "tuned": dict(tuned or {}), "noise": float(noise)}
    for rel, data, mode in ((CONFIG, json.dumps(config, indent=1), 0o644),
                            (BIN, SCRIPT.replace("@CONFIG@", CONFIG).replace("@COUNTER@", COUNTER)
                             .replace("@JOURNAL@", JOURNAL), 0o755)):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(data)
        os.chmod(path, mode)
    return os.path.join(root, BIN)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("root")
    parser.add_argument("format", choices=sorted(CAPTURES))
    parser.add_argument("--tuned", nargs="*", default=[], metavar="METRIC=FACTOR")
    parser.add_argument("--noise", type=float, default=0.0)
    args = parser.parse_args(argv)
    # From a checkout: the collection through its .collections link (pytest has it on its path already).
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), ".collections"))
    tuned = {k: float(v) for k, v in (item.split("=", 1) for item in args.tuned)}
    print(write(args.root, args.format, tuned, args.noise))
    return 0


if __name__ == "__main__":
    sys.exit(main())
