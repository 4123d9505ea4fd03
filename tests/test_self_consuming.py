"""Unit tests for genlab.self_consuming with independent oracles: closed forms, brute-force iteration,
matrix powers against networkx, scipy's Lyapunov solver against its defining equation and the series."""
import math

import numpy as np
import pytest

from genlab.core import ParameterError, resolve
from genlab.data import sample_ring
import genlab.self_consuming as sc


def _random_nets(count, seed=0, K=6):
    rng = np.random.default_rng(seed)
    return [sc.random_network(K, 0.4, 0.3, rng) for _ in range(count)]


# --- the graph: row constraint and bad input -------------------------------------------------------------

def test_row_sums_enforced_and_named():
    with pytest.raises(ParameterError, match=r"row 1 of \[a \| W\] sums to 0.9"):
        sc.Network([0.5, 0.2], [[0.5, 0.0], [0.5, 0.2]])
    with pytest.raises(ParameterError, match=r"custom_W"):
        sc.Network([0.5, 0.0], [[0.5, 0.1], [0.0, 1.0]], a_name="custom_a", W_name="custom_W")
    net = sc.Network([0.5, 0.0], [[0.25, 0.25], [0.0, 1.0]])
    assert np.allclose(net.a + net.W.sum(1), 1)
    sc.Network([0.5], [[0.5 + 5e-10]])            # within the 1e-9 tolerance
    with pytest.raises(ParameterError):
        sc.Network([0.5], [[0.5 + 1e-8]])


@pytest.mark.parametrize("a, W, n, match", [
    ([-0.1, 0.0], [[1.1, 0.0], [0.0, 1.0]], 100, r"a\[0\] = -0.1 is negative"),
    ([0.5, 0.5], [[0.7, -0.2], [0.0, 0.5]], 100, r"W\[0, 1\] = -0.2 is negative"),
    ([0.5], [[0.5, 0.0]], 100, r"1x1 matrix"),
    ([0.5, np.nan], [[0.5, 0.0], [0.0, 1.0]], 100, r"non-finite"),
    ([1.0], [[0.0]], 0, r"n must be positive"),
    ([1.0], [[0.0]], 2.5, r"n must be positive"),
])
def test_constructor_rejects_invalid_graphs(a, W, n, match):
    with pytest.raises(ParameterError, match=match):
        sc.Network(a, W, n)


def test_config_rejects_bad_graphs_before_any_work():
    with pytest.raises(ParameterError, match="real_frac"):
        resolve(sc.PRESETS, "smoke", real_frac=-0.1)
    with pytest.raises(ParameterError, match="custom_W"):
        resolve(sc.PRESETS, "smoke", graph="custom", custom_a=(0.5, 0.0), custom_W=((0.5, 0.1), (0.0, 1.0)))
    with pytest.raises(ParameterError, match=r"custom_a\[1\]"):
        resolve(sc.PRESETS, "smoke", graph="custom", custom_a=(0.5, -0.5), custom_W=((0.5, 0.0), (0.0, 1.5)))
    with pytest.raises(ParameterError, match="custom_a"):
        resolve(sc.PRESETS, "smoke", graph="custom")
    with pytest.raises(ParameterError, match="graph"):
        resolve(sc.PRESETS, "smoke", graph="torus")
    cfg = resolve(sc.PRESETS, "smoke", graph="custom", custom_a=[0.5, 0.0], custom_W=[[0.25, 0.25], [0.0, 1.0]])
    assert cfg.demo_network().K == 2


def test_weights_as_count():
    net = sc.Network([30, 0], [[50, 20], [10, 40]], weights_as="count")
    assert net.n.tolist() == [100, 50]
    assert np.allclose(net.a, [0.3, 0.0]) and np.allclose(net.W, [[0.5, 0.2], [0.2, 0.8]])
    with pytest.raises(ParameterError, match="whole sample counts"):
        sc.Network([0.5, 0], [[1, 0], [0, 1]], weights_as="count")


# --- rounding ---------------------------------------------------------------------------------------------

def test_allocation_sums_exactly_to_n():
    rng = np.random.default_rng(0)
    for _ in range(500):
        k = rng.integers(1, 9)
        f = rng.dirichlet(np.ones(k)) * (rng.uniform(size=k) < 0.7)
        if f.sum() == 0:
            continue
        f = f / f.sum()
        n = int(rng.integers(1, 300))
        c = sc.allocate(f, n)
        assert c.sum() == n and np.all(c >= 0)
        assert np.all(np.abs(c - f * n) < 1)                     # each count within one of its quota
    # independent rounding would give 9 here
    assert np.round(np.full(3, 1 / 3) * 10).sum() == 9 and sc.allocate(np.full(3, 1 / 3), 10).sum() == 10
    for net in _random_nets(50):
        assert np.array_equal(sc.allocation_matrix(net).sum(1), net.n)
    m = sc.allocation_matrix(sc.ring_graph(4, 0.2, 37), "multinomial", np.random.default_rng(1))
    assert np.array_equal(m.sum(1), np.full(4, 37))


