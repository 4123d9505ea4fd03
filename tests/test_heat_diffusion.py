"""Unit tests for genlab.heat_diffusion against independent oracles (scipy expm / quadrature, Gaussian
conditioning, Monte Carlo, autograd, networkx)."""
import math

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
import torch
from torch import nn

from genlab.core import ParameterError, resolve, rng
from genlab.heat_diffusion import (PRESETS, PCAFD, FixedPairs, GaussianDenoiser, GCNDenoiser, MLPDenoiser, ResidualDenoiser,
                                   SnappedTSampler, TSampler,
                                   analytic_corr, check_laplacian, community_gap, denoising_error, digits_splits,
                                   empirical_corr, euler_maruyama, grid_adjacency, heat_loss, heat_process, laplacian,
                                   log_snr, matched_sigma2, rayleigh_quotient, sample_ancestral, sample_ode, sbm_graph,
                                   sbm_signals, spectral_power, spectral_power_error, train_denoiser)

torch.set_num_threads(1)


def rel_fro(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


@pytest.fixture(scope="module")
def grid():
    L = laplacian(grid_adjacency(8, 8))
    return L, heat_process(L, 0.5, 0.76)


def test_grid_laplacian_matches_networkx():
    nx = pytest.importorskip("networkx")
    G = nx.grid_2d_graph(8, 8)
    nodes = [(r, c) for r in range(8) for c in range(8)]
    Lnx = nx.laplacian_matrix(G, nodelist=nodes).toarray()
    assert np.array_equal(laplacian(grid_adjacency(8, 8)).numpy(), Lnx)
    Nnx = nx.normalized_laplacian_matrix(G, nodelist=nodes).toarray()
    assert np.allclose(laplacian(grid_adjacency(8, 8), "normalized").numpy(), Nnx, atol=1e-12)
    lam = np.linalg.eigvalsh(Lnx)
    assert abs(lam[0]) < 1e-10 and abs(lam[-1] - 7.70) < 0.01  # spec: λ ∈ [0, 7.70]


def test_eigendecomposition_reconstructs_and_convention(grid):
    L, hp = grid
    Lg = L + 0.5 * torch.eye(64, dtype=torch.float64)
    assert hp.U.dtype == torch.float64
    assert torch.allclose((hp.U * hp.kappa) @ hp.U.T, Lg, atol=1e-8)
    # U's columns are eigenvectors: X̂ = X U for row-major batches; a single eigenvector maps to e_i
    for i in (1, 7, 40):
        e = hp.to_spectral(hp.U[:, i][None])[0]
        assert torch.allclose(e, torch.eye(64, dtype=torch.float64)[i], atol=1e-10)
        assert torch.allclose(Lg @ hp.U[:, i], hp.kappa[i] * hp.U[:, i], atol=1e-10)
    x = torch.randn(5, 64, dtype=torch.float64)
    assert torch.allclose(hp.from_spectral(hp.to_spectral(x)), x, atol=1e-12)


def test_forward_kernel_matches_expm_and_quadrature(grid):
    L, hp = grid
    Lg = (L + 0.5 * torch.eye(64, dtype=torch.float64)).numpy()
    for s in (0.05, 0.5, 2.0):
        H, Sig = hp.forward_kernel(s)
        assert np.allclose(H.numpy(), scipy.linalg.expm(-s * Lg), atol=1e-10)
        # Σ_s = ∫_0^s 2σ² e^{-2u L_γ} du (variation of constants for dY = -L_γ Y ds + √2 σ dW)
        quad, _ = scipy.integrate.quad_vec(lambda u: 2 * 0.76 * scipy.linalg.expm(-2 * u * Lg), 0, s,
                                           epsabs=1e-12, epsrel=1e-10)
        assert np.allclose(Sig.numpy(), quad, atol=1e-8)


def test_endpoints_and_prior_covariance(grid):
    L, hp = grid
    a1, b1 = hp.coeffs(torch.tensor(1.0))
    assert torch.all(a1 == 1) and torch.all(b1 == 0)
    x1 = torch.randn(7, 64)
    xt, _ = hp.sample_xt(x1, torch.ones(7, dtype=torch.float64), torch.Generator().manual_seed(0))
    assert torch.allclose(xt, x1, atol=1e-6)
    a0, _ = hp.coeffs(torch.tensor(0.0))
    assert float(a0.max()) <= math.exp(-4) + 1e-12
    draws = hp.prior_sample(20000, torch.Generator().manual_seed(1))
    target = 0.76 * np.linalg.inv((L + 0.5 * torch.eye(64, dtype=torch.float64)).numpy())
    assert rel_fro(np.cov(draws.numpy().T), target) < 0.05


def test_warp_monotone_and_sdot_autograd(grid):
    _, hp = grid
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    s = hp.s(t)
    assert abs(float(s[0]) - hp.S) < 1e-12 and abs(float(s[-1])) < 1e-15
    assert torch.all(s[1:] < s[:-1])
    tg = t.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(hp.s(tg).sum(), tg)
    assert torch.allclose(grad, hp.s_dot(t), rtol=1e-10, atol=1e-12)
    assert torch.all(hp.s_dot(t) < 0)


def test_isotropic_case_is_scalar_ou():
    hp = heat_process(torch.zeros(16, 16, dtype=torch.float64), 1.0, 0.3, rho=6.0)
    assert torch.allclose(hp.kappa, torch.ones(16, dtype=torch.float64))
    assert hp.S == 4.0
    t = torch.linspace(0, 1, 11, dtype=torch.float64)
    a, b = hp.coeffs(t)
    s = 4.0 * (np.exp(6 * (1 - t.numpy())) - 1) / (np.exp(6) - 1)
    a_ou, b_ou = np.exp(-s), np.sqrt(0.3 * (1 - np.exp(-2 * s)))
    assert np.allclose(a.numpy(), a_ou[:, None], atol=1e-12) and np.allclose(b.numpy(), b_ou[:, None], atol=1e-12)
    H, Sig = hp.forward_kernel(0.7)
    assert torch.allclose(H, math.exp(-0.7) * torch.eye(16, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(Sig, 0.3 * (1 - math.exp(-1.4)) * torch.eye(16, dtype=torch.float64), atol=1e-12)


def test_forward_monte_carlo_moments(grid):
    _, hp = grid
    x1 = torch.linspace(-1, 1, 64).double()[None]
    t = 0.5
    xt, _ = hp.sample_xt(x1.expand(20000, -1), torch.full((20000,), t, dtype=torch.float64),
                         torch.Generator().manual_seed(2))
    H, Sig = hp.forward_kernel(float(hp.s(t)))
    assert float((xt.mean(0) - H @ x1[0]).abs().max()) < 0.03
    assert rel_fro(np.cov(xt.numpy().T), Sig.numpy()) < 0.06


def test_euler_maruyama_matches_closed_form(grid):
    L, hp = grid
    Lg = L + 0.5 * torch.eye(64, dtype=torch.float64)
    y0 = torch.linspace(-1, 1, 64).double()
    Y = euler_maruyama(Lg, 0.76, y0, 0.3, 2e-3, 8000, torch.Generator().manual_seed(3))
    H = scipy.linalg.expm(-0.3 * Lg.numpy())
    Sig = 0.76 * np.linalg.solve(Lg.numpy(), np.eye(64) - scipy.linalg.expm(-0.6 * Lg.numpy()))
    assert np.abs(Y.mean(0).numpy() - H @ y0.numpy()).max() < 0.04
    assert rel_fro(np.cov(Y.numpy().T), Sig) < 0.12


def test_bridge_matches_gaussian_conditioning(grid):
    _, hp = grid
    s_from, s_to = 0.8, 0.3
    c0, cs, v = hp.bridge(s_from, s_to)
    for i in (0, 3, 63):
        k, sig2, var0 = float(hp.kappa[i]), hp.sigma2, 2.0
        A1, A = math.exp(-k * s_to), math.exp(-k * s_from)
        V1 = sig2 / k * (1 - A1 ** 2)
        Vs = sig2 / k * (1 - A ** 2)
        # joint covariance of (y0, y_{s'}, y_s) from the OU solution; condition y_{s'} on (y0, y_s)
        C = np.array([[var0, A1 * var0, A * var0],
                      [A1 * var0, A1 ** 2 * var0 + V1, A1 * A * var0 + math.exp(-k * (s_from - s_to)) * V1],
                      [A * var0, A1 * A * var0 + math.exp(-k * (s_from - s_to)) * V1, A ** 2 * var0 + Vs]])
        idx = [0, 2]
        w = np.linalg.solve(C[np.ix_(idx, idx)], C[1, idx])
        var = C[1, 1] - C[1, idx] @ w
        assert np.allclose([c0[i], cs[i], v[i]], [w[0], w[1], var], rtol=1e-9, atol=1e-12)


def test_bridge_at_zero_returns_y0(grid):
    _, hp = grid
    c0, cs, v = hp.bridge(0.6, 0.0)
    assert torch.all(v == 0) and torch.all(c0 == 1) and torch.all(cs == 0)
    with pytest.raises(ParameterError):
        hp.bridge(0.3, 0.6)


def test_velocity_from_true_x1_is_conditional_velocity(grid):
    _, hp = grid
    g = torch.Generator().manual_seed(4)
    x1 = torch.randn(32, 64, generator=g, dtype=torch.float64)
    t = torch.rand(32, generator=g, dtype=torch.float64) * 0.99
    xt, xi = hp.sample_xt(x1, t, g)
    assert torch.allclose(hp.velocity(xt, x1, t), hp.cond_velocity(x1, xi, t), atol=1e-5)
    # and the conditional velocity is d/dt of the path (finite differences with fixed Ξ)
    h = 1e-6
    xp = hp.from_spectral(hp.coeffs(t + h)[0] * hp.to_spectral(x1) + hp.coeffs(t + h)[1] * xi)
    xm = hp.from_spectral(hp.coeffs(t - h)[0] * hp.to_spectral(x1) + hp.coeffs(t - h)[1] * xi)
    assert torch.allclose((xp - xm) / (2 * h), hp.cond_velocity(x1, xi, t), atol=1e-4, rtol=1e-5)


class OracleDenoiser(nn.Module):
    "Exact E[X_1 | X_t] for Gaussian data N(m, U diag(var) Uᵀ) (linear per mode)."

    def __init__(self, hp, m, var):
        super().__init__()
        self.hp, self.mh, self.var = hp, hp.to_spectral(m[None])[0], var

    def forward(self, xt, t):
        a, b = self.hp.coeffs(t.double())
        xh = self.hp.to_spectral(xt.double())
        gain = a * self.var / (a ** 2 * self.var + b ** 2)
        return self.hp.from_spectral(self.mh + gain * (xh - a * self.mh)).float()


@pytest.mark.parametrize("sampler", ["ode", "ancestral"])
def test_samplers_with_exact_denoiser_recover_gaussian_data(grid, sampler):
    _, hp = grid
    var = 0.2 / (1 + hp.lam)  # smooth Gaussian data in the graph basis
    m = torch.linspace(-0.5, 0.5, 64).double()
    model = OracleDenoiser(hp, m, var)
    g = torch.Generator().manual_seed(5)
    f = sample_ode if sampler == "ode" else sample_ancestral
    x = f(hp, model, 4000, 200, g)
    P = spectral_power(x, hp.U)
    assert float((P / var - 1).abs().mean()) < 0.08
    assert float((x.double().mean(0) - m).abs().max()) < 0.05


def test_matched_sigma2_and_metrics(grid):
    L, hp = grid
    x = torch.randn(3000, 64, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 0.5
    s2 = matched_sigma2(x, hp.kappa)
    assert abs(s2 * float((1 / hp.kappa).sum()) - float(x.var(0).sum())) < 1e-9
    # white noise: E R ≈ tr(L)/n; prior of the heat process is smoother
    assert abs(float(rayleigh_quotient(x, L).mean()) - float(L.trace() / 64)) < 0.05
    assert spectral_power_error(x, x, hp.U) == 0.0
    assert abs(spectral_power_error(2 * x, x, hp.U) - math.log(4)) < 1e-9
    corr = analytic_corr(hp, torch.ones(64, dtype=torch.float64), torch.tensor([0.0, 1.0]))
    assert torch.all(corr[1] == 1) and torch.all(corr[0] < 0.02)


def test_bad_input_raises():
    L = laplacian(grid_adjacency(3, 3))
    bad = L.clone(); bad[0, 1] += 0.5
    with pytest.raises(ParameterError, match="symmetric"):
        heat_process(bad, 0.5, 1.0)
    with pytest.raises(ParameterError, match="semi-definite"):
        check_laplacian(-L)
    with pytest.raises(ParameterError, match="square"):
        check_laplacian(torch.zeros(3, 4))
    with pytest.raises(ParameterError, match="gamma"):
        heat_process(L, 0.0, 1.0)
    with pytest.raises(ParameterError, match="sigma2"):
        heat_process(L, 0.5, -1.0)
    for kw, name in [(dict(gamma=-0.1), "gamma"), (dict(sigma=-1.0), "sigma"), (dict(n_steps=1), "n_steps"),
                     (dict(n_steps=5000), "n_steps"), (dict(sampler="sde"), "sampler"),
                     (dict(laplacian_kind="random"), "laplacian_kind"), (dict(rho=0.0), "rho"),
                     (dict(t_sampling="cosine"), "t_sampling"), (dict(section="e3"), "section"),
                     (dict(n_steps=7), "n_steps"), (dict(dstar_steps=(5, 10)), "dstar_steps"),
                     (dict(eval_steps=(1, 20)), "eval_steps"), (dict(min_rel_delta=2.0), "min_rel_delta")]:
        with pytest.raises(ParameterError, match=name):
            resolve(PRESETS, "smoke", **kw)
    full = resolve(PRESETS, "full")
    assert full.train_steps == 5000 and full.t_sampling == "logsnr" and set(full.sections) == {"closed_form", "e1", "e2", "decoder"}
    assert resolve(PRESETS, "full", section="e1").section == "e1"
    # the spec's budget is the floor: decoder arms at 3000 steps x batch 64, E2 at 4000 steps; C5a/b get the ~12-15 seeds they need
    assert full.dec_steps == 3000 and full.dec_batch == 64 and full.gcn_hidden == 64 and full.e2_train_steps == 4000
    assert full.n_seeds_e2 >= 12 and full.n_seeds_e1 >= 5 and full.n_seeds_dec >= 5


def test_networks_shapes_and_loss_gradient(grid):
    _, hp = grid
    A = grid_adjacency(8, 8)
    x = torch.randn(5, 64)
    t = torch.rand(5)
    for m in (MLPDenoiser(64, 32, 2, generator=rng(0, "init")), GCNDenoiser(A, 16, 2, generator=rng(0, "init"))):
        assert m(x, t).shape == (5, 64)
        loss = heat_loss(hp, m, x, torch.Generator().manual_seed(0))
        loss.backward()
        assert all(p.grad is not None for p in m.parameters())


def test_sbm_signals_structure():
    A, blocks = sbm_graph(seed=0)
    assert torch.equal(A, A.T) and float(A.diagonal().abs().sum()) == 0
    assert torch.linalg.eigvalsh(laplacian(A))[1] > 1e-8  # connected
    x = sbm_signals(A, blocks, 2000, torch.Generator().manual_seed(0))
    g = community_gap(x, blocks)
    assert 0.4 < float((g > 0).float().mean()) < 0.6
    assert abs(float(g.abs().mean()) - 2.0) < 0.3  # bimodal at about ±2μ


def test_logsnr_monotone_and_uniform_on_its_range(grid):
    L, hp = grid
    var = 0.3 / (1 + hp.lam)
    ts = TSampler(hp, var, "logsnr")
    lam = log_snr(hp, var, ts.tt)
    assert torch.all(lam[1:] > lam[:-1])
    t = ts(10_000, torch.Generator().manual_seed(0))
    assert float(t.min()) >= 0 and float(t.max()) <= 1 - 1e-3 + 1e-12
    u = (log_snr(hp, var, t) - lam[0]) / (lam[-1] - lam[0])  # the sampled λ, rescaled to [0, 1]
    import scipy.stats
    assert scipy.stats.kstest(u.numpy(), "uniform").pvalue > 0.01
    # the rule 'uniform' is t ~ U[0, 1]
    tu = TSampler(hp, var, "uniform")(10_000, torch.Generator().manual_seed(1))
    assert scipy.stats.kstest(tu.numpy(), "uniform").pvalue > 0.01
    with pytest.raises(ParameterError, match="t_sampling"):
        TSampler(hp, var, "cosine")


def test_logsnr_with_equal_rates_is_the_same_map_for_any_horizon():
    "All κ equal: λ depends on s alone, so λ → s(t(λ)) is one map whatever S is."
    var = torch.full((16,), 0.4, dtype=torch.float64)
    a = heat_process(torch.zeros(16, 16, dtype=torch.float64), 1.0, 0.4, S=4.0)
    b = heat_process(torch.zeros(16, 16, dtype=torch.float64), 1.0, 0.4, S=9.0)
    ta, tb = TSampler(a, var), TSampler(b, var)
    lam = torch.linspace(max(ta.lam[0], tb.lam[0]) + 0.1, min(ta.lam[-1], tb.lam[-1]) - 0.1, 50, dtype=torch.float64)
    sa, sb = a.s(ta.t_of_lambda(lam)), b.s(tb.t_of_lambda(lam))
    assert torch.allclose(sa, sb, rtol=2e-3, atol=1e-6)
    # and the closed form of the scalar OU: λ = log(e^{-2s} v / (σ²(1 - e^{-2s})))
    closed = torch.log(torch.exp(-2 * sa) * 0.4 / (0.4 * -torch.expm1(-2 * sa)))
    assert torch.allclose(closed, lam, atol=1e-2)


def test_exact_gaussian_denoiser_is_the_regression_of_x1_on_xt(grid):
    _, hp = grid
    g = torch.Generator().manual_seed(7)
    B = torch.randn(64, 64, generator=g, dtype=torch.float64) / 8
    C = B @ B.T + 0.05 * torch.eye(64, dtype=torch.float64)
    mu = torch.linspace(-0.5, 0.5, 64, dtype=torch.float64)
    D = GaussianDenoiser(hp, mu, C, ridge=0.0)
    n = 100_000
    x1 = mu + torch.randn(n, 64, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(C).T
    for t in (0.3, 0.7, 0.9):
        tt = torch.full((n,), t, dtype=torch.float64)
        xt, _ = hp.sample_xt(x1, tt, g)
        X = torch.cat([xt, torch.ones(n, 1, dtype=torch.float64)], 1)
        coef = torch.linalg.lstsq(X, x1).solution  # Monte-Carlo regression E[X_1 | X_t]
        probe, _ = hp.sample_xt(x1[:2000], tt[:2000], g)
        pred_mc = torch.cat([probe, torch.ones(2000, 1, dtype=torch.float64)], 1) @ coef
        pred = D(probe, tt[:2000])
        rel = float(torch.linalg.norm(pred - pred_mc) / torch.linalg.norm(pred - mu))
        if t >= 0.7:  # where X_t carries the signal, the regression pins E[X_1 | X_t] to well under 2%
            assert rel <= 0.02, (t, rel)
        # everywhere, the exact posterior mean is at least as good on fresh pairs as the fitted regression
        assert float(((pred - x1[:2000]) ** 2).mean()) <= float(((pred_mc - x1[:2000]) ** 2).mean()) + 1e-9
    x = torch.randn(5, 64, dtype=torch.float64)
    assert torch.allclose(D(x, torch.ones(5, dtype=torch.float64)), x, atol=1e-8)
    # a mixed batch of t values is handled per value
    tm = torch.tensor([0.3, 0.7, 0.3, 1.0, 0.7], dtype=torch.float64)
    mixed = D(x, tm)
    for i in range(5):
        assert torch.allclose(mixed[i], D(x[i:i + 1], tm[i:i + 1])[0], atol=1e-10)
    draws = GaussianDenoiser(hp, mu, C, ridge=0.0).sample(20_000, torch.Generator().manual_seed(8)).double()
    assert rel_fro(np.cov(draws.numpy().T), C.numpy()) < 0.05


def test_exact_denoiser_in_the_samplers_and_its_error_curve(grid):
    _, hp = grid
    var = 0.2 / (1 + hp.lam)
    m = torch.zeros(64, dtype=torch.float64)
    C = hp.U @ torch.diag(var) @ hp.U.T
    D = GaussianDenoiser(hp, m, C, ridge=0.0)
    x = sample_ode(hp, D, 4000, 200, torch.Generator().manual_seed(9))
    assert float((spectral_power(x, hp.U) / var - 1).abs().mean()) < 0.08
    x1 = D.sample(500, torch.Generator().manual_seed(10))
    t = torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
    err = denoising_error(hp, D, x1, t, generator=torch.Generator().manual_seed(11))
    assert torch.all(err[1:] <= err[:-1] + 1e-9) and float(err[-1]) < 1e-10
    # D*'s error is the posterior variance: the exact per-mode value for a diagonal spectral covariance
    a, b = hp.coeffs(t[1])
    post = var * b ** 2 / (a ** 2 * var + b ** 2)
    assert abs(float(err[1]) - float(post.mean())) < 0.05 * float(post.mean())


def test_fixed_pairs_and_training_with_stopping_keeps_the_best(grid):
    _, hp = grid
    g = torch.Generator().manual_seed(12)
    data = (0.3 * torch.randn(600, 64, generator=g)).float()
    var = spectral_power(data, hp.U)
    ts = TSampler(hp, var)
    val = FixedPairs(hp, data[:100], 300, ts, torch.Generator().manual_seed(13))
    m = MLPDenoiser(64, 32, 2, generator=rng(0, "init"))
    assert val(m) == val(m)  # a fixed draw: the same number at every evaluation
    tr = train_denoiser(hp, m, data[100:], steps=300, batch_size=64, generator=g, t_sampler=ts, val=val,
                        val_every=50, patience=2, min_rel_delta=0.02, ckpt_every=25, progress=False)
    mon = tr.monitor
    assert len(mon.values) >= 2 and abs(val(m) - min(mon.values)) < 1e-6  # the lowest held-out loss is kept
    assert tr.best_value == min(mon.values) and tr.best_step == mon.steps[int(np.argmin(mon.values))]
    assert set(tr.checkpoints) == {25, 50, 75}  # the first quarter of 300 steps
    early = tr.early(0.1)
    assert early.checkpoint_step == min(tr.checkpoints, key=lambda k: abs(k - 0.1 * tr.stop_step))
    assert val(early) > val(m)
    if mon.stopped:
        assert tr.stop_step < 300 and not tr.still_improving()
    # the plateau gap of the health checks: 0 once early stopping fired, else the monitor's relative drop over the last quarter
    gap = tr.plateau_gap()
    assert gap == (0.0 if mon.stopped else max(0.0, mon.relative_improvement()))
    assert (gap >= 0.02) == tr.still_improving(0.02)
    short = train_denoiser(hp, MLPDenoiser(64, 32, 2, generator=rng(0, "init")), data[100:], steps=10, batch_size=64,
                           generator=g, t_sampler=ts, val=val, val_every=50, patience=None, progress=False)
    assert len(short.monitor.values) < 2 and short.plateau_gap() == 1.0  # no plateau can be seen from one evaluation


def test_digits_splits_are_stratified_disjoint_and_sized():
    sp = digits_splits()
    assert {k: len(v[0]) for k, v in sp.items()} == {"train": 1350, "val": 150, "test": 297}
    rows = {k: {tuple(r) for r in v[0].numpy().round(4).tolist()} for k, v in sp.items()}
    assert float(sp["train"][0].min()) >= -1 and float(sp["train"][0].max()) <= 1
    counts = np.bincount(sp["test"][1].numpy(), minlength=10)
    assert counts.min() >= 28 and counts.max() <= 31  # stratified: about 29.7 per class
    x_all = torch.cat([v[0] for v in sp.values()])
    assert len(x_all) == 1797
    assert sp["train"][0].shape[1] == 64


def test_pca_frechet_distance_against_a_direct_computation():
    g = torch.Generator().manual_seed(14)
    a = torch.randn(3000, 10, generator=g, dtype=torch.float64)
    b = torch.randn(3000, 10, generator=g, dtype=torch.float64) * 1.5 + 0.3
    fd = PCAFD(a, a, n_components=10)
    assert fd(a) < 1e-8
    # with all components kept the PCA is a rotation (+ shift): FD is that of the raw Gaussians
    ma, mb = a.mean(0).numpy(), b.mean(0).numpy()
    Ca, Cb = np.cov(a.numpy().T), np.cov(b.numpy().T)
    s = scipy.linalg.sqrtm(Ca @ Cb).real
    direct = float(((ma - mb) ** 2).sum() + np.trace(Ca + Cb - 2 * s))
    assert abs(fd(b) - direct) < 1e-3 * direct


def test_empirical_corr_matches_analytic(grid):
    _, hp = grid
    g = torch.Generator().manual_seed(15)
    var = 0.2 / (1 + hp.lam)
    x1 = (torch.randn(20000, 64, generator=g, dtype=torch.float64) * var.sqrt()) @ hp.U.T
    ce = empirical_corr(hp, x1, 0.5, hp.U, g)
    ca = analytic_corr(hp, var, torch.tensor(0.5, dtype=torch.float64))
    assert float((ce - ca).abs().max()) < 0.03


def test_residual_denoiser_skip_is_exact_on_the_tabulated_grid(grid):
    _, hp = grid
    g = torch.Generator().manual_seed(16)
    x = (0.4 * torch.randn(400, 64, generator=g)).float()
    D = GaussianDenoiser.fit(hp, x)
    tgrid = torch.linspace(0, 1 - 1e-3, 101, dtype=torch.float64)
    ts = SnappedTSampler(TSampler(hp, spectral_power(x, hp.U)), tgrid)
    t = ts(64, g)
    assert bool(torch.isin(t, tgrid).all())
    R = ResidualDenoiser(MLPDenoiser(64, 16, 1, generator=rng(0, "init")), D, tgrid)
    xt, _ = hp.sample_xt(x[:64], t, g)
    assert torch.allclose(R.skip(xt, t), D(xt, t), atol=1e-4)  # the float32 table against the float64 solve
    off = t * 0.999  # off-grid t values take the exact batched path
    assert torch.allclose(R.skip(xt, off), D(xt, off), atol=1e-6)
    assert torch.allclose(R(x[:5], torch.ones(5)), x[:5], atol=1e-5)  # c(1) = 0 and D*(x, 1) = x
    loss = heat_loss(hp, R, x[:64], g, ts)
    loss.backward()
    assert all(p.grad is not None for p in R.net.parameters()) and len(list(R.parameters())) == len(list(R.net.parameters()))


def test_denoisers_initialised_from_the_generator():
    from genlab.core import rng
    A = grid_adjacency(4, 4)
    for make in (lambda g: MLPDenoiser(16, 32, 2, generator=g), lambda g: GCNDenoiser(A, 8, 2, head_hidden=16, generator=g)):
        a, b, c = make(rng(0, "init")), make(rng(0, "init")), make(rng(1, "init"))
        assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
        assert any(not torch.equal(p, q) for p, q in zip(a.state_dict().values(), c.state_dict().values()))
