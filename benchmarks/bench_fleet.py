"""Performance evidence P1-P5, side by side in one run, as one Markdown table.

P1  runtime tuning (playbooks/tune.yml --tags runtime) at 8 CPUs / 1 GPU vs 384 CPUs / 16 GPUs:
    ratio of the wall times, fastest of 5 rounds each, sizes rotated per round (target <= 1.10).
P2  the same runtime tuning (8 CPUs) vs benchmarks/noop/noop.yml, which makes the same module
    calls and tasks with nothing behind them (target <= 1.25); also against noop_distinct.yml,
    the same calls with the module run going to a no-op module of its own rather than ping, and
    against noop_payload.yml, whose no-op module carries and loads tuning_apply's code ("P2 payload",
    no target: it splits P2 into what carrying the code costs, payload over ping, and what is left,
    tune over payload: the role's controller work and the families' own work).
P3  runtime tuning at 384 CPUs / 16 GPUs vs the naive baseline role (benchmarks/baseline_naive/,
    one task execution per CPU, idle state and device): ratio at 384 CPUs (target <= 0.05). The
    baseline is timed at several CPU counts; unless --naive-full times it at 384 directly, the
    384-CPU figure is a least-squares line through those points, shown with its fit.
P4  tuning_info (the module, in-process, as bench_modules.py times it) on 384 CPUs / 16 GPUs
    with a 100,000-record kernel log (target <= 0.5 s).
P5  playbooks/rollout.yml (runtime tuning, then verification) over 1, 100 (and with --full
    1,000) simulated hosts (tools/simfleet.py), forks 16: wall and CPU time, hosts per minute,
    1,000-host time against ten times the 100-host time (target <= 1.10), and the peak memory
    of the controller (ansible-playbook and its workers, summed PSS; target <= 2 GiB).
P5S the rollout's controller work alone (every host unreachable), at 100 and 1,000 hosts.
P5A Ansible alone (benchmarks/noop/floor.yml, ten skipped tasks) at 100 and 1,000 hosts: how
    much Ansible's own CPU per host and task grows with the fleet, for comparison with P5/P5S.

    .venv/bin/python benchmarks/bench_fleet.py            # P1-P5, P5 at 1 and 100 hosts (~10-15 min on 2 CPUs)
    .venv/bin/python benchmarks/bench_fleet.py --full     # also 1,000 hosts and the naive role at 384 CPUs
    .venv/bin/python benchmarks/bench_fleet.py --quick    # smoke run: one round, small sizes
    .venv/bin/python benchmarks/bench_fleet.py --only P4,P5 --fleet 1,100,1000
    .venv/bin/python benchmarks/bench_fleet.py --only P5A,P5S   # where per-host cost grows with the fleet

Wall times depend on the machine's load; CPU seconds (user+sys of ansible-playbook and every
process it started, module runs included) are printed next to them as the steadier measure.
The table goes to stdout and to --output (default reports/bench_fleet.md), the raw figures to
the .json next to it. Not a test: nothing fails on a missed target unless --strict.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, ".collections"), os.path.join(REPO, "tools"), os.path.join(REPO, "benchmarks")]

import bench_modules  # noqa: E402  (benchmarks/ is put on sys.path above)
import bench_tune  # noqa: E402
import simfleet  # noqa: E402  (tools/ is put on sys.path above)
import simnode  # noqa: E402

VENV_BIN = os.path.join(REPO, ".venv", "bin")
PYTHON = os.path.join(VENV_BIN, "python")
PRESET = "audited-epyc-8gpu"
SMALL = bench_tune.SIZES["small"]  # 8 CPUs, 1 GPU
BIG = bench_tune.SIZES["big"]  # 384 CPUs, 16 GPUs
KMSG_RECORDS = 100_000
FORKS = 16
# P2's no-op playbooks: one ping where tuning makes its one module run, or a distinct no-op module.
NOOP_PLAYBOOKS = {"noop": "noop.yml", "noopd": "noop_distinct.yml", "noopp": "noop_payload.yml"}
TARGETS = {"P1": 1.10, "P2": 1.25, "P2 fleet": 1.25, "P2 distinct": 1.25, "P2 distinct fleet": 1.25,
           "P2 payload": None, "P2 payload fleet": None,
           "P3": 0.05, "P4": 0.5, "P5": 1.10, "P5 memory": 2.0}
# Tasks that run on the controller only; every other task result is a module run on the node.
CONTROLLER_ONLY = {"ansible.builtin.validate_argument_spec", "ansible.builtin.set_fact", "ansible.builtin.debug",
                   "ansible.builtin.assert", "ansible.builtin.meta", "ansible.builtin.include_role",
                   "ansible.builtin.include_tasks"}


# -- Running ansible-playbook and measuring it


def ansible_env():
    """Environment of every ansible-playbook run: this checkout's collection, the venv first."""
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".collections")
    env["ANSIBLE_NOCOLOR"] = "1"
    env.pop("ANSIBLE_CONFIG", None)  # the repository's ansible.cfg (cwd) applies
    return env


