"""Unit tests for genlab.aldrift with independent oracles: explicit transition matrices, brute-force enumeration,
closed forms, Monte Carlo frequencies and scipy/sklearn."""
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from genlab.core import ParameterError, resolve
from genlab.aldrift import (PRESETS, CountFamily, CountingCost, GaussianFamily, GMMFamily, MarkovPrior, TinyGPTFamily,
                            aldrift, all_strings, annealed_rwmh, arithmetic_ladder, cem, check_ladder, e1_cost, e1_prior,
                            empirical_tv, envelope_objective, ess_fraction, evals_to_eps, exact_tilted,
                            geometric_ladder, grid_target, imh_kernel_matrix, independence_mh, isotropic_prior,
                            log_weights, normalised_weights, random_search, string_index, sum_cost, tv, weight_ratio)


def test_imh_kernel_leaves_target_stationary():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = rng.dirichlet(np.ones(6)); q = rng.dirichlet(np.ones(6))
        K = imh_kernel_matrix(p, q)
        assert np.all(K >= -1e-15) and np.allclose(K.sum(1), 1, atol=1e-14)
        assert np.abs(p @ K - p).max() < 1e-12
        # detailed balance, the stronger property
        assert np.abs(p[:, None] * K - (p[:, None] * K).T).max() < 1e-12


def test_independence_mh_chains_sample_the_target_monte_carlo():
    "Many chains over a finite space, each reading fresh proposals of q: their states follow p (Monte Carlo oracle)."
    rng = np.random.default_rng(1)
    p = np.array([0.05, 0.4, 0.1, 0.2, 0.05, 0.2]); q = np.full(6, 1 / 6)
    C, steps = 4000, 30
    props = rng.choice(6, size=C * steps, p=q)
    start = np.zeros(C, dtype=int)  # every chain starts in state 0: the chains must forget it
    lw = lambda s: np.log(p[s]) - np.log(q[s])
    hist, acc = independence_mh(lw(start), lw(props), np.arange(C * steps).reshape(C, steps), rng, keep=1)
    pool = np.concatenate([start, props])
    freq = np.bincount(pool[hist[-1]], minlength=6) / C
    assert np.abs(freq - p).max() < 0.03 and 0 < acc < 1
    # thinning returns the requested states: stride 5, keep 3 -> steps 29, 24, 19
    h2, _ = independence_mh(lw(start), lw(props), np.arange(C * steps).reshape(C, steps), np.random.default_rng(2), 3, 5)
    assert h2.shape == (3, C)
    with pytest.raises(ParameterError):
        independence_mh(lw(start), lw(props), np.arange(C * steps).reshape(C, steps), rng, 10, 5)


def _imh_reference(state_logw, prop_logw, index, rng, keep, stride=1):
    "A step-by-step reference of Eq. 4, one chain at a time (independent of the vectorised implementation)."
    C, steps = index.shape
    logu = np.log(rng.random((steps, C)))
    when = {steps - 1 - j * stride: keep - 1 - j for j in range(keep)}
    hist, n_acc = np.empty((keep, C), dtype=np.int64), 0
    for c in range(C):
        cur, lw = c, state_logw[c]
        for t in range(steps):
            j = index[c, t]
            if logu[t, c] < prop_logw[j] - lw or (lw == -np.inf and np.isfinite(prop_logw[j])):
                cur, lw, n_acc = C + j, prop_logw[j], n_acc + 1
            if t in when:
                hist[when[t], c] = cur
    return hist, n_acc / (C * steps)


def test_independence_mh_matches_a_per_chain_reference():
    rng = np.random.default_rng(3)
    C, N, steps = 7, 40, 40
    start, props = rng.normal(size=C), rng.normal(size=N) * 3
    start[0] = -np.inf  # a chain started outside the target's support leaves it at the first finite proposal
    props[5] = -np.inf
    index = np.stack([rng.permutation(N) for _ in range(C)])
    h, a = independence_mh(start, props, index, np.random.default_rng(9), keep=4, stride=3)
    h_ref, a_ref = _imh_reference(start, props, index, np.random.default_rng(9), keep=4, stride=3)
    assert np.array_equal(h, h_ref) and a == a_ref


