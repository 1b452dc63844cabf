"""docs/variables.md is what tools/varref.py renders (tools/generate.py writes it) from the argument specs (the one
description of the variables)."""

from __future__ import annotations

import varref


def test_the_checked_in_reference_is_current():
    with open(varref.OUT, encoding="utf-8") as handle:
        assert handle.read() == varref.render(), "run: .venv/bin/python tools/generate.py"


def test_every_variable_and_its_precheck_coverage_is_on_the_page():
    page = varref.render()
    specs = varref.load(varref.SPECS)["argument_specs"]
    for spec in specs.values():
        for name in spec["options"]:
            # The steps' private inputs (role_variables.PRIVATE_INTERFACE) are not for operators.
            assert ("### `%s`" % name in page) is not name.startswith("__"), name
    # The variables a family validator covers say what the precheck checks and what is left for the node.
    section = page.split("### `gpunode_tuning_cpuidle_cpus`")[1].split("### ")[0]
    assert "Checked before any change" in section and "Left for the node" in section
    latency = page.split("### `gpunode_tuning_cpuidle_max_latency_us`")[1]
    assert "Default: from the preset (inference-throughput: `100`" in latency