# --- convergence condition --------------------------------------------------------------------------------

def test_reachability_networkx_agrees_with_matrix_powers_and_spectrum():
    nets = _random_nets(300, seed=3)
    for net in nets:
        assert np.array_equal(sc.reaches_real(net), sc.reaches_real_matrix(net))
        rho = max(abs(np.linalg.eigvals(net.W)))                 # numpy, not scipy: an independent spectrum
        assert (rho < 1 - 1e-9) == bool(sc.reaches_real(net).all())
    assert 0.2 < np.mean([sc.converges(n) for n in nets]) < 0.8


def test_transpose_convention_on_the_star():
    star = sc.star_graph(5, 0.0)     # hub 0 has real data; leaves consume from the hub
    assert sc.reaches_real(star).all() and sc.converges(star)
    assert sc.reaches_real(star, transpose=True).tolist() == [True, False, False, False, False]
    assert sc.consumption_graph(star).has_edge(1, 0) and not sc.consumption_graph(star).has_edge(0, 1)


def test_decay_rate_matches_rho():
    for a in (0.3, 0.5, 0.8):
        net = sc.ring_graph(4, a)
        P0 = np.random.default_rng(0).dirichlet(np.ones(3), size=4)
        r, npts = sc.decay_rate(net, P0, [0.2, 0.3, 0.5])
        # the ring's eigenvalues all have modulus 1 - a, so the error norm decays exactly at that rate
        assert npts >= 2 and abs(r - (1 - a)) < 1e-3


# --- fixed points -----------------------------------------------------------------------------------------

def test_fixed_point_is_p_star():
    for net in _random_nets(100, seed=5):
        if not sc.converges(net):
            with pytest.raises(ValueError):
                sc.population_fixed_point(net)
            continue
        assert np.abs(sc.population_fixed_point(net) - 1).max() < 1e-10
        rho = sc.spectral_radius(net.W)
        P = sc.population_run(net, np.eye(6)[:, :3], [0.2, 0.3, 0.5], sc.steps_to_tolerance(rho, 1e-12))[-1]
        assert np.abs(P - [0.2, 0.3, 0.5]).max() < 1e-9


def test_absorption_probabilities_closed_form_on_g4():
    T, B, classes = sc.absorption_probabilities(sc.g4_graph(0.0))
    assert T.tolist() == [0, 1] and classes == [[2, 3]]
    # b0 = 0.5 + 0.25 b0 + 0.25 b1, b1 = 0.5 + 0.3 b0  =>  b0 = 25/27, b1 = 7/9
    assert np.allclose(B[:, 0], [25 / 27, 7 / 9], atol=1e-14) and np.allclose(B.sum(1), 1)


def test_predicted_limits_against_brute_force_iteration():
    rng = np.random.default_rng(7)
    checked = 0
    for net in _random_nets(300, seed=11):
        classes = sc.closed_classes(net)
        if not classes or not all(sc.is_aperiodic_class(net, c) for c in classes):
            continue
        P0 = rng.dirichlet(np.ones(4), size=net.K)
        p_star = rng.dirichlet(np.ones(4))
        P = sc.population_run(net, P0, p_star, 20000)[-1]
        assert np.abs(P - sc.predicted_limits(net, P0, p_star)).max() < 1e-8
        checked += 1
    assert checked >= 10


def test_consensus_weights_closed_form():
    net = sc.Network([0.0, 0.0], [[0.7, 0.3], [0.6, 0.4]])
    assert np.allclose(sc.consensus_weights(net, [0, 1]), [2 / 3, 1 / 3])
    assert np.allclose(np.linalg.matrix_power(net.W, 200)[0], [2 / 3, 1 / 3])