class MemorySampler(threading.Thread):
    """Peak memory of a process session: summed PSS of the controller and of everything.

    The controller is ansible-playbook and its forked workers (same command line); the rest are
    the module runs, which on a real fleet run on the nodes. PSS counts pages shared between the
    forked workers once, which RSS would count per worker.
    """

    def __init__(self, sid, interval=0.5):
        super().__init__(daemon=True)
        self.sid = sid
        self.interval = interval
        self.peak_controller = 0
        self.peak_all = 0
        self.peak_processes = 0
        self.stopped = threading.Event()

    @staticmethod
    def _pss_kib(pid):
        try:
            with open("/proc/%s/smaps_rollup" % pid, encoding="ascii", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        return int(line.split()[1])
        except OSError:
            return 0
        return 0

    def sample(self):
        """One pass over /proc: sum PSS per class for the processes of the session."""
        controller = everything = count = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid, encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                if int(fields[3]) != self.sid:  # field 6 of stat, the session id
                    continue
                with open("/proc/%s/cmdline" % pid, "rb") as handle:
                    cmdline = handle.read()
            except (OSError, IndexError, ValueError):
                continue
            pss = self._pss_kib(pid)
            everything += pss
            count += 1
            if b"ansible-playbook" in cmdline:
                controller += pss
        self.peak_controller = max(self.peak_controller, controller)
        self.peak_all = max(self.peak_all, everything)
        self.peak_processes = max(self.peak_processes, count)

    def run(self):
        while not self.stopped.wait(self.interval):
            self.sample()


def run_playbook(playbook, inventory, args=(), json_output=False, memory=False, timeout=7200):
    """Run ansible-playbook; return wall and CPU seconds, exit status, JSON report, output tail, memory."""
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory, playbook] + list(args)
    env = ansible_env()
    if json_output:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    with tempfile.TemporaryFile() as out:
        start = time.monotonic()
        # Not a with-block: the process is reaped by os.wait4 below, which also returns its CPU time.
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = MemorySampler(proc.pid) if memory else None
        if sampler:
            sampler.start()
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if sampler:
            sampler.stopped.set()
            sampler.join()
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    result = {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rc": proc.returncode, "tail": text[-3000:]}
    if json_output and proc.returncode in (0, 2):
        result["report"] = json.loads(text[text.index("{"):])
    if sampler:
        result["memory_mib"] = {"controller_pss": sampler.peak_controller / 1024.0,
                                "all_pss": sampler.peak_all / 1024.0, "processes": sampler.peak_processes}
    return result


def count_runs(report, host):
    """(module runs on the node, tasks run) for one host of a JSON callback report; loop items count singly."""
    modules = tasks = 0
    for play in report["plays"]:
        for task in play["tasks"]:
            res = task["hosts"].get(host)
            if res is None or res.get("skipped"):
                continue
            tasks += 1
            if res.get("action") in CONTROLLER_ONLY:
                continue
            if "module_runs" in res:  # the tuning_flow action counts its own (0 for the precheck)
                modules += res["module_runs"]
                continue
            items = [r for r in res.get("results", []) if not r.get("skipped")]
            modules += len(items) if "results" in res else 1
    return modules, tasks


def families_run(report, host):
    """The knob families one host's module run was for: the runtime flow's (tuning_flow's result), or the names
    noop_payload was given; None for a run with neither (ping)."""
    for play in report["plays"]:
        for task in play["tasks"]:
            res = task["hosts"].get(host) or {}
            if res.get("action") == "gpunode.tuning.tuning_flow" and res.get("families"):
                return sorted(res["families"])
            if res.get("action") == "noop_payload":
                return sorted(f["name"] for f in res["invocation"]["module_args"]["families"])
    return None


def single_host_inventory(workdir, root, name="sim"):
    """An INI inventory with one local host in group gpunodes whose node root is ``root``."""
    path = os.path.join(workdir, "hosts-%s.ini" % name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("[gpunodes]\n%s ansible_connection=local ansible_python_interpreter=%s gpunode_tuning_root=%s\n"
                     % (name, PYTHON, root))
    return path


def fresh_node(workdir, label, **shape):
    """Build a new simulated node of the audited preset below workdir; return its root."""
    root = tempfile.mkdtemp(prefix=label + ".", dir=workdir)
    os.rmdir(root)
    simnode.build(root, PRESET, **shape)
    return root


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -- P1 + P2: runtime tuning small and big, and the no-op playbook, interleaved per round


def noop_playbook(kind):
    """(playbook, extra arguments) of a P1/P2 run kind: tuning, or one of the two no-op playbooks."""
    if kind in NOOP_PLAYBOOKS:
        return os.path.join(REPO, "benchmarks", "noop", NOOP_PLAYBOOKS[kind]), []
    return os.path.join(REPO, "playbooks", "tune.yml"), ["--tags", "runtime"]


def bench_runtime(workdir, rounds):
    """Fastest walls and median CPU of runtime tuning (small, big) and of both no-op playbooks, rotated per round."""
    kinds = ["small", "big", "noop", "noopd", "noopp"]
    walls = {k: [] for k in kinds}
    cpus = {k: [] for k in kinds}
    runs = {}
    families = {}
    for rnd in range(rounds):
        for kind in kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]:
            root = fresh_node(workdir, kind, **(BIG if kind == "big" else SMALL))
            inventory = single_host_inventory(workdir, root)
            playbook, args = noop_playbook(kind)
            res = run_playbook(playbook, inventory, args, json_output=True)
            if res["rc"] != 0:
                sys.exit("%s run failed:\n%s" % (kind, res["tail"]))
            walls[kind].append(res["wall"])
            cpus[kind].append(res["cpu"])
            runs[kind] = count_runs(res["report"], "sim")
            families[kind] = families_run(res["report"], "sim")
            log("P1/P2 round %d %-5s %.2f s wall, %.2f s CPU" % (rnd + 1, kind, res["wall"], res["cpu"]))
    # The fastest round is the one least disturbed by other load on the machine (as in
    # bench_modules.py); CPU seconds, less sensitive to that load, are given as medians.
    best = {k: min(v) for k, v in walls.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpus.items()}
    return {"wall": best, "cpu": med_cpu, "runs": runs, "families": families, "rounds": rounds, "walls": walls,
            "cpus": cpus}


def bench_runtime_fleet(workdir, hosts, rounds):
    """P2 per host: runtime tuning vs the no-op playbooks over a fleet of small nodes (forks 16), best of rounds.

    A single-host run pays once per run for what a fleet shares: building the payload of each
    distinct module (five here, one, ping, for noop.yml) and loading the role. Over a fleet
    those costs are spread, and the ratio shows what each host costs.
    """
    kinds = ["tune", "noop", "noopd", "noopp"]
    walls = {k: [] for k in kinds}
    cpus = {k: [] for k in kinds}
    for rnd in range(rounds):
        for kind in kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]:
            fleet = os.path.join(workdir, "p2fleet-%s-%d" % (kind, rnd))
            inventory = simfleet.build_fleet(fleet, hosts, preset=PRESET, shape=dict(SMALL, kmsg_records=0),
                                             python=PYTHON)
            playbook, args = noop_playbook("small" if kind == "tune" else kind)
            res = run_playbook(playbook, inventory, args + ["-f", str(FORKS)])
            if res["rc"] != 0:
                sys.exit("%s fleet run failed:\n%s" % (kind, res["tail"]))
            walls[kind].append(res["wall"])
            cpus[kind].append(res["cpu"])
            log("P2 fleet round %d %-5s %d hosts: %.2f s wall, %.2f s CPU"
                % (rnd + 1, kind, hosts, res["wall"], res["cpu"]))
            subprocess.run(["rm", "-rf", fleet], check=True)
    return {"hosts": hosts, "wall": {k: min(v) for k, v in walls.items()},
            "cpu": {k: statistics.median(v) for k, v in cpus.items()}, "rounds": rounds, "walls": walls, "cpus": cpus}


