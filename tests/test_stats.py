"""genlab.stats: the interval and the decision rule against closed forms and scipy, their coverage on
simulated data, the three outcomes on constructed cases, controls, and pooling across seed runs."""
import math

import numpy as np
import pytest
from scipy import stats as st

from genlab.stats import decide, estimate, evaluate, pool, statistic


def test_t_interval_matches_closed_form_and_scipy():
    x = np.array([0.3, 0.5, 0.45, 0.62, 0.38])
    e = estimate(x)
    m, s, n = x.mean(), x.std(ddof=1), len(x)
    h = st.t.ppf(0.975, n - 1) * s / math.sqrt(n)
    assert e.mean == pytest.approx(m) and e.lo == pytest.approx(m - h) and e.hi == pytest.approx(m + h)
    lo, hi = st.t.interval(0.9, n - 1, loc=m, scale=st.sem(x))
    e90 = estimate(x, level=0.9)
    assert (e90.lo, e90.hi) == pytest.approx((lo, hi))


@pytest.mark.parametrize("method,n,tol", [("t", 5, 0.02), ("bootstrap", 20, 0.04)])
def test_coverage_near_nominal(method, n, tol):
    rng = np.random.default_rng(1)
    reps = 2000 if method == "t" else 300
    hits = 0
    for i in range(reps):
        e = estimate(rng.normal(1.0, 2.0, n), method=method, n_boot=999, seed=i)
        hits += e.lo <= 1.0 <= e.hi
    cov = hits / reps
    # the percentile bootstrap under-covers a little at small n (known); t is exact for normal data
    assert abs(cov - 0.95) <= tol + (0.03 if method == "bootstrap" else 0), cov


def test_three_outcomes_and_directions():
    tight = [1.0, 1.01, 0.99, 1.0]
    assert decide(estimate(tight), 0.5, ">") == "supported"
    assert decide(estimate(tight), 1.5, ">") == "contradicted"
    assert decide(estimate(tight), 1.5, "<=") == "supported"
    assert decide(estimate(tight), 0.5, "<") == "contradicted"
    assert decide(estimate([0.0, 2.0, 1.0]), 1.0, ">=") == "unresolved"
    assert decide(estimate([3.0]), 0.0, ">") == "unresolved"          # n = 1
    assert decide(estimate([1.0, 1.0, 1.0]), 1.0, ">=") == "supported"  # exact ties count for >=
    assert decide(estimate([1.0, 1.0, 1.0]), 1.0, ">") == "contradicted"
    with pytest.raises(ValueError, match="direction"):
        decide(estimate(tight), 1.0, "=>")


def test_statistics_paired():
    a, b = [2.0, 4.0, 6.0], [1.0, 2.0, 4.0]
    assert statistic(a, b, "diff").tolist() == [1.0, 2.0, 2.0]
    assert statistic(a, b, "ratio").tolist() == [2.0, 2.0, 1.5]
    with pytest.raises(ValueError, match="paired"):
        statistic(a, [1.0], "diff")
    with pytest.raises(ValueError, match="needs a baseline"):
        statistic(a, None, "ratio")
    with pytest.raises(ValueError, match="non-finite"):
        statistic([1.0, float("nan")])


def test_paired_comparison_beats_unpaired_noise():
    # shared seed effects cancel in the pairing: the paired difference is decided, each alone overlaps
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 1.0, 5)
    a, b = 1.0 + seed_effect + 0.01 * rng.normal(size=5), 0.9 + seed_effect
    r = evaluate({"values": a, "baseline": b, "stat": "diff", "threshold": 0.0, "direction": ">"})
    assert r["verdict"] == "supported"
    ea, eb = estimate(a), estimate(b)
    assert ea.lo < eb.hi  # unpaired intervals overlap


