"tools/bench.py's pure helpers: per-round ratios, their median and spread, the noise flag (synthetic timings, no timing)."
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("genlab_bench", Path(__file__).resolve().parent.parent / "tools" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_round_ratios_pair_rounds_not_bests():
    gen, peer = [2.0, 4.0, 3.0], [1.0, 4.0, 2.0]
    assert bench.round_ratios(gen, peer) == [2.0, 1.0, 1.5]
    # a best-of would give min(gen)/min(peer) = 2.0; the median of per-round ratios is 1.5
    assert bench.summarize(bench.round_ratios(gen, peer)) == (1.5, 1.0, 2.0)


@pytest.mark.parametrize("num,den", [([1.0], [1.0, 2.0]), ([], []), ([1.0], [0.0])])
def test_round_ratios_rejects_bad_series(num, den):
    with pytest.raises(ValueError):
        bench.round_ratios(num, den)


def test_judge_flags_an_impossible_speed_up_as_noise():
    cell, flag = bench.judge([0.80, 0.83, 0.85], expect="ge1")   # a superset of the peer's work, 17% faster
    assert cell == "noise" and "NOISE" in flag and "0.83" in flag
    cell, flag = bench.judge([0.98, 0.99, 1.01], expect="ge1")   # within the tolerance: parity, reported
    assert cell == "0.99x" and "NOISE" not in flag
    cell, flag = bench.judge([1.20, 1.25, 1.30], expect="le1")   # a subset of the work yet slower
    assert cell == "noise"


def test_judge_reports_a_plain_ratio_and_flags_a_wide_spread():
    cell, flag = bench.judge([0.5, 0.6, 0.7])
    assert cell == "0.60x" and flag == ""
    cell, flag = bench.judge([0.5, 1.0, 1.2])
    assert cell == "1.00x" and "unstable" in flag
    with pytest.raises(ValueError):
        bench.judge([1.0], expect="faster")


def test_interleave_warms_up_and_flips_the_order():
    calls = []
    cases = {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}
    times = bench.interleave(cases, rounds=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert times == {"a": [1.0] * 3, "b": [2.0] * 3}


def test_add_row_and_table_carry_median_spread_and_note():
    bench.ROWS.clear()
    bench.add_row("w", "g", "p", [2.0, 3.0, 4.0], [2.0, 2.0, 2.0], per=2, unit="step", expect="ge1", note="n")
    row = bench.ROWS[0]
    assert row["ratio"] == "1.50x" and row["spread"] == "1.00-2.00 (n=3)"
    assert row["genlab"] == "g 1.50 s/step" and row["peer"] == "p 1.00 s/step"
    assert row["note"].startswith("unstable") and "load " in row["note"]
    text = bench.table(bench.ROWS).splitlines()
    assert text[0] == "| work | genlab | peer | median ratio | min-max spread | note |" and len(text) == 3
    bench.ROWS.clear()