def test_stop_hook_ends_the_run_after_the_iteration_it_fires():
    calls = []

    def stop(evals, best):
        calls.append((evals, best))
        return evals >= 600
    cost = CountingCost(e1_cost)
    r = aldrift(e1_prior(), cost, GaussianFamily(1.5), [0, 0.5, 1.0, 2.0, 3.0], n_proposals=300, n_chains=20, keep=5,
                rng=np.random.default_rng(0), stop=stop)
    assert cost.n == 600 == r["evals"] and [c[0] for c in calls] == [300, 600] and len(r["log"]) == 2
    assert calls[-1][1] == r["best"]


def test_log_space_weights_never_overflow():
    d = 1e3 + np.random.default_rng(0).random(1000) * 10
    lw = log_weights(np.zeros(1000), d, 100.0, np.zeros(1000))
    w = normalised_weights(lw)
    assert np.all(np.isfinite(w)) and abs(w.sum() - 1) < 1e-12
    assert np.isfinite(ess_fraction(lw)) and np.isfinite(weight_ratio(lw))


def test_ess_and_weight_ratio_closed_forms():
    assert ess_fraction(np.zeros(10)) == pytest.approx(1.0) and weight_ratio(np.zeros(10)) == pytest.approx(1.0)
    one_hot = np.full(8, -np.inf); one_hot[3] = 0.0
    assert ess_fraction(one_hot) == pytest.approx(1 / 8) and weight_ratio(one_hot) == pytest.approx(8)
    w = np.array([1.0, 2.0, 3.0, 4.0])
    assert ess_fraction(np.log(w)) == pytest.approx(w.sum() ** 2 / (4 * (w ** 2).sum()))
    assert weight_ratio(np.log(w)) == pytest.approx(4 / w.mean())


def test_gaussian_mle_and_inflation():
    rng = np.random.default_rng(0)
    mean = np.array([1.0, -2.0, 0.5]); A = rng.normal(size=(3, 3)); cov = A @ A.T + np.eye(3)
    x = rng.multivariate_normal(mean, cov, size=100000)
    g1 = GaussianFamily(kappa=1.0, floor=0.0).fit(x)
    assert np.abs(g1.mean - mean).max() < 0.02 * np.abs(mean).max()
    assert np.abs(g1.cov - cov).max() < 0.02 * np.abs(cov).max()
    g2 = GaussianFamily(kappa=1.7, floor=0.0).fit(x)
    assert np.allclose(g2.cov, 1.7 * g1.cov, rtol=1e-13, atol=0)
    pts = rng.normal(size=(5, 3))
    assert np.allclose(g2.log_prob(pts), multivariate_normal(g2.mean, g2.cov).logpdf(pts))
    # a collapsed set (one repeated point) still gives a valid model
    g3 = GaussianFamily(kappa=1.2).fit(np.repeat(x[:1], 50, 0))
    assert np.all(np.isfinite(g3.log_prob(x[:3])))


def test_envelope_objective_satisfies_the_quadratic_envelope():
    rng = np.random.default_rng(0)
    xs = rng.uniform(-3, 3, 5)
    f = envelope_objective(xs)
    x = xs + rng.normal(size=(100000, 5)) * rng.uniform(0.001, 5, (100000, 1))
    ratio = f(x) / ((x - xs) ** 2).sum(1)
    assert ratio.min() >= 1 - 1e-12 and ratio.max() <= 3 + 1e-12
    assert f(xs[None])[0] == 0.0