def test_periodic_class_has_no_limit():
    swap = sc.Network([0.5, 0.0, 0.0], [[0.25, 0.25, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    assert not sc.is_aperiodic_class(swap, [1, 2])
    with pytest.raises(ValueError, match="periodic"):
        sc.predicted_limits(swap, np.eye(3), [1.0, 0.0, 0.0])
    P = sc.population_run(swap, np.eye(3), [1.0, 0.0, 0.0], 11)
    assert P[10, 1, 1] == 1.0 and P[11, 1, 1] == 0.0


# --- Lyapunov -----------------------------------------------------------------------------------------------

def test_lyapunov_solves_its_equation_and_matches_series():
    for net in [n for n in _random_nets(60, seed=2) if sc.converges(n)][:20] + [sc.ring_graph(4, 0.2)]:
        C = sc.lyapunov_mse(net)
        D = np.diag(1.0 / net.n)
        assert np.abs(C - net.W @ C @ net.W.T - D).max() < 1e-12
        S, Wk = np.zeros_like(C), np.eye(net.K)
        for _ in range(5000):
            S += Wk @ D @ Wk.T
            Wk = Wk @ net.W
            if np.abs(Wk).max() < 1e-18:
                break
        assert np.allclose(C, S, rtol=1e-6, atol=1e-12)


def test_lyapunov_closed_forms():
    assert np.allclose(np.diag(sc.lyapunov_mse(sc.ring_graph(4, 0.2))), 0.01 / 0.36)
    assert np.allclose(np.diag(sc.lyapunov_mse(sc.ring_graph(4, 0.5))), 0.01 / 0.75)
    # star: hub MSE 0.01, leaf (0.25 * 0.01 + 0.01) / 0.75
    assert np.isclose(np.diag(sc.lyapunov_mse(sc.star_graph(6, 0.0))).mean(), (0.01 + 5 * 0.0125 / 0.75) / 6)
    # complete without self-loops, K = 6, a = 0.2: eigenvalue 0.8 on 1 (weight 1/6), -0.16 elsewhere (weight 5/6)
    assert np.isclose(np.diag(sc.lyapunov_mse(sc.complete_graph(6, 0.2))).mean(),
                      0.01 * (1 / 6 / (1 - 0.64) + 5 / 6 / (1 - 0.16 ** 2)))
    with pytest.raises(ValueError):
        sc.lyapunov_mse(sc.g4_graph(0.0))


# --- simulators --------------------------------------------------------------------------------------------

def test_isolated_real_node_is_the_real_data_mle():
    net = sc.Network([1.0], [[0.0]], 100)
    out = sc.simulate_gaussian(net, 1, np.random.default_rng(0))
    rng = np.random.default_rng(0)
    rng.standard_normal((1, 100))                    # generation-0 fit
    x = rng.standard_normal((1, 100))[0]             # generation-1 real data
    assert out["means"][1, 0] == np.mean(x)          # bit-identical
    assert math.isclose(out["vars"][1, 0], np.var(x), rel_tol=1e-12)
    # the generic loop with an exact MLE fit is bit-identical too
    fit = lambda X, r: (float(np.mean(X)), float(np.var(X)))
    real = lambda m, r: r.standard_normal((m, 1))
    res = sc.simulate_models(net, fit=fit, sample=lambda mdl, m, r: None, real=real, T=1, rng=np.random.default_rng(4))
    rng = np.random.default_rng(4)
    rng.standard_normal((100, 1))
    x = rng.standard_normal((100, 1))
    assert res["models"][0] == (float(np.mean(x)), float(np.var(x)))


def test_synchronous_updates_match_lyapunov_and_sequential_do_not():
    net = sc.complete_graph(6, 0.2)
    pred = np.diag(sc.lyapunov_mse_refined(net)).mean()
    mse = lambda **kw: np.mean([(sc.simulate_gaussian(net, 300, np.random.default_rng(s), **kw)["means"][50:] ** 2).mean()
                                for s in range(10)])
    assert 0.92 < mse() / pred < 1.08
    assert mse(update="sequential") / pred > 1.12


def test_closed_class_variance_shrinks_like_the_noise_free_recursion():
    net = sc.g4_graph(0.0, 50)
    v = sc.expected_variance_path(net, 100, ddof=0)
    assert np.allclose(v[:, 2], (1 - 1 / 50) ** np.arange(101))
    assert np.allclose(sc.expected_variance_path(net, 100, ddof=1)[:, 2], 1.0)
    # an isolated node without real data: E v^t = (1 - 1/n)^t exactly (product of independent chi2_{n-1}/n)
    iso = sc.self_graph(1, 0.0, 50)
    runs = np.array([sc.simulate_gaussian(iso, 20, np.random.default_rng(s))["vars"][:, 0] for s in range(2000)])
    assert abs(runs[:, 20].mean() / (runs[:, 0].mean() * (1 - 1 / 50) ** 20) - 1) < 0.08


def test_categorical_absorbing_state_and_normalisation():
    net = sc.self_graph(3, 0.0, 50)
    P = sc.simulate_categorical(net, 40, np.random.default_rng(0), 5, p_star=np.eye(8)[2], init="truth")
    assert np.all(P[..., 2] == 1.0)
    P = sc.simulate_categorical(sc.ring_graph(4, 0.3, 60), 10, np.random.default_rng(1), 7)
    assert P.shape == (7, 11, 4, 8) and np.allclose(P.sum(-1), 1)
    lost = (sc.simulate_categorical(sc.self_graph(1, 0.0), 30, np.random.default_rng(2), 300) > 0)
    assert np.all(lost[:, 1:].sum(-1) <= lost[:, :-1].sum(-1))   # without real data a lost class never returns


def test_gmm_sampler_is_shuffled_and_has_the_model_moments():
    rng = np.random.default_rng(0)
    gm = sc.fit_gmm(sample_ring(2000, rng, **sc.RING), rng, 8)
    X = sc.sample_gmm(gm, 40000, np.random.default_rng(1))
    mean = (gm.weights_[:, None] * gm.means_).sum(0)
    assert np.allclose(X.mean(0), mean, atol=0.03)
    comp = gm.predict(X[:200])
    assert len(np.unique(comp[:50])) > 3                       # not sorted by component


def test_sample_metrics():
    c = sc.ring_centres()
    m = sc.mode_metrics(np.repeat(c, 10, 0), c)
    assert m == {"modes": 8, "min_share": 0.125, "precision": 1.0, "within_rms": 0.0}
    m = sc.mode_metrics(np.repeat(c[:3], 10, 0), c)
    assert m["modes"] == 3 and m["min_share"] == 0.0
    # one mode holding 1% of the samples is below the 2% coverage cut: not covered, and the smallest share says by how much
    X = np.concatenate([np.repeat(c[:7], 14, 0), c[7:8], c[0:1] + 5.0])      # 98 + 1 in-mode samples, 1 far away
    m = sc.mode_metrics(X, c)
    assert m["modes"] == 7 and m["min_share"] == 0.01 and m["precision"] == 0.99
    X = np.random.default_rng(0).standard_normal((300, 3))
    assert sc.knn_precision_recall(X, X.copy()) == {"precision": 1.0, "recall": 1.0}
    assert sc.knn_precision_recall(X, X + 100) == {"precision": 0.0, "recall": 0.0}
    pr = sc.knn_precision_recall(X, 0.1 * X)                  # collapsed: precise, not diverse
    assert pr["precision"] > 0.9 and pr["recall"] < 0.5


def test_simulate_models_uses_disjoint_slices_and_previous_generation():
    # node 1 eats all its data from node 0; node 0 trains on real data only. Models are "the data seen".
    net = sc.Network([1.0, 0.0], [[0.0, 0.0], [1.0, 0.0]], 4)
    gen = {"t": 0}

    def real(m, r):
        return np.full((m, 1), float(gen["t"]))

    def evaluate(models, t):
        gen["t"] = t + 1
        return {"m": np.array([mdl[0, 0] for mdl in models])}

    res = sc.simulate_models(net, fit=lambda X, r: X.copy(), sample=lambda mdl, m, r: mdl[:m], real=real, T=3,
                             rng=np.random.default_rng(0), evaluate=evaluate)
    log = np.stack([L["m"] for L in res["log"]])
    assert log[:, 0].tolist() == [0, 1, 2, 3]               # node 0 refits on fresh real data each generation
    assert log[1:, 1].tolist() == [0, 1, 2]                 # node 1 reads node 0's previous-generation model


def test_g4_without_real_data_moves_the_real_fraction_to_the_self_loops():
    g, g0 = sc.g4_graph(0.0), sc.g4_graph(0.0, a_R=0.0)
    assert np.array_equal(sc.g4_graph(0.0, 100, 0.5).W, g.W)                   # the default is G4
    assert np.allclose(g0.a, 0) and np.allclose(g0.a + g0.W.sum(1), 1)
    assert np.allclose(g0.W - g.W, np.diag([0.5, 0.5, 0, 0]))
    assert not sc.converges(g0) and sc.closed_classes(g0) == [[2, 3]]        # nodes 0, 1 drain into the closed class
    with pytest.raises(sc.ParameterError, match="a_R"):
        sc.g4_graph(0.0, a_R=0.7)


def test_simulate_models_shared_prefixes():
    # two consumers (nodes 1, 2) read 3 samples each from node 0: shared prefixes give both the same 3 samples,
    # disjoint slices give them 6 different ones; node 0 publishes as many samples as its largest consumer needs
    net = sc.Network([1.0, 0.0, 0.0], [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], 3)
    asked = []

    def sample(m, k, r):
        asked.append(k)
        return np.arange(k, dtype=float)[:, None] + 10.0

    kw = dict(fit=lambda X, r: X, sample=sample, real=lambda m, r: np.zeros((m, 1)), T=1, rng=np.random.default_rng(0))
    shared = sc.simulate_models(net, slices="shared", **kw)["models"]
    assert asked == [3] and np.array_equal(shared[1], shared[2]) and shared[1][:, 0].tolist() == [10, 11, 12]
    asked.clear()
    disjoint = sc.simulate_models(net, **kw)["models"]
    assert asked == [6] and disjoint[1][:, 0].tolist() == [10, 11, 12] and disjoint[2][:, 0].tolist() == [13, 14, 15]
    with pytest.raises(sc.ParameterError, match="slices"):
        sc.simulate_models(net, slices="prefix", **kw)
