"""Unit tests for genlab.stein_transport against independent oracles: closed-form OU moments, finite
differences, autograd, scikit-learn's KernelRidge, the exact velocity of a Gaussian target, grids."""
import math

import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from genlab.core import ParameterError, resolve, set_seed
from genlab.data import sample_ring
from genlab.stein_transport import (PRESETS, banana_exact_samples, banana_rwm, bootstrap_memoriser,
                                    moment_matched_gaussian, kde_bootstrap, banana_grid, banana_logpost, banana_score,
                                    conditional_dlogrho, conditional_score, gaussian_exact_velocity, in_hpd_fraction,
                                    kernel_bandwidth, krr_fit, krr_predict, ksd_u, memorisation_ratio, ou_coefficients,
                                    ou_pairs, rbf_kernel, sample_g1, RING, stein_fit, stein_gram, stein_predict,
                                    stein_transport, time_grid, velocity_rel_error, within_mode_rms, ring_centres,
                                    kfold_splits, kfold_steps)

T = 4.0


def _cond_logpdf(x, Y, t):
    "log N(x; a_t Y, b_t² I) written directly from its definition (the oracle for eqs. 6-7)."
    a, b, _, _ = ou_coefficients(t, T)
    d = x.shape[1]
    return -0.5 * d * math.log(2 * math.pi * b * b) - ((x - a * Y) ** 2).sum(1) / (2 * b * b)


# ---------------------------------------------------------------- OU path (eqs. 3-5)
def test_ou_endpoint_t1_is_the_data():
    g = set_seed(0)
    Y, Z = sample_g1(100, g), torch.randn(100, 2, generator=g, dtype=torch.float64)
    xt, _ = ou_pairs(Y, Z, 1.0, T)
    assert torch.equal(xt, Y)


def test_ou_endpoint_t0_moments_closed_form():
    g = set_seed(1)
    n = 100_000
    Y = sample_g1(n, g) * torch.tensor([1.5, 0.7], dtype=torch.float64) + 3.0
    Z = torch.randn(n, 2, generator=g, dtype=torch.float64)
    x0, _ = ou_pairs(Y, Z, 0.0, T)
    e = math.exp(-T)
    assert torch.allclose(x0.mean(0), e * Y.mean(0), atol=0.015)
    target = (1 - math.exp(-2 * T)) * torch.eye(2, dtype=torch.float64) + math.exp(-2 * T) * torch.cov(Y.T)
    cov = torch.cov(x0.T)
    assert float(torch.linalg.norm(cov - target) / torch.linalg.norm(target)) < 0.05
    assert ((cov.diagonal() / target.diagonal() - 1).abs() < 0.05).all()


@pytest.mark.parametrize("t", [0.0, 0.2, 0.5, 0.9, 0.99, 0.999])
def test_conditional_velocity_is_the_time_derivative(t):
    g = set_seed(2)
    Y, Z = sample_g1(50, g), torch.randn(50, 2, generator=g, dtype=torch.float64)
    delta = 1e-6 * (1 - t) if t > 0.9 else 1e-6
    xp, _ = ou_pairs(Y, Z, t + delta, T)
    xm, _ = ou_pairs(Y, Z, t - delta, T)
    _, U = ou_pairs(Y, Z, t, T)
    assert torch.allclose((xp - xm) / (2 * delta), U, atol=1e-4)