def test_e3_exact_target_and_tv():
    prior = MarkovPrior(5, 6, 0.8)
    S, pi, lL, d = exact_tilted(prior, sum_cost(18), 2.0)
    assert len(S) == 5 ** 6 and abs(pi.sum() - 1) < 1e-12
    # brute force over itertools.product: the same strings, the same unnormalised target
    brute = np.array(list(itertools.product(range(5), repeat=6)))
    assert np.array_equal(brute, S)
    lp = np.array([np.log(0.2) + sum(np.log(prior.trans[a, b]) for a, b in zip(s[:-1], s[1:])) for s in brute[:200]])
    assert np.allclose(lp, lL[:200])
    assert abs(np.exp(lL).sum() - 1) < 1e-12
    r = np.random.default_rng(0)
    p, q = r.dirichlet(np.ones(30)), r.dirichlet(np.ones(30))
    assert tv(p, q) == pytest.approx(tv(q, p)) and tv(p, p) == 0.0 and 0 < tv(p, q) <= 1
    assert np.array_equal(string_index(S, 5), np.arange(len(S)))
    # P(|step| <= 1) about 0.8 under the Markov prior
    s = prior.sample(20000, r)
    assert 0.75 < np.mean(np.abs(np.diff(s, axis=1)) <= 1) < 0.88


def test_markov_prior_sampling_matches_log_prob():
    prior = MarkovPrior(3, 3, 0.8)
    S = all_strings(3, 3)
    p = np.exp(prior.log_prob(S))
    s = prior.sample(60000, np.random.default_rng(0))
    assert abs(p.sum() - 1) < 1e-12 and empirical_tv(s, p, 3) < 0.02


def test_count_family_is_normalised_and_well_specified():
    prior = MarkovPrior(5, 6, 0.8)
    S, pi, _, _ = exact_tilted(prior, sum_cost(18), 2.0)
    rng = np.random.default_rng(0)
    x = S[rng.choice(len(S), size=200000, p=pi)]
    m = CountFamily(5, 6, 0.1).fit(x)
    q = np.exp(m.log_prob(S))
    assert abs(q.sum() - 1) < 1e-10
    assert tv(q, pi) < 0.05  # MLE on exact samples of pi recovers pi (the family contains it)
    s = m.sample(50000, rng)
    assert empirical_tv(s, q, 5) < 0.12  # its sampler follows its own log-probabilities


def test_tinygpt_family_is_normalised_over_strings():
    fam = TinyGPTFamily(3, 4, d_model=16, n_layers=1, n_heads=2, steps=20, val_every=10)
    m = fam.new(np.random.default_rng(0))
    S = all_strings(3, 4)
    assert abs(np.exp(m.log_prob(S)).sum() - 1) < 1e-4
    x = MarkovPrior(3, 4, 0.8).sample(500, np.random.default_rng(1))
    m2 = fam.fit(x, np.random.default_rng(2), init=m)
    assert abs(np.exp(m2.log_prob(S)).sum() - 1) < 1e-4
    assert m2.sample(7, np.random.default_rng(3)).shape == (7, 4)
    assert any(not torch.equal(a, b) for a, b in zip(m.net.parameters(), m2.net.parameters()))  # fine-tuned a copy


def test_evaluation_counter_and_trace():
    prior = e1_prior()
    cost = CountingCost(e1_cost)
    ladder = [0, 0.5, 1.0, 2.0]
    r = aldrift(prior, cost, GaussianFamily(1.5), ladder, n_proposals=300, n_chains=20, keep=5,
                rng=np.random.default_rng(0))
    assert cost.n == 300 * 3 == r["evals"] and len(r["trace"]) == cost.n
    assert np.all(np.diff(r["trace"]) <= 0)
    cost2 = CountingCost(e1_cost)
    r2 = aldrift(prior, cost2, GaussianFamily(1.5), ladder, n_proposals=300, n_chains=20, keep=5,
                 rng=np.random.default_rng(0), final_steps=7)
    assert cost2.n == 300 * 3 + 20 * 7 and len(r2["samples"]) == 20 * 7


