#!/usr/bin/env python
"""What a module run of the collection compiles on the node, and what it ships there.

Runs ``playbooks/tune.yml --tags runtime``, ``playbooks/verify.yml`` and ``playbooks/rollout.yml`` against
one fresh simulated node (tools/simfleet.py, preset audited-epyc-8gpu, 8 CPUs / 1 GPU) and, for every module
run the playbook makes, reports

* **compiled**: the source the run compiles on the node, that is the files of the collection it actually
  imports (read from the run's ``sys.modules`` as it exits) plus the module itself; the module_utils of
  ansible-core the run imports are counted apart (every module pays them, ``ping`` too). Of the collection's
  compiled bytes, how many are docstrings and comments (``tokenize``).
* **shipped**: what AnsiballZ packed for the run (Ansible's own module packer: the payload zip the run imports
  from, read back on the node): files and bytes of the collection and of ansible-core, and the zip's size.

How: the module runs go through the local connection with ``PYTHONPATH`` set to a directory holding a
``sitecustomize.py`` that, only in an ``AnsiballZ_*.py`` process, writes those figures to a JSON file as the
run ends (just before AnsiballZ removes its payload zip). Nothing of the collection is changed for the
measurement; the hook itself is not in the payload and is not counted. The module is the payload's
``plugins/modules/<name>.py`` (run as ``__main__`` by AnsiballZ, so not in ``sys.modules`` under its own name).

    .venv/bin/python benchmarks/bench_payload.py               # the three playbooks, Markdown table
    .venv/bin/python benchmarks/bench_payload.py --only tune   # one of tune, verify, rollout
    .venv/bin/python benchmarks/bench_payload.py --json out.json --files   # raw figures, per-file lists

Exit status 1 with ``--max-compiled-kb N`` when a module run of ``tune.yml --tags runtime`` compiles more than
N KB (1 KB = 1,000 bytes) of the collection's source (issue 41's target: 300).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "tools")]

import simfleet  # noqa: E402  (tools/ is put on sys.path above)

VENV_BIN = os.path.join(REPO, ".venv", "bin")
PYTHON = os.path.join(VENV_BIN, "python")
PRESET = "audited-epyc-8gpu"
COLLECTION = "ansible_collections.gpunode.tuning."
PLAYBOOKS = {
    "tune": ("tune.yml", ["--tags", "runtime"]),
    "verify": ("verify.yml", []),
    "rollout": ("rollout.yml", []),
}

# The hook, run inside each module run on the node (a plain-Python file: it imports nothing of the collection).
SITECUSTOMIZE = r'''
import io, json, os, sys, tokenize, zipfile

def _strings_and_comments(source):
    """Bytes of docstrings (a string statement) and of comments in ``source``."""
    doc = comments = 0
    prev = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments += len(tok.string.encode())
            elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                                          tokenize.NL):
                doc += len(tok.string.encode())
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                prev = tok.type
    except (tokenize.TokenError, SyntaxError):
        pass
    return doc, comments

_called = set()

def _profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        if "ansible_collections/gpunode/tuning/" in code.co_filename:
            _called.add((code.co_filename.split("ansible_collections/gpunode/tuning/", 1)[1], code.co_name,
                         code.co_firstlineno))

def _uncalled(source, path):
    """Bytes of the functions (module level, and methods) of ``source`` that the run never called."""
    import ast
    total = 0
    names = []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0, []
    lines = source.splitlines(True)
    def visit(body, prefix):
        nonlocal total
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if not any((path, node.name, line) in _called for line in (first, node.lineno)):
                    size = len("".join(lines[first - 1:node.end_lineno]).encode("utf-8"))
                    total += size
                    names.append((prefix + node.name, size))
    visit(tree.body, "")
    return total, names

def _dump():
    out_dir = os.environ.get("GPUNODE_PAYLOAD_DUMP")
    if not out_dir:
        return
    module = os.path.basename(sys.argv[0])[len("AnsiballZ_"):-len(".py")]
    compiled = {}
    archive = None
    for name, mod in list(sys.modules.items()):
        loader = getattr(mod, "__loader__", None)
        if not (name.startswith("ansible_collections.") or name.startswith("ansible.")) or loader is None:
            continue
        try:
            source = loader.get_source(name)
        except Exception:
            source = None
        if source is None:
            continue
        fname = getattr(mod, "__file__", "") or ""
        if ".zip" in fname:
            archive = fname[:fname.index(".zip") + 4]
        compiled[name] = source
    shipped = {}
    zip_size = 0
    main_source = None
    if archive:
        zip_size = os.path.getsize(archive)
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".py"):
                    shipped[info.filename] = info.file_size
                    if info.filename.endswith("/plugins/modules/%s.py" % module):
                        main_source = zf.read(info.filename).decode("utf-8")
    if main_source is not None:
        compiled["%splugins.modules.%s" % ("ansible_collections.gpunode.tuning.", module)] = main_source
    files = {}
    for name, source in compiled.items():
        doc, comments = _strings_and_comments(source)
        files[name] = {"bytes": len(source.encode("utf-8")), "docstrings": doc, "comments": comments}
        if _called and name.startswith("ansible_collections.gpunode.tuning."):
            path = name[len("ansible_collections.gpunode.tuning."):].replace(".", "/") + ".py"
            files[name]["uncalled"], files[name]["uncalled_list"] = _uncalled(source, path)
    record = {"module": module, "compiled": files, "shipped": shipped, "zip_bytes": zip_size}
    path = os.path.join(out_dir, "%s-%d.json" % (module, os.getpid()))
    with open(path, "w") as fh:
        json.dump(record, fh)

def _install():
    # AnsiballZ removes its temporary directory, the payload zip with it, before atexit hooks run: dump first.
    import shutil
    rmtree = shutil.rmtree

    def _rmtree(path, *args, **kwargs):
        if "_payload_" in str(path) and not _done:
            _done.append(True)
            _dump()
        return rmtree(path, *args, **kwargs)
    shutil.rmtree = _rmtree

_done = []
if os.path.basename(sys.argv[0] if sys.argv else "").startswith("AnsiballZ_"):
    _install()
    if os.environ.get("GPUNODE_PAYLOAD_CALLS"):
        sys.setprofile(_profile)
'''


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_playbook(kind, inventory, hookdir, dumpdir, calls=False):
    """Run one playbook against the inventory with the hook on; return its exit status and output tail."""
    playbook, args = PLAYBOOKS[kind]
    env = dict(os.environ)
    env.update(PATH=VENV_BIN + os.pathsep + env.get("PATH", ""), ANSIBLE_COLLECTIONS_PATH=os.path.join(
        REPO, ".collections"), ANSIBLE_NOCOLOR="1", PYTHONPATH=hookdir, GPUNODE_PAYLOAD_DUMP=dumpdir)
    env.pop("ANSIBLE_CONFIG", None)
    if calls:
        env["GPUNODE_PAYLOAD_CALLS"] = "1"
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "playbooks", playbook)]
    proc = subprocess.run(cmd + args, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def summarize(record):
    """The figures of one module run's record."""
    # Empty package __init__ files (Ansible's synthetic packages among them) are not counted as files.
    compiled = {n: f for n, f in record["compiled"].items() if f["bytes"]}
    ours = {n: f for n, f in compiled.items() if n.startswith(COLLECTION)}
    core = {n: f for n, f in compiled.items() if not n.startswith(COLLECTION)}
    shipped = {n: s for n, s in record["shipped"].items() if s}
    shipped_ours = {n: s for n, s in shipped.items() if n.startswith(COLLECTION.replace(".", "/"))}
    return {
        "module": record["module"],
        "compiled_files": len(ours),
        "compiled_bytes": sum(f["bytes"] for f in ours.values()),
        "compiled_docstrings": sum(f["docstrings"] for f in ours.values()),
        "compiled_comments": sum(f["comments"] for f in ours.values()),
        "core_compiled_files": len(core),
        "core_compiled_bytes": sum(f["bytes"] for f in core.values()),
        "shipped_files": len(shipped_ours),
        "shipped_bytes": sum(shipped_ours.values()),
        "core_shipped_files": len(shipped) - len(shipped_ours),
        "core_shipped_bytes": sum(shipped.values()) - sum(shipped_ours.values()),
        "zip_bytes": record["zip_bytes"],
        "compiled_list": sorted((n[len(COLLECTION):], f["bytes"], f.get("uncalled"), f.get("uncalled_list"))
                                for n, f in ours.items()),
        "shipped_list": sorted((n, s) for n, s in shipped_ours.items()),
    }


