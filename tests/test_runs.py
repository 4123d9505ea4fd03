"""The runner and sweep machinery on a tiny fixture notebook: runs, records, sweeps (local pool,
resume after a kill, failure isolation, Dask), the report and the command line's bad-input errors."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genlab.runs import (RunError, execute_point, find_notebook, load_records, load_sweep, make_point, notebook_parameters,
                         read_records, report, run_points, sweep_points, validate_parameters)

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures" / "fixture.ipynb"
GENLAB = [sys.executable, "-c", "import sys; from genlab.cli import main; sys.exit(main())"]


def cli(*args, cwd=None, timeout=300):
    return subprocess.run([*GENLAB, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def write_sweep(tmp_path, grid, parameters=None, name="fx"):
    lines = [f"notebook: {FIX}", f"name: {name}", "grid:"] + [f"  {k}: {json.dumps(v)}" for k, v in grid.items()]
    if parameters:
        lines += ["parameters:"] + [f"  {k}: {json.dumps(v)}" for k, v in parameters.items()]
    p = tmp_path / f"{name}.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_parameters_cell_is_parsed():
    assert notebook_parameters(FIX) == {"x": 1, "fail": False, "sleep": 0.0, "label": "a"}


def test_one_point_records_metrics_claims_and_provenance(tmp_path):
    recs = run_points([make_point(FIX, {"x": 3})], tmp_path, progress=False)
    r = recs[0]
    assert r["status"] == "ok" and r["error"] is None
    assert r["metrics"] == {"double": 6, "label": "a"}
    assert {c["name"]: c["ok"] for c in r["claims"]} == {"x is positive": True, "x is big": True}
    assert r["parameters"] == {"x": 3} and r["duration_s"] > 0 and "commit" in r
    on_disk = json.loads((tmp_path / r["id"] / "record.json").read_text())
    assert on_disk["metrics"] == r["metrics"]
    assert read_records(tmp_path / r["output"])["metrics"]["double"] == 6


def test_failing_point_is_recorded_and_others_run(tmp_path):
    sw = load_sweep(write_sweep(tmp_path, {"x": [1, 2, 3]}, name="fail"))
    points = sweep_points(sw)
    points[1] = make_point(FIX, {"x": 2, "fail": True}, sweep="fail")
    recs = run_points(points, tmp_path / "out", workers=2, progress=False)
    status = {r["parameters"]["x"]: r["status"] for r in recs}
    assert status == {1: "ok", 2: "failed", 3: "ok"}
    bad = next(r for r in recs if r["status"] == "failed")
    assert "fails on purpose" in bad["error"]
    assert len(load_records(tmp_path / "out")) == 3


def test_four_point_grid_on_two_workers_and_skip_on_rerun(tmp_path):
    sw = load_sweep(write_sweep(tmp_path, {"x": [1, 2], "label": ["a", "b"]}))
    points = sweep_points(sw)
    assert len(points) == 4 and len({p["id"] for p in points}) == 4
    recs = run_points(points, tmp_path / "out", workers=2, progress=False)
    assert sorted(r["metrics"]["double"] for r in recs) == [2, 2, 4, 4]
    assert all(r["threads"] == 1 for r in recs)
    started = {r["id"]: r["started"] for r in recs}
    again = run_points(sweep_points(sw), tmp_path / "out", workers=2, progress=False)
    assert {r["id"]: r["started"] for r in again} == started       # nothing re-ran
    lines = (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    assert len(lines) == 4


def test_killed_sweep_resumes_without_losing_or_duplicating(tmp_path):
    path = write_sweep(tmp_path, {"x": [1, 2, 3, 4]}, parameters={"sleep": 1.5}, name="kill")
    out = tmp_path / "out"
    proc = subprocess.Popen([*GENLAB, "sweep", str(path), "--out", str(out), "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    jl = out / "records.jsonl"
    while time.time() < deadline and not (jl.is_file() and len(jl.read_text().splitlines()) >= 1):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = {r["id"]: r["started"] for r in load_records(out)}
    assert 1 <= len(first) < 4
    res = cli("sweep", str(path), "--out", str(out), "--no-report")
    assert res.returncode == 0, res.stderr
    recs = load_records(out)
    lines = jl.read_text().splitlines()
    assert len(recs) == 4 and len(lines) == 4                       # none lost, none duplicated
    assert all(recs_by["started"] == first[i] for i, recs_by in ((r["id"], r) for r in recs) if i in first)
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-") and (p / "record.json").exists()
                and json.loads((p / "record.json").read_text())["id"] not in first]


def test_same_grid_through_dask_local_cluster(tmp_path):
    from distributed import LocalCluster
    sw = load_sweep(write_sweep(tmp_path, {"x": [1, 2], "label": ["a", "b"]}))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        recs = run_points(sweep_points(sw), tmp_path / "dask", scheduler=cluster.scheduler_address, progress=False)
    assert sorted(r["metrics"]["double"] for r in recs) == [2, 2, 4, 4]
    assert all(r["status"] == "ok" for r in recs)
    assert len(load_records(tmp_path / "dask")) == 4


def test_report_has_claims_table(tmp_path):
    run_points([make_point(FIX, {"x": 1}), make_point(FIX, {"x": 5})], tmp_path, progress=False)
    md = report(tmp_path).read_text()
    assert "[fixture](#" in md and "x is big" in md and "**contradicted (1 measurement)**" in md and "| true |" in md
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")


# ---- bad input: clear errors before any notebook starts --------------------------------------

@pytest.mark.parametrize("args,words", [
    (["run", "no_such_method"], ["unknown notebook 'no_such_method'", "flow_matching"]),
    (["run", "missing/path.ipynb"], ["notebook file not found"]),
    (["run", str(FIX), "-p", "y", "1"], ["unknown parameter", "'y'", "allowed: x, fail, sleep, label"]),
    (["run", str(FIX), "-p", "x", "abc"], ["'x' must be int", "abc"]),
    (["run", "flow_matching", "--preset", "huge"], ["unknown preset 'huge'", "smoke, full"]),
    (["run", "flow_matching", "-p", "toy_steps", "1.5"], ["toy_steps", "int"]),
    (["run", "flow_matching", "-p", "toy_steps", "0"], ["toy_steps must be in [1, inf]"]),
    (["sweep", "nope.yaml"], ["sweep file not found"]),
    (["reproduce", "--only", "nothing"], ["unknown method(s)"]),
])
def test_cli_bad_input(args, words, tmp_path):
    res = cli(*args, "--out", str(tmp_path / "o")) if args[0] in ("run",) else cli(*args, cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    for w in words:
        assert w in res.stderr, res.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("content,words", [
    ("", ["is empty"]),
    ("notebook: [unclosed", ["not valid YAML"]),
    ("notebook: core\n", ["'grid' must be a non-empty mapping"]),
    ("grid: {x: [1]}\n", ["lacks 'notebook'"]),
    ("notebook: core\ngrid: {seed: 3}\n", ["must be a non-empty list"]),
    ("notebook: core\ngrid: {seed: [1]}\nextra: 1\n", ["unknown key"]),
    ("notebook: core\ngrid: {sed: [1]}\n", ["unknown parameter", "'sed'"]),
])
def test_bad_sweep_files(content, words, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(content)
    res = cli("sweep", str(p), "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    for w in words:
        assert w in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()


def test_unreachable_scheduler_is_named(tmp_path):
    p = write_sweep(tmp_path, {"x": [1]})
    res = cli("sweep", str(p), "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in res.stderr
    assert not (tmp_path / "o").exists()
    res = cli("sweep", str(p), "--scheduler", "127.0.0.1", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "tcp://HOST:PORT" in res.stderr


def test_cli_run_and_report(tmp_path):
    res = cli("run", str(FIX), "-p", "x", "4", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert '"status": "ok"' in res.stdout
    res = cli("report", str(tmp_path))
    assert res.returncode == 0 and (tmp_path / "report.md").is_file()
    assert f"{tmp_path / 'report.html'} (open it in a browser" in res.stdout  # the page the README points to
    res = cli("run", str(FIX), "-p", "fail", "true", "--out", str(tmp_path / "f"))
    assert res.returncode == 1 and "fails on purpose" in res.stdout


def test_by_notebook_layout_and_report_over_subfolders(tmp_path):
    recs = run_points([make_point(FIX, {"x": 2})], tmp_path, by_notebook=True, progress=False)
    assert (tmp_path / "fixture" / recs[0]["id"] / "record.json").is_file()
    assert len(load_records(tmp_path / "fixture")) == 1
    again = run_points([make_point(FIX, {"x": 2})], tmp_path, by_notebook=True, progress=False)
    assert again[0]["started"] == recs[0]["started"]
    assert "[fixture](#" in report(tmp_path).read_text()


# ---- runs that never stall, with their figures, quietly ---------------------------------------

EXPLORER = ROOT / "tests" / "fixtures" / "explorer.ipynb"


def _images(rec_dir: Path) -> int:
    nb = json.loads(next(rec_dir.glob("*.ipynb")).read_text())
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def test_explorer_notebook_runs_20_times_without_a_stall(tmp_path):
    "explore() draws one static snapshot under the runner: 20 runs in a row, each finishing with its figure."
    points = [make_point(EXPLORER, {"k": k}, timeout=60) for k in range(20)]
    recs = run_points(points, tmp_path, workers=2, progress=False)
    assert [r["status"] for r in recs] == ["ok"] * 20, [r["error"] for r in recs if r["status"] != "ok"]
    assert all(r["metrics"]["explorer_calls"] == 1 and r["metrics"]["explorer_args"] == [4, "a"] for r in recs)
    assert max(r["duration_s"] for r in recs) < 60


def test_kernels_draw_inline_figures_whatever_the_callers_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    rec = run_points([make_point(EXPLORER, {})], tmp_path, progress=False)[0]
    assert rec["status"] == "ok" and "inline" in rec["metrics"]["backend"]
    assert _images(tmp_path / rec["id"]) >= 1
    assert os.environ["MPLBACKEND"] == "Agg"   # the caller's environment is restored


def test_run_prints_no_kernel_warnings(tmp_path):
    res = cli("run", str(EXPLORER), "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "WARNING" not in res.stderr and "without encryption" not in res.stderr + res.stdout, res.stderr[-2000:]


def test_records_name_notebooks_by_repository_path(tmp_path):
    p = make_point(FIX, {"x": 1})
    assert p["source"] == "tests/fixtures/fixture.ipynb"
    assert make_point("flow_matching")["source"] == "nbs/10_flow_matching.ipynb"


def test_any_config_field_can_be_set_and_is_validated_before_a_kernel_starts(tmp_path):
    p = make_point("flow_matching", {"toy_batch": 128})
    assert p["inject"]["toy_batch"] == 128
    res = cli("run", "flow_matching", "-p", "toy_batch", "0", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "toy_batch" in res.stderr
    res = cli("params", "flow_matching")
    assert res.returncode == 0 and "toy_batch" in res.stdout and "smoke" in res.stdout and "full" in res.stdout


def test_config_override_reaches_the_kernel(tmp_path, monkeypatch):
    from genlab.core import resolve
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class C:
        a: int = 1
        b: int = 2
    monkeypatch.setenv("GENLAB_OVERRIDES", json.dumps({"b": 7, "other": 1}))
    cfg = resolve({"smoke": C()}, "smoke", a=None)
    assert cfg.b == 7 and cfg.a == 1


def test_reproduce_points_per_seed(tmp_path):
    from genlab.runs import reproduce_points
    pts = reproduce_points("full", only=["flow_matching"], seeds=[0, 1, 2])
    assert [p["seed"] for p in pts] == [0, 1, 2] and len({p["id"] for p in pts}) == 3
    with pytest.raises(RunError, match="seeds"):
        reproduce_points("full", only=["flow_matching"], seeds=[-1])


def test_a_timed_out_cell_fails_its_point_quietly(tmp_path):
    res = cli("run", str(FIX), "-p", "sleep", "8", "--timeout", "2", "--out", str(tmp_path))
    assert res.returncode == 1
    assert "CellTimeoutError" in res.stdout and "after 2 seconds" in res.stdout
    assert "Traceback" not in res.stderr and "ZMQError" not in res.stderr, res.stderr[-2000:]
    assert res.stdout.count("time.sleep(sleep)") == 0   # the cell source is not printed (the notebook keeps it)


def test_single_run_shows_cell_progress_and_sweeps_show_counts(tmp_path):
    res = cli("run", str(FIX), "--out", str(tmp_path / "one"))
    assert res.returncode == 0 and "cell/s" in res.stderr and "0/1 [" not in res.stderr
    sweep = write_sweep(tmp_path, {"x": [1, 2], "fail": [False, True]})
    res = cli("sweep", str(sweep), "--out", str(tmp_path / "sw"), "--workers", "2", "--no-report")
    assert res.returncode == 1 and "ok=2" in res.stderr and "failed=2" in res.stderr, res.stderr[-1500:]


def test_a_kernel_idle_without_replying_fails_fast_not_at_the_cell_timeout(tmp_path):
    "The stall seen under nbclient: the kernel goes idle but the cell's reply never comes."
    stall = ROOT / "tests" / "fixtures" / "stall.ipynb"
    p = make_point(stall, {}, timeout=120)
    p["stall_timeout"] = 3
    t0 = time.perf_counter()
    rec = execute_point(p)["record"]
    assert rec["status"] == "failed" and "KernelStallError" in rec["error"], rec["error"]
    assert time.perf_counter() - t0 < 60          # far inside the 120-s cell timeout
    ok = execute_point(make_point(stall, {"drop": False}, timeout=120))["record"]
    assert ok["status"] == "ok", ok["error"]


def test_commit_is_dirty_only_when_the_code_a_run_executes_differs(tmp_path):
    from genlab.runs import _git_commit, run_files
    import shutil as sh
    proj = tmp_path / "p"
    (proj / "nbs").mkdir(parents=True)
    (proj / "genlab").mkdir()
    sh.copy(ROOT / "settings.ini", proj / "settings.ini")
    for name in ("10_flow_matching.ipynb", "14_stein_transport.ipynb", "11_scfm.ipynb"):
        sh.copy(ROOT / "nbs" / name, proj / "nbs" / name)
    for mod in ("core", "record", "flow_matching", "stein_transport", "scfm"):
        (proj / "genlab" / f"{mod}.py").write_text(f"# {mod}\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=proj, check=True, capture_output=True)
    git("init", "-q"); git("add", "-A")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "x")
    nb = proj / "nbs" / "14_stein_transport.ipynb"
    files = run_files(nb)
    names = {p.name for p in files}
    assert {"14_stein_transport.ipynb", "settings.ini", "core.py", "record.py", "stein_transport.py"} <= names
    assert "scfm.py" not in names                      # a method module the notebook does not import
    assert "flow_matching.py" in names                 # its baseline, imported in a demonstration cell
    assert not _git_commit(proj, files).endswith("-dirty")
    (proj / "genlab" / "scfm.py").write_text("# scfm, in progress\n")
    (proj / "nbs" / "11_scfm.ipynb").write_text((proj / "nbs" / "11_scfm.ipynb").read_text() + " ")
    assert not _git_commit(proj, run_files(nb)).endswith("-dirty")   # others' work in progress
    (proj / "genlab" / "core.py").write_text("# core, changed\n")
    assert _git_commit(proj, run_files(nb)).endswith("-dirty")       # the core it runs changed


def _seeded_method_notebook(folder: Path) -> Path:
    "A method notebook whose one paper claim needs more seeds than its pilot: a per-seed value from a fixed table."
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# adaptive: a claim that needs more seeds"], "id": "a0"},
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "execution_count": None, "outputs": [],
         "source": ["preset = \"smoke\"\n", "seed = None"], "id": "a1"},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "id": "a2", "source": [
            "from genlab.record import Claims\n",
            "s = 0 if seed is None else seed\n",
            "value = [0.9, 0.1, 0.7, 0.6, 0.5, 0.8, 0.4, 0.7, 0.6, 0.5, 0.6, 0.7][s % 12]\n",
            "claims = Claims(headline=\"C1\")\n",
            "claims.paper(\"C1 the value is positive\", [value], threshold=0.0, direction=\">\", seeds=[s],\n",
            "             control={\"name\": \"mechanism removed\", \"values\": [-0.5 - 0.01 * (s % 5)]})\n",
            "claims.summary();"]}]
    p = folder / "10_adaptive.ipynb"
    p.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                         "language": "python"}},
                             "nbformat": 4, "nbformat_minor": 5}))
    return p


def test_reproduce_until_decided_runs_a_pilot_then_the_fresh_seeds_it_fixes(tmp_path, monkeypatch):
    from genlab.report import collect_records, load_designs, method_sections
    from genlab.runs import reproduce
    from genlab.stats import TWO_STAGE_LEVEL, evaluate
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _seeded_method_notebook(nbs)
    monkeypatch.setenv("GENLAB_NBS", str(nbs))
    out = tmp_path / "out"
    reproduce("smoke", seeds=[0, 1, 2], out=out, workers=2, until_decided=True, max_seeds=30)
    # the pilot (0.9, 0.1, 0.7) at 97.5% is undecided; Eq. 2 fixes the final stage before it runs
    pilot = evaluate({"values": [0.9, 0.1, 0.7], "threshold": 0.0, "direction": ">", "level": TWO_STAGE_LEVEL},
                     require_control=False)
    n = pilot["seeds_needed"]
    design = load_designs(out)["adaptive"]
    assert pilot["reason_code"] == "needs seeds" and design["pilot"] == [0, 1, 2]
    assert design["final"] == list(range(3, 3 + n)) and design["level"] == TWO_STAGE_LEVEL
    recs = collect_records(out)
    assert sorted(r["seed"] for r in recs) == list(range(3 + n))
    (m,) = method_sections(recs, load_designs(out))
    c = m["claims"][0]
    assert c["estimate"]["n"] == n and c["level"] == TWO_STAGE_LEVEL      # decided on the final stage alone
    assert c["verdict"] == "supported" and m["headline"]["name"] == c["name"]
    assert "two-stage design" in (out / "report.md").read_text()


def test_genlab_claims_prints_the_headline_and_reasons(tmp_path):
    res = cli("claims", "flow_matching", str(ROOT / "reports"))
    assert res.returncode == 0, res.stderr
    assert "headline:" in res.stdout and "paper claims:" in res.stdout
    bad = cli("claims", "flow_matching", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_cli_refuses_a_negative_timeout_and_suggests_a_close_notebook_name():
    res = cli("run", "flow_matchin")
    assert res.returncode == 2 and "did you mean 'flow_matching'" in res.stderr
    res = cli("run", "flow_matching", "--timeout", "-1")
    assert res.returncode == 2 and "--timeout" in res.stderr


def test_params_of_a_comparison_notebook_show_types_presets_and_meanings():
    from genlab.cli import params_table
    text = params_table("flows_compared")          # no module: its PRESETS are read from the notebook source
    head = text.splitlines()[2]
    assert "smoke" in head and "full" in head and "meaning" in head
    row = next(l for l in text.splitlines() if l.startswith("steps "))
    assert " int " in row and "1500" in row and "optimiser steps" in row
    batch = next(l for l in text.splitlines() if l.startswith("batch "))
    assert "(config field)" in batch and "'(config field)'" not in batch
    with pytest.raises(RunError, match="unknown preset 'fast'.*allowed: smoke, full"):
        validate_parameters(find_notebook("flows_compared"), {}, preset="fast")
