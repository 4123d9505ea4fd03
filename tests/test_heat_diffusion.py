"""Unit tests for genlab.heat_diffusion against independent oracles (scipy expm / quadrature, Gaussian
conditioning, Monte Carlo, autograd, networkx)."""
import math

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
import torch
from torch import nn

from genlab.core import ParameterError, resolve
from genlab.heat_diffusion import (PRESETS, GCNDenoiser, MLPDenoiser, analytic_corr, check_laplacian,
                                   community_gap, euler_maruyama, grid_adjacency, heat_loss, heat_process,
                                   laplacian, matched_sigma2, rayleigh_quotient, sample_ancestral, sample_ode,
                                   sbm_graph, sbm_signals, spectral_power, spectral_power_error)

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
                     (dict(laplacian_kind="random"), "laplacian_kind"), (dict(rho=0.0), "rho")]:
        with pytest.raises(ParameterError, match=name):
            resolve(PRESETS, "smoke", **kw)
    assert resolve(PRESETS, "full").train_steps == 5000


def test_networks_shapes_and_loss_gradient(grid):
    _, hp = grid
    A = grid_adjacency(8, 8)
    x = torch.randn(5, 64)
    t = torch.rand(5)
    for m in (MLPDenoiser(64, 32, 2), GCNDenoiser(A, 16, 2)):
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