def test_bad_ladder_refused_before_any_evaluation():
    def boom(x):
        raise AssertionError("the cost must not be evaluated")
    for bad in ([0, 1, 1, 2], [0, 2, 1], [1.0], [0, np.inf], [-1, 0, 1]):
        with pytest.raises(ParameterError, match="ladder"):
            aldrift(e1_prior(), boom, GaussianFamily(), bad, n_proposals=10, n_chains=2, keep=2,
                    rng=np.random.default_rng(0))
    with pytest.raises(ParameterError, match="e1_ladder"):
        resolve(PRESETS, "smoke", e1_ladder=(0.0, 1.0, 0.5))
    with pytest.raises(ParameterError, match="e3_ladder"):
        resolve(PRESETS, "smoke", e3_ladder=(0.0, 2.0, 2.0))
    with pytest.raises(ParameterError):
        resolve(PRESETS, "smoke", e2_gamma=1.0)
    with pytest.raises(ParameterError, match="correction"):
        aldrift(e1_prior(), e1_cost, GaussianFamily(), [0, 1], n_proposals=10, n_chains=2, keep=2,
                rng=np.random.default_rng(0), correction="bogus")
    assert np.allclose(geometric_ladder(0.1, 2.0, 0.8), [0, 0.1, 0.2, 0.4, 0.8])
    assert np.allclose(arithmetic_ladder(0.1, 0.05, 3), [0, 0.1, 0.15, 0.2])
    assert check_ladder([0, 1, 2]).dtype == float


def test_evals_to_eps():
    assert list(evals_to_eps([3, 1, 0.5, 0.05, 0.001], [1, 0.1, 0.01, 1e-4])) == [2, 4, 5, np.inf]


def test_e1_grid_target_against_scipy_integration():
    prior = e1_prior()
    c, p = grid_target(prior, e1_cost, 0.0, fine=200)
    # at T = 0 the target is the prior: its left-half mass is the 0.7 component's (almost all of it) + tail of the other
    from scipy.stats import norm
    left = 0.7 * norm.cdf(0, -2, 0.7) + 0.3 * norm.cdf(0, 2, 0.7)
    assert abs(p[:100].sum() - left) < 2e-3


def test_mh_correction_beats_no_correction_on_e1_small():
    "A quick functional check: at small sizes the corrected run is already closer to the exact target."
    from genlab.aldrift import coarse, tv_samples_grid
    prior = e1_prior(); ladder = [0, 0.25, 0.5, 1, 2, 3]
    _, pf = grid_target(prior, e1_cost, 3.0); pc = coarse(pf)
    kw = dict(n_proposals=800, n_chains=80, keep=20, rng=np.random.default_rng(0))
    a = aldrift(prior, e1_cost, GaussianFamily(1.5), ladder, final_steps=20, **kw)
    kw["rng"] = np.random.default_rng(1)
    n = aldrift(prior, e1_cost, GaussianFamily(1.5), ladder, correction="none", **kw)
    assert tv_samples_grid(a["samples"], pc) + 0.2 < tv_samples_grid(n["samples"], pc)


def test_baselines_run_and_count():
    f = envelope_objective(np.zeros(2))
    pr = isotropic_prior(2, 4.0)
    c = cem(f, np.zeros(2), 16 * np.eye(2), n=64, n_iter=50, rng=np.random.default_rng(0), eps_stop=1e-6)
    assert c["best"] <= 1e-6 and c["evals"] % 64 == 0
    r = random_search(f, pr, n=64, max_evals=640, rng=np.random.default_rng(0))
    assert r["evals"] == 640 and len(r["trace"]) == 640
    m = annealed_rwmh(f, pr, geometric_ladder(0.05, 1.25, 1e6), n_chains=8, steps_per_temp=4, rng=np.random.default_rng(0),
                      max_evals=2000)
    assert m["evals"] <= 2000 + 32 and m["best"] < 0.1