def measure(kinds, workdir, calls=False):
    """{kind: [figures of each module run]} for each playbook, each against its own fresh node."""
    hookdir = os.path.join(workdir, "hook")
    os.makedirs(hookdir)
    with open(os.path.join(hookdir, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(SITECUSTOMIZE)
    out = {}
    for kind in kinds:
        fleet = os.path.join(workdir, "fleet-" + kind)
        inventory = simfleet.build_fleet(fleet, 1, preset=PRESET, shape={"cpus": 8, "gpus": 1}, python=PYTHON,
                                         extra_vars={"gpunode_tuning_report_dir": os.path.join(fleet, "reports")})
        dumpdir = os.path.join(workdir, "dump-" + kind)
        os.makedirs(dumpdir)
        log("%s: running %s ..." % (kind, PLAYBOOKS[kind][0]))
        rc, tail = run_playbook(kind, inventory, hookdir, dumpdir, calls)
        # verify.yml fails (rc 2) on a node that is not tuned yet, after its module run: that run is measured.
        if rc not in ((0, 2) if kind == "verify" else (0,)):
            sys.exit("%s failed (rc %d):\n%s" % (PLAYBOOKS[kind][0], rc, tail))
        records = []
        for path in sorted(glob.glob(os.path.join(dumpdir, "*.json")), key=os.path.getmtime):
            with open(path, encoding="utf-8") as handle:
                records.append(summarize(json.load(handle)))
        if not records:
            sys.exit("%s: no module run recorded (is the hook on the module's PYTHONPATH?)" % kind)
        out[kind] = records
    return out


def kb(value):
    return "%.0f KB" % (value / 1000.0)


def table(results):
    """A Markdown table, one row per module run."""
    lines = ["| Playbook | Module run | Compiled: collection files, bytes (docstrings, comments) | "
             "ansible-core compiled | Shipped: collection files, bytes | ansible-core shipped | Zip |",
             "|---|---|---|---|---|---|---:|"]
    others = []
    for kind, records in results.items():
        label = " ".join([PLAYBOOKS[kind][0]] + PLAYBOOKS[kind][1])
        for rec in records:
            if not rec["shipped_files"]:  # ansible-core's own modules (the reports' file/stat/copy on localhost)
                others.append("%s: %s" % (label, rec["module"]))
                continue
            lines.append("| %s | %s | %d, **%s** (%s, %s) | %d, %s | %d, %s | %d, %s | %s |" % (
                label, rec["module"], rec["compiled_files"], kb(rec["compiled_bytes"]), kb(rec["compiled_docstrings"]),
                kb(rec["compiled_comments"]), rec["core_compiled_files"], kb(rec["core_compiled_bytes"]),
                rec["shipped_files"], kb(rec["shipped_bytes"]), rec["core_shipped_files"],
                kb(rec["core_shipped_bytes"]), kb(rec["zip_bytes"])))
    if others:
        lines.append("\nModule runs that carry none of the collection's code (not in the table): " + ", ".join(others))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--only", default="tune,verify,rollout", help="comma-separated: tune, verify, rollout")
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--files", action="store_true", help="list each run's compiled files with their bytes")
    parser.add_argument("--calls", action="store_true",
                        help="with --files: also the bytes of each file's functions the run never called (a profiler "
                        "hook: slower)")
    parser.add_argument("--max-compiled-kb", type=float, help="exit 1 when a runtime tuning run compiles more")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in PLAYBOOKS]
    if unknown:
        parser.error("--only takes %s; got %s" % (", ".join(PLAYBOOKS), ", ".join(unknown)))
    with tempfile.TemporaryDirectory(prefix="bench_payload.") as workdir:
        results = measure(kinds, workdir, args.calls)
    print(table(results))
    if args.files:
        for kind, records in results.items():
            for rec in records:
                print("\n%s, %s: compiled" % (PLAYBOOKS[kind][0], rec["module"]))
                for name, size, uncalled, names in sorted(rec["compiled_list"], key=lambda x: -x[1]):
                    if uncalled is None:
                        print("  %7d  %s" % (size, name))
                        continue
                    print("  %7d  %s  (never called: %d bytes in %d functions)" % (size, name, uncalled, len(names)))
                    if args.calls and names:
                        top = sorted(names, key=lambda x: -x[1])[:12]
                        print("           " + ", ".join("%s %d" % tuple(n) for n in top))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    if args.max_compiled_kb is not None:
        worst = max((r["compiled_bytes"] for r in results.get("tune", [])), default=0)
        if worst > args.max_compiled_kb * 1000:
            print("runtime tuning compiles %s, above %.0f KB" % (kb(worst), args.max_compiled_kb), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