@pytest.mark.parametrize("t", [0.1, 0.5, 0.9])
def test_conditional_score_finite_difference(t):
    g = set_seed(3)
    Y, Z = sample_g1(20, g), torch.randn(20, 2, generator=g, dtype=torch.float64)
    a, b, _, _ = ou_coefficients(t, T)
    x = a * Y + b * Z
    h = 1e-6
    fd = torch.stack([(_cond_logpdf(x + h * e, Y, t) - _cond_logpdf(x - h * e, Y, t)) / (2 * h)
                      for e in torch.eye(2, dtype=torch.float64)], 1)
    assert torch.allclose(fd, conditional_score(Z, t, T), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", [0.1, 0.5, 0.9])
def test_conditional_dlogrho_finite_difference(t):
    g = set_seed(4)
    Y, Z = sample_g1(20, g), torch.randn(20, 2, generator=g, dtype=torch.float64)
    a, b, _, _ = ou_coefficients(t, T)
    x = a * Y + b * Z  # fixed x; differentiate the conditional density in t
    h = 1e-6
    fd = (_cond_logpdf(x, Y, t + h) - _cond_logpdf(x, Y, t - h)) / (2 * h)
    assert torch.allclose(fd, conditional_dlogrho(Y, Z, t, T), rtol=1e-5, atol=1e-4)


def test_time_grid_and_bandwidth():
    ts = time_grid(60, 1e-3)
    assert ts[0] == 0 and abs(float(ts[-1]) - (1 - 1e-3)) < 1e-12 and (ts.diff() > 0).all()
    tau = 1 - ts[1:]
    assert torch.allclose(tau[1:] / tau[:-1], tau[1:2] / tau[0:1].expand(1), rtol=1e-9)  # geometric
    assert abs(kernel_bandwidth(1.0, T, 0.3) - 0.3) < 1e-12
    assert abs(kernel_bandwidth(0.0, T, 0.3) - math.sqrt((1 - math.exp(-8)) * 0.36 + math.exp(-8) * 0.09)) < 1e-12


# ---------------------------------------------------------------- KRR (eq. 8)
def test_krr_matches_sklearn_kernel_ridge():
    g = set_seed(5)
    M, lam, h = 400, 1e-3, 0.6
    X = torch.randn(M, 2, generator=g, dtype=torch.float64)
    U = torch.randn(M, 2, generator=g, dtype=torch.float64)
    x = 2 * torch.randn(100, 2, generator=g, dtype=torch.float64)
    ours = krr_predict(x, X, krr_fit(X, U, h, lam), h)
    sk = KernelRidge(alpha=M * lam, kernel="rbf", gamma=1 / (2 * h * h)).fit(X.numpy(), U.numpy()).predict(x.numpy())
    assert torch.allclose(ours, torch.from_numpy(sk), atol=1e-6)


def test_rbf_kernel_brute_force():
    g = set_seed(6)
    x, y = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)
    brute = torch.tensor([[math.exp(-float(((a - b) ** 2).sum()) / (2 * 0.7 ** 2)) for b in y] for a in x],
                         dtype=torch.float64)
    assert torch.allclose(rbf_kernel(x, y, 0.7), brute, atol=1e-12)


# ---------------------------------------------------------------- Stein kernel (eqs. 2, 9)
def test_stein_gram_symmetric_psd():
    g = set_seed(7)
    x = torch.randn(300, 2, generator=g, dtype=torch.float64)
    s = torch.randn(300, 2, generator=g, dtype=torch.float64)  # arbitrary scores: k_S is PSD for any s
    KS = stein_gram(x, s, 0.8)
    assert torch.allclose(KS, KS.T, atol=1e-12)
    assert float(torch.linalg.eigvalsh(KS).min()) > -1e-8


def test_stein_gram_matches_autograd():
    g = set_seed(8)
    x = torch.randn(4, 2, generator=g, dtype=torch.float64)
    s = torch.randn(4, 2, generator=g, dtype=torch.float64)
    h = 0.9
    KS = stein_gram(x, s, h)

    def k(a, b):
        return torch.exp(-((a - b) ** 2).sum() / (2 * h * h))

    for i in range(4):
        for j in range(4):
            a = x[i].clone().requires_grad_(True)
            b = x[j].clone().requires_grad_(True)
            gx = torch.autograd.grad(k(a, b), a, create_graph=True)[0]
            gy = torch.autograd.grad(k(a, b), b, create_graph=True)[0]
            div = sum(torch.autograd.grad(gx[c], b, retain_graph=True)[0][c] for c in range(2))
            ref = div + gx @ s[j] + gy @ s[i] + k(a, b) * (s[i] @ s[j])
            assert abs(float(ref.detach()) - float(KS[i, j])) < 1e-10


