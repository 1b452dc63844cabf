# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``dcgmi diag``'s result table, read row by row (DCGM 2.x, 3.x and 4.x layouts).

dcgmi prints one two-column table (a 27-wide name column, a 46-wide value column that it wraps into
45-character chunks), its sections introduced by header lines (``|-----  Deployment  ---...|``,
``+-----  Integration  ---...+``) and closed by a plain border. What each version puts in it:

- DCGM 2.x: no Metadata section; Deployment tests (``Blacklist``) with ``Pass`` / ``Fail`` / ``Skip``;
  GPU tests with ``Pass - All`` (``Fail - All``, ``Warn - All``, ``Skip - All``) or, when the GPUs
  differ, ``Pass - GPUs: 1, 2`` on the test's row and ``Fail - GPU: 0`` on a row with an empty name.
- DCGM 3.x: the same, after a Metadata section (``DCGM Version``, ``Driver Version Detected``, ...);
  ``Denylist`` for ``Blacklist``.
- DCGM 4.x: one result per test (``Pass``, ``Fail``, ``Warn``, ``Skip``) and a ``GPU<n>: <result>``
  row per GPU (``GPU <n>: <result>`` is read too).
- every version: ``Info``, ``Warning`` and ``Error`` rows after a test, their text wrapped over rows
  with an empty name; an ``Error`` row may come before any test of its section (it then stands for
  the section: a test named after the section, result ``Error``).

Every row is read by its result, whatever dcgmi's exit status (a caller judges that separately):
``Fail`` and ``Error`` (on the test's row, on a GPU's row, or an ``Error`` note) are failures,
``Warn`` is reported, ``Skip`` is neither. A row this reader does not understand (an unknown result,
a wrapped row with nothing to continue) is a finding naming its line, never a pass; so is a table
that ends without its closing border (the output was cut: what came after is unknown), although
every row it does have is read, the last one included, even a row cut before its closing ``|``.
Lines outside the table that start with ``Error`` or ``Aborting`` (dcgmi's own failures, printed
instead of or after the table) are failures of the test ``dcgmi``.

``parse_diag(text)`` returns::

    {"version": "3.3.9" or None,           # Metadata's DCGM Version (2.x prints none)
     "metadata": {"DCGM Version": "3.3.9", "Driver Version Detected": "...", ...},
     "tests": [{"name", "section", "result", "gpus", "notes",     # as parse_dcgm_diag (below)
                "status", "cpus", "messages", "line"}],
     "failures": [{"test", "section", "status", "result", "gpus", "detail"}],   # Fail and Error
     "warnings": [same keys],              # Warn: reported, not failures
     "findings": ["line 12 not understood: '| Foo | Bar |'", ...],
     "complete": bool}                     # the last table ended with its closing border

