#!/usr/bin/env python
"""Where the CPU of a playbook run goes, per task: controller, worker, module process.

Runs ``ansible-playbook`` in this process with one addition: every task execution (one task on
one host, in its forked worker) appends a JSON line to LOG with the worker's own CPU seconds
(templating, argument validation, building the module payload, the connection) and its
children's (the module process it started and waited for). The controller's main process
(playbook loading, variable resolution, result handling) is written at exit.

    .venv/bin/python benchmarks/cpu_by_task.py run LOG -- -i INVENTORY playbooks/tune.yml --tags runtime -f 16
    .venv/bin/python benchmarks/cpu_by_task.py report LOG [LOG...]

``report`` prints, per log, the three totals and per task the mean CPU per host in the worker
and in the module process. A measuring aid for benchmarks/bench_fleet.py's P2: it hooks
ansible-core's TaskExecutor.run, an internal interface, and is not part of the collection.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import resource
import sys


def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run(log, args):
    """Run ansible-playbook with ``args`` in this process, logging each task execution's CPU to ``log``."""
    from ansible.executor import task_executor  # noqa: PLC0415  (only after the environment is set)

    original = task_executor.TaskExecutor.run

    def timed_run(self):
        worker, module = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
        try:
            return original(self)
        finally:
            entry = {"task": self._task.get_name(), "action": self._task.action, "host": self._host.name,
                     "worker": cpu(resource.RUSAGE_SELF) - worker, "module": cpu(resource.RUSAGE_CHILDREN) - module}
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")

    task_executor.TaskExecutor.run = timed_run
    main_pid = os.getpid()

    def controller_total():
        if os.getpid() == main_pid:  # forked workers inherit the atexit hook
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"controller": cpu(resource.RUSAGE_SELF)}) + "\n")

    atexit.register(controller_total)
    from ansible.cli.playbook import main as playbook_main  # noqa: PLC0415

    sys.argv = ["ansible-playbook"] + list(args)
    return playbook_main()


def report(paths):
    """Per log: totals, then per task the mean worker and module CPU per host execution."""
    lines = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            entries = [json.loads(line) for line in handle if line.strip()]
        tasks = [e for e in entries if "task" in e]
        controller = sum(e["controller"] for e in entries if "controller" in e)
        hosts = len({e["host"] for e in tasks})
        worker = sum(e["worker"] for e in tasks)
        module = sum(e["module"] for e in tasks)
        lines.append("%s: %d host(s); CPU s: controller %.2f, workers %.2f, module processes %.2f; total %.2f "
                     "(%.3f per host)" % (path, hosts, controller, worker, module, controller + worker + module,
                                          (controller + worker + module) / max(hosts, 1)))
        per_task = collections.OrderedDict()
        for entry in tasks:
            acc = per_task.setdefault(entry["task"], [0.0, 0.0, 0])
            acc[0] += entry["worker"]
            acc[1] += entry["module"]
            acc[2] += 1
        lines.append("  %-72s %5s %9s %9s" % ("task", "runs", "worker", "module"))
        for name, (w_sum, m_sum, count) in per_task.items():
            lines.append("  %-72s %5d %8.3fs %8.3fs" % (name[:72], count, w_sum / count, m_sum / count))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run ansible-playbook ARGS, logging CPU per task execution to LOG")
    p_run.add_argument("log", help="JSON-lines file to write (replaced)")
    p_run.add_argument("args", nargs=argparse.REMAINDER, help="-- then the ansible-playbook arguments")
    p_report = sub.add_parser("report", help="summarize logs")
    p_report.add_argument("logs", nargs="+")
    opts = parser.parse_args(argv)
    if opts.command == "report":
        print(report(opts.logs))
        return 0
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if not args:
        parser.error("run needs the ansible-playbook arguments after --")
    if os.path.exists(opts.log):
        os.unlink(opts.log)
    return run(opts.log, args)


if __name__ == "__main__":
    sys.exit(main())