def test_ksd_of_exact_gaussian_samples_vanishes():
    g = set_seed(9)
    x = torch.randn(2000, 2, generator=g, dtype=torch.float64)
    assert abs(ksd_u(x, -x, 1.0)) < 1e-2
    y = x + 0.5
    assert ksd_u(y, -y, 1.0) > 0.05  # wrong target: clearly positive


def test_stein_velocity_satisfies_the_fitted_stein_equation():
    "S_ρ v at the regression points equals K_S w (autograd divergence of eq. 9's velocity)."
    g = set_seed(10)
    M, h = 30, 0.8
    X = torch.randn(M, 2, generator=g, dtype=torch.float64)
    S = -X + 0.1 * torch.randn(M, 2, generator=g, dtype=torch.float64)
    r = torch.randn(M, generator=g, dtype=torch.float64)
    w = stein_fit(X, S, r, h, 1e-3)
    y = X.clone().requires_grad_(True)
    v = stein_predict(y, X, S, w, h)
    div = sum(torch.autograd.grad(v[:, c].sum(), y, retain_graph=True)[0][:, c] for c in range(2))
    sv = div + (v * S).sum(1)
    assert torch.allclose(sv.detach(), stein_gram(X, S, h) @ w, atol=1e-8)


# ---------------------------------------------------------------- exact velocity of a Gaussian target
def test_gaussian_exact_velocity_monte_carlo():
    "E[U | X_t] is affine: its slope and intercept match least squares on 10^6 OU pairs."
    g = set_seed(11)
    n, m, s, t = 1_000_000, 1.0, 0.5, 0.6
    Y = m + s * torch.randn(n, 1, generator=g, dtype=torch.float64)
    X, U = ou_pairs(Y, torch.randn(n, 1, generator=g, dtype=torch.float64), t, T)
    A = torch.cat([torch.ones(n, 1, dtype=torch.float64), X], 1)
    coef = torch.linalg.lstsq(A, U).solution[:, 0]
    grid = torch.tensor([[-1.0], [0.0], [1.0]], dtype=torch.float64)
    assert torch.allclose(coef[0] + coef[1] * grid[:, 0], gaussian_exact_velocity(grid, t, T, m, s)[:, 0], atol=5e-3)


def test_v1_matches_exact_gaussian_velocity_and_reports_v2():
    g = set_seed(12)
    Y = 1.0 + 0.5 * torch.randn(512, 1, generator=g, dtype=torch.float64)
    e1 = {t: velocity_rel_error(Y, t, 1.0, 0.5, reps=2, lam=1e-3, variant="v1", generator=g) for t in (0.3, 0.5, 0.8)}
    e2 = {t: velocity_rel_error(Y, t, 1.0, 0.5, reps=2, lam=1e-3, variant="v2", generator=g) for t in (0.3, 0.5, 0.8)}
    print("relative RMS velocity error V1", e1, "V2", e2)
    assert max(e1.values()) <= 0.10


# ---------------------------------------------------------------- transport, metrics, bad input
def test_same_seed_same_samples_and_seed_matters():
    Y = sample_ring(40, set_seed(13), **RING)
    a = stein_transport(Y, 60, K=6, reps=2, generator=set_seed(14))
    b = stein_transport(Y, 60, K=6, reps=2, generator=set_seed(14))
    c = stein_transport(Y, 60, K=6, reps=2, generator=set_seed(15))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_transport_reaches_a_gaussian_target():
    g = set_seed(16)
    Y = sample_g1(200, g)
    x = stein_transport(Y, 1000, K=30, reps=2, lam=1e-4, h0=0.25, generator=g)
    L = torch.tensor([[1.0, 0.0], [0.8, 0.6]], dtype=torch.float64)
    assert (x.mean(0) - torch.tensor([1.0, -2.0], dtype=torch.float64)).abs().max() < 0.3
    assert torch.linalg.norm(torch.cov(x.T) - L @ L.T) / torch.linalg.norm(L @ L.T) < 0.4