Mapping to ``families/gpu_health.parse_dcgm_diag`` (``{version, tests: [{name, section, result,
gpus, notes}]}``), of which this is a superset: ``version``, ``name``, ``section`` and ``result`` (the
value on the test's own row, stripped) mean the same; ``gpus`` (GPU index -> ``Pass``/``Fail``/...)
holds the 4.x per-GPU rows as before and now also the 2.x/3.x ``Pass - GPUs: 1, 2`` / ``Fail - GPU:
0`` rows; ``notes`` is the text of each note row joined as before (Info and Warning, now also
Error). New per test: ``status`` (``pass``, ``fail``, ``error``, ``warn``, ``skip`` or ``unknown``),
``cpus`` (4.x ``CPU<n>:`` rows), ``messages`` (``[{kind, text}]``, the notes with their kind) and
``line`` (1-based line number of the test's row). Tests before the first section header (a fragment)
are read with ``section`` None; the old parser skipped them, and skipped a test named ``Diagnostic``
(taking it for the table's header row).

Plain Python (3.8+), no Ansible import, no I/O.
"""

from __future__ import annotations

import re

WRAP = 45  # dcgmi wraps a value into chunks of 45 characters, one per row of the 46-wide column
RESULTS = ("Pass", "Fail", "Warn", "Skip", "Error")
NOTE_KINDS = ("Info", "Warning", "Error")
METADATA = "Metadata"
FAILING = ("fail", "error")
# Lines outside the table that report dcgmi's own failure (Diag.cpp's failure messages).
FAILURE_LINES = ("Error", "Aborting")
# Strongest first: the status of a test is its strongest word.
_RANK = ("unknown", "fail", "error", "warn", "pass", "skip")

_BORDER = re.compile(r"^\+[-=]+\+[-=]+\+$")
_SECTION = re.compile(r"^[|+]-+\s+(\w[\w ]*?)\s+-+\+-+[+|]$")
_RESULT = re.compile(r"^(Pass|Fail|Warn|Skip|Error)(?:\s+-\s+(?:All|GPUs?:\s*([\d,\s]+?)))?$")
_ENTITY = re.compile(r"^(GPU|CPU)\s?(\d+):\s*(Pass|Fail|Warn|Skip|Error)$")
_CODE = re.compile(r"^Code:\s*\(\d+\)$")


# -- Lines and cells


def classify(line: str) -> tuple:
    """``(kind, payload)`` of one stripped line: ``("blank", None)``, ``("border", "=" or "-")``,
    ``("section", name)``, ``("row", (name, chunk, cut))`` or ``("text", line)``.

    ``chunk`` is the value cell as dcgmi wrote it (up to 45 characters, spaces kept, so that wrapped
    text joins back exactly); ``cut`` is True for a row that ends before its closing ``|``.
    """
    if not line:
        return "blank", None
    if _BORDER.match(line):
        return "border", "=" if "=" in line else "-"
    section = _SECTION.match(line)
    if section:
        return "section", section.group(1)
    if not line.startswith("|"):
        return "text", line
    name, sep, rest = line[1:].partition("|")
    cut = not (sep and rest.endswith("|"))
    value = rest if cut else rest[:-1]
    return "row", (name.strip(), value[1:1 + WRAP], cut)


def parse_result(value: str) -> tuple | None:
    """``(word, gpus)`` of a result cell: ``Pass`` -> ``("Pass", [])``, ``Fail - GPU: 0`` -> ``("Fail",
    [0])``, ``Pass - GPUs: 1, 2`` -> ``("Pass", [1, 2])``, ``Skip - All`` -> ``("Skip", [])``; None otherwise."""
    m = _RESULT.match(value.strip())
    if not m:
        return None
    gpus = [int(g) for g in re.findall(r"\d+", m.group(2) or "")]
    return m.group(1), gpus


def parse_entity(value: str) -> tuple | None:
    """``(kind, index, word)`` of a 4.x per-entity row (``GPU0: Pass``, ``GPU 3: Fail``, ``CPU1: Skip``)."""
    m = _ENTITY.match(value.strip())
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def _quote(line: str) -> str:
    return repr(line if len(line) <= 120 else line[:117] + "...")


# -- The reader


class _Reader:
    """The state of one pass over the output: the open section, test and note."""

    def __init__(self) -> None:
        self.out: dict = {"version": None, "metadata": {}, "tests": [], "failures": [], "warnings": [],
                          "findings": [], "complete": False}
        self.section: str | None = None
        self.test: dict | None = None
        self.note: dict | None = None
        self.meta_key: str | None = None
        self.open = False  # rows (or a header) read since the last closing border
        self.seen = False  # any table row at all
        self.last: tuple | None = None  # (line number, line) of the last table line read
        self.outside: list = []

    def finding(self, number: int, line: str, why: str = "not understood") -> None:
        self.out["findings"].append("line %d %s: %s" % (number, why, _quote(line)))

    def feed(self, number: int, line: str) -> None:
        kind, payload = classify(line)
        if kind == "border":
            if payload == "-" and self.open:
                self.open, self.test, self.note = False, None, None
        elif kind == "section":
            self.section, self.test, self.note, self.meta_key = payload, None, None, None
            self.open = self.seen = True
            self.last = (number, line)
        elif kind == "row":
            self.open = self.seen = True
            self.last = (number, line)
            self.row(number, line, *payload)
        elif kind == "text" and line.startswith(FAILURE_LINES):
            self.outside.append((number, line))

    def row(self, number: int, line: str, name: str, chunk: str, cut: bool) -> None:
        if name == "Diagnostic" and chunk.strip() == "Result" and self.test is None:
            self.section, self.note = None, None  # the table's header row (a new table)
        elif self.section == METADATA:
            self.metadata_row(number, line, name, chunk)
        elif name in NOTE_KINDS:
            self.note_row(number, line, name, chunk)
        elif name:
            self.test_row(number, name, chunk)
        else:
            self.continuation(number, line, chunk)

    def metadata_row(self, number: int, line: str, name: str, chunk: str) -> None:
        meta = self.out["metadata"]
        if name:
            self.meta_key, meta[name] = name, chunk
        elif self.meta_key:
            meta[self.meta_key] += chunk  # a wrapped value: the chunks join back as dcgmi cut them
        else:
            self.finding(number, line)

    def note_row(self, number: int, line: str, kind: str, chunk: str) -> None:
        if self.test is None:
            if kind != "Error":
                self.finding(number, line, "is a %s row before any test" % kind)
                return
            # An Error row of the section itself (before any test of it): it stands for the section.
            self.test_row(number, self.section or "dcgmi", "Error")
        self.note = {"kind": kind, "chunks": [chunk]}
        self.test["messages"].append(self.note)

    def test_row(self, number: int, name: str, chunk: str) -> None:
        self.note = None
        self.test = {"name": name, "section": self.section, "result": chunk.strip(), "gpus": {}, "cpus": {},
                     "notes": [], "messages": [], "status": "unknown", "code": None, "line": number,
                     "words": []}
        parsed = parse_result(chunk)
        if parsed is not None:
            self.test["words"].append(parsed[0])
            self.test["gpus"].update(dict.fromkeys(parsed[1], parsed[0]))
        self.out["tests"].append(self.test)

    def continuation(self, number: int, line: str, chunk: str) -> None:
        """A row with an empty name: a GPU's result, a Diagnostic's code, or the next chunk of a note."""
        entity, parsed = parse_entity(chunk), parse_result(chunk)
        if self.test is not None and entity is not None:
            self.note = None
            self.test["gpus" if entity[0] == "GPU" else "cpus"][entity[1]] = entity[2]
        elif self.test is not None and parsed is not None and parsed[1]:
            self.note = None
            self.test["gpus"].update(dict.fromkeys(parsed[1], parsed[0]))
        elif self.test is not None and self.note is None and _CODE.match(chunk.strip()):
            self.test["code"] = chunk.strip()
        elif self.note is not None:
            self.note["chunks"].append(chunk)
        else:
            self.finding(number, line)

    def finish(self) -> dict:
        out = self.out
        out["metadata"] = {k: " ".join(v.split()) for k, v in out["metadata"].items()}
        out["version"] = out["metadata"].get("DCGM Version") or None
        for test in out["tests"]:
            _settle(test, out["findings"])
        out["failures"] = [_entry(t) for t in out["tests"] if t["status"] in FAILING]
        out["failures"] += [{"test": "dcgmi", "section": None, "status": "error", "result": text, "gpus": [],
                             "detail": ""} for _line, text in self.outside]
        out["warnings"] = [_entry(t) for t in out["tests"] if t["status"] == "warn"]
        out["complete"] = self.seen and not self.open
        if self.seen and self.open and self.last is not None:
            out["findings"].append("the table ends without its closing border after line %d %s: what dcgmi "
                                   "printed after it is unknown (output cut?)" % (self.last[0], _quote(self.last[1])))
        if not out["tests"] and not self.outside:
            out["findings"].append("no test result in dcgmi's output")
        return out


def _settle(test: dict, findings: list) -> None:
    """A read test's notes joined, its status from its strongest word; an unknown result is a finding."""
    for message in test["messages"]:
        message["text"] = " ".join("".join(message.pop("chunks")).split())
    test["notes"] = [m["text"] for m in test["messages"]]
    words = test.pop("words")
    if not words:
        test["status"] = "unknown"
        findings.append("line %d not understood: test %r has the result %r (not one of %s)"
                        % (test["line"], test["name"], test["result"], ", ".join(RESULTS)))
        return
    words += list(test["gpus"].values()) + list(test["cpus"].values())
    words += ["Error" for m in test["messages"] if m["kind"] == "Error"]
    test["status"] = min((w.lower() for w in words), key=_RANK.index)


def _entry(test: dict) -> dict:
    """A failure or warning: the test, its status, what it printed, the GPUs it names, its warnings."""
    word = {"fail": "Fail", "error": "Error", "warn": "Warn"}[test["status"]]
    named = ("Fail", "Error") if word != "Warn" else ("Warn",)
    gpus = sorted(g for g, result in test["gpus"].items() if result in named)
    result = test["result"] if test["result"].split(" ")[0] == word else word
    detail = "; ".join(m["text"] for m in test["messages"] if m["kind"] in ("Warning", "Error"))
    return {"test": test["name"], "section": test["section"], "status": test["status"], "result": result,
            "gpus": gpus, "detail": detail}


def parse_diag(text: str | None) -> dict:
    """``dcgmi diag``'s output read row by row (the module docstring gives the shape)."""
    reader = _Reader()
    for number, raw in enumerate((text or "").splitlines(), 1):
        reader.feed(number, raw.strip())
    return reader.finish()


# -- Words for a verdict


def describe(entry: dict) -> str:
    """``"<test>: <result> (GPU0, GPU3): <warnings>"`` of a failure or warning entry."""
    where = " (%s)" % ", ".join("GPU%d" % g for g in entry["gpus"]) if entry["gpus"] else ""
    return "%s: %s%s%s" % (entry["test"], entry["result"], where, ": " + entry["detail"] if entry["detail"] else "")


def problems(diag: dict) -> list:
    """What keeps a diagnostic from passing, in words: each failure, then each finding."""
    return [describe(f) for f in diag["failures"]] + list(diag["findings"])


def passed(diag: dict) -> bool:
    """True when the output read is a table with at least one test, no failure and no finding."""
    return bool(diag["tests"]) and not problems(diag)