# -- P3: the naive baseline at several CPU counts


def linear_fit(points):
    """Least squares y = a + b*x over (x, y) points; returns (a, b, r_squared)."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in points)
    ss_tot = sum((y - mean_y) ** 2 for y in ys)
    return intercept, slope, 1.0 - ss_res / ss_tot if ss_tot else 1.0


def bench_naive(workdir, cpu_counts, gpus):
    """Wall time and module runs of the naive baseline playbook per CPU count (GPUs fixed)."""
    playbook = os.path.join(REPO, "benchmarks", "baseline_naive", "naive.yml")
    points = []
    for count in cpu_counts:
        root = fresh_node(workdir, "naive%d" % count, cpus=count, gpus=gpus)
        res = run_playbook(playbook, single_host_inventory(workdir, root), json_output=True)
        if res["rc"] != 0:
            sys.exit("naive baseline failed at %d CPUs:\n%s" % (count, res["tail"]))
        modules, tasks = count_runs(res["report"], "sim")
        points.append({"cpus": count, "gpus": gpus, "wall": res["wall"], "cpu": res["cpu"], "module_runs": modules,
                       "tasks": tasks})
        log("P3 naive %3d CPUs %2d GPUs: %.1f s wall, %.1f s CPU, %d module runs"
            % (count, gpus, res["wall"], res["cpu"], modules))
    return points


# -- P4: tuning_info on the large node


def bench_facts(workdir, repeat):
    """Best-of-``repeat`` in-process time of tuning_info on 384 CPUs / 16 GPUs / 100k kmsg records."""
    root = fresh_node(workdir, "facts", kmsg_records=KMSG_RECORDS, **BIG)
    args = dict(next(a for name, a in bench_modules.CALLS if name == "tuning_info"), root=root)
    seconds, result = bench_modules.best_of(repeat, lambda: bench_modules.run_main("tuning_info", args))
    facts = result.get("tuning_facts", {})
    log("P4 tuning_info: %.3f s" % seconds)
    return {"seconds": seconds, "failed": bool(result.get("failed")),
            "kmsg_records_read": facts.get("kernel_log", {}).get("records_total")}


# -- P5: the rollout over simulated fleets


def bench_rollout(workdir, sizes):
    """Build a fleet per size and run the rollout over it (forks 16, default canary and batches)."""
    rows = []
    for hosts in sizes:
        fleet = os.path.join(workdir, "fleet-%d" % hosts)
        start = time.monotonic()
        inventory = simfleet.build_fleet(fleet, hosts, python=PYTHON,
                                         extra_vars={"gpunode_tuning_report_dir": os.path.join(fleet, "reports")})
        built = time.monotonic() - start
        log("P5 %d host(s): fleet built in %.1f s; rolling out..." % (hosts, built))
        res = run_playbook(os.path.join(REPO, "playbooks", "rollout.yml"), inventory, ["-f", str(FORKS)], memory=True)
        with open(os.path.join(fleet, "reports", "rollout-summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
        row = {"hosts": hosts, "wall": res["wall"], "cpu": res["cpu"], "rc": res["rc"], "build_s": built,
               "done": int(summary["counts"]["done"]), "memory_mib": res["memory_mib"],
               "hosts_per_min": 60.0 * hosts / res["wall"], "cpu_per_host": res["cpu"] / hosts}
        if res["rc"] != 0 or row["done"] != hosts:
            sys.exit("rollout over %d hosts did not finish (rc %s, %d done):\n%s"
                     % (hosts, res["rc"], row["done"], res["tail"]))
        log("P5 %d host(s): %.1f s wall, %.1f s CPU, %.1f hosts/min, controller peak %.0f MiB"
            % (hosts, res["wall"], res["cpu"], row["hosts_per_min"], res["memory_mib"]["controller_pss"]))
        rows.append(row)
        # Later (bigger) fleets need the disk more than this one.
        subprocess.run(["rm", "-rf", os.path.join(fleet, "nodes")], check=True)
    return rows


def bench_rollout_skeleton(workdir, sizes):
    """The rollout's controller-side work alone, at fleet sizes too costly to tune on 2 CPUs.

    Every host refuses connections (ssh to a closed port), so each costs one connection attempt
    and no module run, while the controller still iterates every task over every host, gates every
    batch and summarizes every result. No canary and max_fail_percentage 100, so all batches run.
    """
    rows = []
    for hosts in sizes:
        fleet = os.path.join(workdir, "skeleton-%d" % hosts)
        inventory = simfleet.build_fleet(fleet, 0, unreachable=hosts, python=PYTHON,
                                         extra_vars={"gpunode_tuning_report_dir": os.path.join(fleet, "reports")})
        res = run_playbook(os.path.join(REPO, "playbooks", "rollout.yml"), inventory,
                           ["-f", str(FORKS), "-e", "gpunode_tuning_rollout_canary=0",
                            "-e", "gpunode_tuning_rollout_max_fail_percentage=100"], memory=True)
        with open(os.path.join(fleet, "reports", "rollout-summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
        if int(summary["counts"]["unreachable"]) != hosts:
            sys.exit("skeleton rollout over %d hosts: %s\n%s" % (hosts, summary["counts"], res["tail"]))
        rows.append({"hosts": hosts, "wall": res["wall"], "cpu": res["cpu"], "memory_mib": res["memory_mib"],
                     "hosts_per_min": 60.0 * hosts / res["wall"], "cpu_per_host": res["cpu"] / hosts})
        log("P5 skeleton %d unreachable host(s): %.1f s wall, %.1f s CPU, controller peak %.0f MiB"
            % (hosts, res["wall"], res["cpu"], res["memory_mib"]["controller_pss"]))
    return rows


FLOOR_TASKS = 10  # tasks in benchmarks/noop/floor.yml


def bench_ansible_floor(workdir, sizes):
    """Ansible's own cost per host and task at each fleet size: benchmarks/noop/floor.yml (P5A).

    Ten tasks every host skips (nothing runs on a node, nothing of the collection is loaded), in
    batches of 20% as rollout.yml runs. The CPU per host-task of the larger fleet against the
    smaller one's is the growth that any playbook over that inventory pays, the rollout included.
    """
    rows = []
    for hosts in sizes:
        path = os.path.join(workdir, "floor-%d.ini" % hosts)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("[all:vars]\nansible_connection=local\nansible_python_interpreter=%s\n[all]\n" % PYTHON)
            handle.writelines("floor-%04d\n" % n for n in range(1, hosts + 1))
        res = run_playbook(os.path.join(REPO, "benchmarks", "noop", "floor.yml"), path, ["-f", str(FORKS)], memory=True)
        if res["rc"] != 0:
            sys.exit("floor run over %d hosts failed:\n%s" % (hosts, res["tail"]))
        rows.append({"hosts": hosts, "wall": res["wall"], "cpu": res["cpu"], "memory_mib": res["memory_mib"],
                     "cpu_per_host_task": res["cpu"] / (hosts * FLOOR_TASKS)})
        log("P5A %d host(s) x %d skipped tasks: %.1f s wall, %.1f s CPU (%.1f ms per host-task)"
            % (hosts, FLOOR_TASKS, res["wall"], res["cpu"], 1000.0 * rows[-1]["cpu_per_host_task"]))
    return rows


# -- The table


def verdict(value, target):
    return "met" if value <= target else "**missed**"


def row(key, measure, result, target, value):
    """One table row; ``value`` is compared with ``TARGETS[key]`` (a key without a target: a figure, no verdict)."""
    judged = verdict(value, TARGETS[key]) if TARGETS[key] is not None else "figure"
    return "| %s | %s | %s | %s | %s |" % (key.split()[0], measure, result, target, judged)


def spread(walls, cpus, top, bottom):
    """The per-round ratios ``top / bottom`` (wall, and CPU) as "min-max, median" text: how far rounds differ.

    Rounds are interleaved (each round runs every kind once), so round i's two runs met much the same load.
    """
    def text(values):
        ratios = sorted(a / b for a, b in zip(values[top], values[bottom], strict=True))
        return "%.3f-%.3f, median %.3f" % (ratios[0], ratios[-1], statistics.median(ratios))

    return "per round: wall %s; CPU %s" % (text(walls), text(cpus))


def runtime_rows(res, rt):
    """P1 and P2 rows."""
    wall, cpu, runs = rt["wall"], rt["cpu"], rt["runs"]
    ratio = wall["big"] / wall["small"]
    res["ratios"]["P1"] = ratio
    lines = [row("P1", "runtime tune, 384 CPUs/16 GPUs vs 8 CPUs/1 GPU, best wall of %d rounds "
                 "(%.2f s vs %.2f s; median CPU %.2f s vs %.2f s; %s)"
                 % (rt["rounds"], wall["big"], wall["small"], cpu["big"], cpu["small"],
                    spread(rt["walls"], rt["cpus"], "big", "small")),
                 "%.3f" % ratio, "<= %.2f" % TARGETS["P1"], ratio)]
    for kind, key, what in (("noop", "P2", "no-op playbook (ping)"),
                            ("noopd", "P2 distinct", "no-op playbook, a distinct no-op module"),
                            ("noopp", "P2 payload", "no-op playbook whose module carries and loads tuning_apply's "
                                                    "code")):
        ratio = wall["small"] / wall[kind]
        res["ratios"][key] = ratio
        same = "" if runs["small"] == runs[kind] else " (MISMATCH: no-op %s)" % (runs[kind],)
        if kind == "noopp" and rt["families"]["small"] != rt["families"][kind]:
            same += " (MISMATCH: tuning ran %s, the no-op loaded %s)" % (rt["families"]["small"], rt["families"][kind])
        lines.append(row(key, "runtime tune (8 CPUs) vs %s, %d module runs / %d tasks each%s "
                         "(best wall %.2f s vs %.2f s; median CPU %.2f s vs %.2f s; %s)"
                         % (what, runs["small"][0], runs["small"][1], same, wall["small"], wall[kind],
                            cpu["small"], cpu[kind], spread(rt["walls"], rt["cpus"], "small", kind)),
                         "%.3f" % ratio, target_text(key), ratio))
    lines.append(payload_row("P2 payload", "one host", wall, cpu, rt))
    return lines


def target_text(key):
    return "<= %.2f" % TARGETS[key] if TARGETS[key] is not None else "–"


def payload_row(key, where, wall, cpu, runs):
    """What carrying the code costs alone: the payload no-op against ping (the part of P2 no role change removes)."""
    ratio = wall["noopp"] / wall["noop"]
    return row(key, "%s: the payload no-op vs the ping no-op, carrying and loading tuning_apply's code alone "
               "(best wall %.2f s vs %.2f s; median CPU %.2f s vs %.2f s; %s)"
               % (where, wall["noopp"], wall["noop"], cpu["noopp"], cpu["noop"],
                  spread(runs["walls"], runs["cpus"], "noopp", "noop")), "%.3f" % ratio, "–", ratio)


def naive_row(res, rt, naive):
    """P3 row: the naive baseline at 384 CPUs, measured or extrapolated from a line through smaller nodes."""
    direct = [p for p in naive if p["cpus"] == BIG["cpus"]]
    points = [(p["cpus"], p["wall"]) for p in naive if p["cpus"] != BIG["cpus"]]
    intercept, slope, r_squared = linear_fit(points) if len(points) >= 2 else (0.0, 0.0, 0.0)
    predicted = intercept + slope * BIG["cpus"]
    xs = "/".join(str(x) for x, y in points)
    ys = "/".join("%.1f" % y for x, y in points)
    if direct:
        naive_384 = direct[0]["wall"]
        how = ("measured at 384 CPUs: %.0f s, %d module runs; the line through %s CPUs (%s s) predicted %.0f s"
               % (naive_384, direct[0]["module_runs"], xs, ys, predicted))
    else:
        naive_384 = predicted
        how = ("extrapolated to 384 CPUs: %.0f s = %.2f s + %.3f s/CPU x 384, line through %s CPUs (%s s), R^2 %.4f"
               % (predicted, intercept, slope, xs, ys, r_squared))
    ratio = rt["wall"]["big"] / naive_384
    res["ratios"]["P3"] = ratio
    return row("P3", "runtime tune vs naive per-CPU/per-device role, 384 CPUs/16 GPUs (tune %.2f s; naive %s)"
               % (rt["wall"]["big"], how), "%.4f" % ratio, "<= %.2f" % TARGETS["P3"], ratio)


def rollout_rows(res, fleet):
    """P5 rows: one per fleet size, then the linearity of the largest pair."""
    lines = []
    for entry in fleet:
        mem = entry["memory_mib"]
        lines.append(row("P5 memory", "rollout (runtime + verify), %d host(s), forks %d: %.1f s wall, %.0f s CPU "
                         "(%.2f s/host), %.1f hosts/min; peak PSS of all processes %.0f MiB"
                         % (entry["hosts"], FORKS, entry["wall"], entry["cpu"], entry["cpu_per_host"],
                            entry["hosts_per_min"], mem["all_pss"]),
                         "controller peak %.0f MiB" % mem["controller_pss"], "<= %.0f GiB" % TARGETS["P5 memory"],
                         mem["controller_pss"] / 1024.0))
    # Linearity between the two largest fleets (1,000 vs 100 in the full run): the time of the
    # larger one against the smaller one's scaled by the host ratio.
    sizes = sorted(entry["hosts"] for entry in fleet)
    if len(sizes) >= 2 and sizes[-2] >= 10:
        small, large = ({entry["hosts"]: entry for entry in fleet}[n] for n in sizes[-2:])
        factor = large["hosts"] / small["hosts"]
        wall = large["wall"] / (factor * small["wall"])
        cpu = large["cpu"] / (factor * small["cpu"])
        # Judged on the larger of the two: under other load the wall ratio alone can hide a term.
        res["ratios"]["P5"] = max(wall, cpu)
        measure = "linearity: %d-host time / (%g x %d-host time)" % (large["hosts"], factor, small["hosts"])
        lines.append(row("P5", measure,
                         "wall %.3f, CPU %.3f" % (wall, cpu), "<= %.2f" % TARGETS["P5"], max(wall, cpu)))
    return lines


def table(res):  # noqa: C901 (one branch per report column; splitting scatters the table's layout)
    """The Markdown table from the collected measurements (ratios are stored in res["ratios"])."""
    lines = ["| | Measure | Result | Target | |", "|---|---|---|---|---|"]
    if res.get("runtime"):
        lines += runtime_rows(res, res["runtime"])
        if res.get("naive"):
            lines.append(naive_row(res, res["runtime"], res["naive"]))
    if res.get("runtime_fleet"):
        fl = res["runtime_fleet"]
        for kind, key, what in (("noop", "P2 fleet", "no-op (ping)"),
                                ("noopd", "P2 distinct fleet", "no-op with a distinct module"),
                                ("noopp", "P2 payload fleet", "the payload no-op")):
            ratio = fl["wall"]["tune"] / fl["wall"][kind]
            res["ratios"][key] = ratio
            lines.append(row(key, "runtime tune vs %s over %d hosts, forks %d, best of %d (wall %.2f s vs %.2f s; "
                             "median CPU %.2f s vs %.2f s, CPU ratio %.3f; %s)"
                             % (what, fl["hosts"], FORKS, fl["rounds"], fl["wall"]["tune"], fl["wall"][kind],
                                fl["cpu"]["tune"], fl["cpu"][kind], fl["cpu"]["tune"] / fl["cpu"][kind],
                                spread(fl["walls"], fl["cpus"], "tune", kind) if "walls" in fl else "no spread"),
                             "%.3f" % ratio, target_text(key), ratio))
        lines.append(payload_row("P2 payload fleet", "%d hosts" % fl["hosts"], fl["wall"], fl["cpu"], fl))
    if res.get("facts"):
        seconds = res["facts"]["seconds"]
        res["ratios"]["P4"] = seconds
        lines.append(row("P4", "tuning_info, 384 CPUs/16 GPUs, 100,000-record kernel log "
                         "(module in-process, best of 3)",
                         "%.3f s" % seconds, "<= %.1f s" % TARGETS["P4"], seconds))
    if res.get("rollout"):
        lines += rollout_rows(res, res["rollout"])
    skeleton = res.get("skeleton")
    if skeleton:
        for entry in skeleton:
            measure = ("rollout controller work only (every host unreachable), %d hosts: %.1f s wall, %.1f s CPU "
                       "(%.3f s/host)" % (entry["hosts"], entry["wall"], entry["cpu"], entry["cpu_per_host"]))
            lines.append(row("P5 memory", measure,
                             "controller peak %.0f MiB" % entry["memory_mib"]["controller_pss"],
                             "<= %.0f GiB" % TARGETS["P5 memory"], entry["memory_mib"]["controller_pss"] / 1024.0))
        if len(skeleton) >= 2:
            small, large = skeleton[-2], skeleton[-1]
            factor = large["hosts"] / small["hosts"]
            wall = large["wall"] / (factor * small["wall"])
            cpu = large["cpu"] / (factor * small["cpu"])
            # A diagnostic, not one of the targets (those are for the tuned rollout, P5):
            # compare with P5A, Ansible's own growth over the same host counts.
            res["skeleton_growth"] = {"wall": wall, "cpu": cpu}
            lines.append("| P5S | growth of the controller work: %d / (%g x %d) hosts | wall %.3f, CPU %.3f "
                         "| (diagnostic; compare P5A) | |" % (large["hosts"], factor, small["hosts"], wall, cpu))
    floor = res.get("floor")
    if floor:
        for entry in floor:
            lines.append("| P5A | Ansible alone: %d hosts x %d skipped tasks (benchmarks/noop/floor.yml), forks %d: "
                         "%.1f s wall, %.1f s CPU | %.1f ms CPU per host-task | (reference) | |"
                         % (entry["hosts"], FLOOR_TASKS, FORKS, entry["wall"], entry["cpu"],
                            1000.0 * entry["cpu_per_host_task"]))
        if len(floor) >= 2:
            small, large = floor[-2], floor[-1]
            growth = large["cpu_per_host_task"] / small["cpu_per_host_task"]
            res["floor_growth"] = growth
            lines.append("| P5A | growth of Ansible's own CPU per host-task, %d vs %d hosts | x%.3f | (reference) | |"
                         % (large["hosts"], small["hosts"], growth))
    return "\n".join(lines)


def main(argv=None):  # noqa: PLR0915 (options, then the measurement sequence, read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 round, naive at 4/8 CPUs, fleets of 1 and 10")
    parser.add_argument("--full", action="store_true", help="also the 1,000-host fleet and the naive role at 384 CPUs")
    parser.add_argument("--only", default="P1,P2,P3,P4,P5",
                        help="comma-separated subset of P1..P5, and P2F (P2 over a fleet only), "
                             "P5S (rollout controller work only), P5A (Ansible alone, floor.yml)")
    parser.add_argument("--rounds", type=int, help="rounds of P1/P2 (default 5, quick 1)")
    parser.add_argument("--fleet-rounds", type=int, help="rounds of P2 over a fleet of 16 hosts (default 2, quick 1)")
    parser.add_argument("--fleet", help="comma-separated host counts for P5 (default 1,100; --full 1,100,1000)")
    parser.add_argument("--skeleton", help="host counts for the controller-only rollout (P5S; default 100,1000)")
    parser.add_argument("--floor", help="host counts for Ansible's own scaling (P5A; default 100,1000)")
    parser.add_argument("--naive-cpus", help="comma-separated CPU counts for the naive baseline (default 8,16,32)")
    parser.add_argument("--naive-full", action="store_true", help="also time the naive baseline at 384 CPUs")
    parser.add_argument("--output", default=os.path.join(REPO, "reports", "bench_fleet.md"))
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    only = {p.strip().upper() for p in args.only.split(",")}
    rounds = args.rounds or (1 if args.quick else 5)
    default_fleet = "1,10" if args.quick else "1,100,1000" if args.full else "1,100"
    fleet = [int(n) for n in (args.fleet or default_fleet).split(",")]
    naive_cpus = [int(n) for n in (args.naive_cpus or ("4,8" if args.quick else "8,16,32")).split(",")]
    if args.full or args.naive_full:
        naive_cpus.append(BIG["cpus"])
    naive_gpus = 2 if args.quick else BIG["gpus"]

    res = {"ratios": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
           "load_before": os.getloadavg()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_fleet.") as workdir:
        if only & {"P1", "P2", "P3"}:  # P2F alone: the fleet variant of P2 only
            res["runtime"] = bench_runtime(workdir, rounds)
        if "P2" in only or "P2F" in only:
            res["runtime_fleet"] = bench_runtime_fleet(workdir, 1 if args.quick else FORKS,
                                                       args.fleet_rounds or (1 if args.quick else 2))
        if "P3" in only:
            res["naive"] = bench_naive(workdir, naive_cpus, naive_gpus)
        if "P4" in only:
            res["facts"] = bench_facts(workdir, 1 if args.quick else 3)
        if "P5" in only:
            res["rollout"] = bench_rollout(workdir, fleet)
        if "P5A" in only:
            res["floor"] = bench_ansible_floor(workdir, [int(n) for n in (args.floor or "100,1000").split(",")])
        if "P5S" in only or args.skeleton:
            sizes = [int(n) for n in (args.skeleton or "100,1000").split(",")]
            res["skeleton"] = bench_rollout_skeleton(workdir, sizes)
    res["seconds"] = time.monotonic() - started
    res["load_after"] = os.getloadavg()
    text = table(res)
    header = ("bench_fleet.py %s on %d CPU(s), %.0f s; load average before/after %.1f/%.1f"
              % (" ".join(argv if argv is not None else sys.argv[1:]) or "(defaults)", res["cpus"], res["seconds"],
                 res["load_before"][0], res["load_after"][0]))
    print(header)
    print()
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        handle.write(header + "\n\n" + text + "\n")
    with open(os.path.splitext(args.output)[0] + ".json", "w", encoding="utf-8") as handle:
        json.dump(res, handle, indent=2, default=str)
    missed = [k for k, v in res["ratios"].items() if TARGETS[k] is not None and v > TARGETS[k]]
    if missed:
        log("missed: %s" % ", ".join(sorted(missed)))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