def test_metric_helpers():
    g = set_seed(17)
    train, fresh = sample_ring(64, g, **RING), sample_ring(500, g, **RING)
    assert memorisation_ratio(train, train, fresh) == 0.0
    assert 0.7 < memorisation_ratio(sample_ring(500, g, **RING), train, fresh) < 1.4
    assert abs(within_mode_rms(sample_ring(20000, g, **RING), ring_centres()) - 0.2) < 0.01


def test_rwm_chain_matches_the_grid_posterior():
    "A 2000-sample thinned RWM chain has its mean within 0.1 of the grid mean; the acceptance rate is returned."
    grid = banana_grid()
    x, acc = banana_rwm(2000, set_seed(21), return_rate=True)
    assert x.shape == (2000, 2)
    assert (x.mean(0) - grid["mean"]).abs().max() < 0.1
    assert 0.1 < acc < 0.9
    # thinned RWM draws sit inside the exact 99% HPD region about as often as exact draws
    assert in_hpd_fraction(x, grid) > 0.97
    with pytest.raises(ParameterError, match="thin"):
        banana_rwm(10, set_seed(0), thin=0)


def test_bootstrap_memoriser_has_ratio_zero_and_jittered_kde_does_not():
    g = set_seed(22)
    train, fresh = sample_ring(64, g, **RING), sample_ring(1000, g, **RING)
    boot = bootstrap_memoriser(train, 2000, g)
    assert memorisation_ratio(boot, train, fresh) == 0.0
    # every bootstrap sample is one of the training points (brute force)
    assert (boot[:, None, :] == train[None, :, :]).all(-1).any(1).all()  # exact copies (cdist's matmul form rounds to ~1e-8)
    assert memorisation_ratio(kde_bootstrap(train, 2000, 0.2, g), train, fresh) > 0.5


def test_moment_matched_gaussian_moments():
    g = set_seed(23)
    Y = sample_g1(300, g)
    x = moment_matched_gaussian(Y, 200_000, g)
    assert torch.allclose(x.mean(0), Y.mean(0), atol=0.01)
    assert torch.allclose(torch.cov(x.T), torch.cov(Y.T), atol=0.02)


def test_banana_grid_hpd_and_score():
    grid = banana_grid()
    x = banana_exact_samples(20000, grid, set_seed(18))
    assert abs(in_hpd_fraction(x, grid) - 0.99) < 0.005
    th = torch.randn(6, 2, generator=set_seed(19), dtype=torch.float64)
    fd = torch.stack([(banana_logpost(th + 1e-6 * e) - banana_logpost(th - 1e-6 * e)) / 2e-6
                      for e in torch.eye(2, dtype=torch.float64)], 1)
    assert torch.allclose(fd, banana_score(th), atol=1e-5)


@pytest.mark.parametrize("bad, name", [
    (dict(Y=torch.randn(2, 2)), "N (training-set size"),
    (dict(Y=torch.randn(3, 5)), "N (training-set size"),
    (dict(h0=-0.1), "h0"), (dict(h0=0.0), "h0"), (dict(lam=-1e-3), "lam"), (dict(lam=0.0), "lam"),
    (dict(T=0.0), "T"), (dict(K=0), "K"), (dict(eps=0.0), "eps"), (dict(reps=0), "reps"),
    (dict(variant="v3"), "variant"), (dict(n_samples=0), "n_samples"),
])
def test_bad_input_raises_before_any_solve(bad, name):
    kw = dict(Y=torch.randn(20, 2), n_samples=10, T=4.0, K=5, eps=1e-3, reps=2, h0=0.3, lam=1e-3, variant="v1")
    kw.update(bad)
    with pytest.raises(ParameterError, match=name.replace("(", r"\(")):
        stein_transport(kw.pop("Y"), kw.pop("n_samples"), **kw)