def test_control_that_also_passes_makes_the_claim_unresolved():
    spec = {"values": [0.9, 0.92, 0.91], "threshold": 0.5, "direction": ">"}
    assert evaluate({**spec, "control": {"name": "shuffled", "values": [0.1, 0.12, 0.09]}})["verdict"] == "supported"
    r = evaluate({**spec, "control": {"name": "no-op", "values": [0.9, 0.91, 0.93]}})
    assert r["verdict"] == "unresolved" and "cannot tell" in r["reason"]
    # a control with its own threshold and direction
    r = evaluate({**spec, "control": {"name": "ablated", "values": [0.6, 0.61], "threshold": 0.8, "direction": ">="}})
    assert r["control"]["verdict"] == "contradicted" and r["verdict"] == "supported"


def test_pool_over_seed_runs():
    runs = [{"name": "C", "values": [v], "baseline": [b], "seeds": [i], "stat": "ratio", "threshold": 0.7,
             "direction": "<=", "control": {"name": "k", "values": [c]}}
            for i, (v, b, c) in enumerate([(0.2, 1.0, 1.0), (0.25, 1.1, 1.1), (0.22, 0.9, 0.95)])]
    assert all(evaluate(r)["verdict"] == "unresolved" for r in runs)
    p = pool(runs)
    assert p["values"] == [0.2, 0.25, 0.22] and p["baseline"] == [1.0, 1.1, 0.9] and p["seeds"] == [0, 1, 2]
    assert p["control"]["values"] == [1.0, 1.1, 0.95]
    r = evaluate(p)
    assert r["verdict"] == "supported" and r["estimate"]["n"] == 3 and r["control"]["verdict"] == "contradicted"
    with pytest.raises(ValueError, match="disagree on threshold"):
        pool([runs[0], {**runs[1], "threshold": 0.5}])


def test_missed_precondition_leaves_a_claim_unresolved_and_pools_as_all():
    spec = {"name": "C", "values": [0.2, 0.25, 0.22], "baseline": [1.0, 1.1, 0.9], "stat": "ratio",
            "threshold": 0.7, "direction": "<="}
    assert evaluate(spec)["verdict"] == "supported"
    missed = evaluate({**spec, "requires": [{"name": "calibrated", "ok": False}, {"name": "converged", "ok": True}]})
    assert missed["verdict"] == "unresolved" and "calibrated" in missed["reason"] and "converged" not in missed["reason"]
    # a contradicted claim whose precondition is missed is unresolved too: it was not a fair test
    assert evaluate({**spec, "threshold": 0.1, "requires": [{"name": "calibrated", "ok": False}]})["verdict"] == "unresolved"
    runs = [{**spec, "values": [v], "baseline": [b], "requires": [{"name": "calibrated", "ok": ok}]}
            for v, b, ok in zip(spec["values"], spec["baseline"], [True, True, False])]
    assert evaluate(pool(runs))["verdict"] == "unresolved"
    assert evaluate(pool([{**r, "requires": [{"name": "calibrated", "ok": True}]} for r in runs]))["verdict"] == "supported"


def test_median_bootstrap_interval():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(1.0, 0.1, 40), [50.0, 80.0]])      # two outliers pull the mean, not the median
    e = estimate(x, method="bootstrap", center="median")
    assert e.center == "median" and e.mean == pytest.approx(float(np.median(x)))
    assert e.lo <= e.mean <= e.hi and e.hi < 1.2                      # the mean (about 3.2) is far outside
    assert estimate(x, method="bootstrap").mean == pytest.approx(float(x.mean()))
    with pytest.raises(ValueError, match="median"):
        estimate(x, center="median")                                  # no t-interval for a median
    spec = {"name": "m", "values": list(x), "stat": "value", "threshold": 1.5, "direction": "<",
            "method": "bootstrap", "center": "median"}
    assert evaluate(spec)["verdict"] == "supported"
    assert evaluate({**spec, "center": "mean"})["verdict"] != "supported"
    with pytest.raises(ValueError, match="center"):
        pool([spec, {**spec, "center": "mean"}])
