"""Layer 2: every notebook with a parameters cell runs at its default (smoke) preset in a real
Jupyter kernel; every sanity claim holds; recorded metrics match tests/golden/<slug>.json."""
import json
import math
import os
from pathlib import Path

import pytest

from genlab.runs import execute_point, list_notebooks, make_point, parameters_cells, read_notebook

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
NOTEBOOKS = {s: p for s, p in list_notebooks(ROOT / "nbs").items() if parameters_cells(read_notebook(p))}


def test_every_method_notebook_is_tested():
    assert "flow_matching" in NOTEBOOKS and "core" in NOTEBOOKS


@pytest.mark.parametrize("slug", list(NOTEBOOKS))
def test_smoke_run(slug):
    point = make_point(NOTEBOOKS[slug], {}, None, threads=1, timeout=300)
    result = execute_point(point)
    rec = result["record"]
    assert rec["status"] == "ok", rec["error"]
    if int(NOTEBOOKS[slug].name[:2]) >= 10:  # method notebooks: their figures reach the report
        nb = json.loads(result["notebook"])
        figures = sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
        assert figures >= 1, f"{slug}: the executed smoke notebook has no figure (MPLBACKEND={os.environ.get('MPLBACKEND')})"
    false_sanity = [c for c in rec["claims"] if c["sanity"] and not c["ok"]]
    assert not false_sanity, false_sanity
    golden = GOLDEN / f"{slug}.json"
    if golden.is_file():
        for name, spec in json.loads(golden.read_text()).items():
            assert name in rec["metrics"], f"{slug}: metric {name!r} not recorded"
            got = rec["metrics"][name]
            assert isinstance(got, (int, float)) and math.isfinite(got), f"{slug}: {name} = {got!r}"
            assert abs(got - spec["value"]) <= spec["atol"], \
                f"{slug}: {name} = {got:.6g}, golden {spec['value']:.6g} +- {spec['atol']}"
    elif slug in {s for s, p in NOTEBOOKS.items() if int(p.name[:2]) >= 10}:
        pytest.fail(f"method notebook {slug} has no golden file {golden}")