@pytest.mark.parametrize("override", [dict(lam=-1.0), dict(h0=0.0), dict(n_small=2), dict(K=0),
                                      dict(variant="v9"), dict(eps=1.5), dict(m_target=0), dict(g2_seeds=0),
                                      dict(banana_input="emcee"), dict(fm_max_steps=0), dict(fm_folds=1),
                                      dict(fm_folds=33), dict(fm_eval_every=501)])
def test_config_rejects_out_of_domain(override):
    name = next(iter(override))
    with pytest.raises(ParameterError, match=name):
        resolve(PRESETS, "smoke", **override)


def test_config_relations_between_fields():
    "The neural comparison reuses the first G2 seeds: g2_seeds < fm_seeds is refused, naming g2_seeds."
    with pytest.raises(ParameterError, match="g2_seeds"):
        resolve(PRESETS, "full", fm_seeds=8, g2_seeds=5)
    assert resolve(PRESETS, "full", fm_folds=32).fm_folds == 32  # n_small // 2: every fold keeps 2 held-out points


# ---------------------------------------------------------------- k-fold choice of the I-CFM's step count (C3)
@pytest.mark.parametrize("n, k", [(64, 4), (10, 3), (7, 7), (65, 4)])
def test_kfold_splits_partition_the_points(n, k):
    "Held-out folds partition range(n) (brute force), sizes differ by at most 1, train = complement of held-out."
    splits = kfold_splits(n, k, torch.Generator().manual_seed(3))
    assert len(splits) == k
    held = torch.cat([h for _, h in splits]).tolist()
    assert sorted(held) == list(range(n))
    sizes = [len(h) for _, h in splits]
    assert max(sizes) - min(sizes) <= 1
    for tr, h in splits:
        assert sorted(tr.tolist() + h.tolist()) == list(range(n))
        assert set(tr.tolist()).isdisjoint(h.tolist())


def test_kfold_splits_are_seeded_and_shuffled():
    a = kfold_splits(64, 4, torch.Generator().manual_seed(5))
    b = kfold_splits(64, 4, torch.Generator().manual_seed(5))
    c = kfold_splits(64, 4, torch.Generator().manual_seed(6))
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert any(not torch.equal(x[1], y[1]) for x, y in zip(a, c))
    assert a[0][1].tolist() != list(range(16))  # a permutation, not contiguous blocks


@pytest.mark.parametrize("best, every, want", [
    ([4000, 7000, 6000, 4000], 1000, 5000),  # mean 5250 -> nearest grid point
    ([3000, 3000, 4000, 4000], 1000, 4000),  # mean 3500: Python's round-half-even gives 4
    ([1000], 1000, 1000), ([250, 250], 1000, 1000),  # never below one evaluation interval
    ([250, 500, 750], 250, 500), ([16000] * 4, 1000, 16000),
])
def test_kfold_steps_is_the_mean_on_the_grid(best, every, want):
    got = kfold_steps(best, every)
    assert got == want and got % every == 0
    # brute force: the grid point nearest the mean (ties aside), at least one interval
    mean = sum(best) / len(best)
    assert abs(got - max(every, mean)) <= every / 2 + 1e-9


@pytest.mark.parametrize("call, name", [
    (lambda: kfold_splits(5, 1), "k"), (lambda: kfold_splits(5, 6), "k"),
    (lambda: kfold_steps([], 1000), "best_steps"), (lambda: kfold_steps([-1, 2000], 1000), "best_steps"),
    (lambda: kfold_steps([1000], 0), "every"),
])
def test_kfold_bad_input(call, name):
    with pytest.raises(ParameterError, match=name):
        call()
