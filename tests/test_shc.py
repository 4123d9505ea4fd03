"""Unit tests for genlab.shc: spectral-sphere residual matrices, Sinkhorn-Knopp (cross-checked with POT),
the HyperConnection module and its bad-input errors."""
import math
import warnings

import numpy as np
import pytest
import torch

from genlab.core import ParameterError, resolve
from genlab.shc import (PRESETS, HyperConnection, HyperGPT, amax, birkhoff_floor, cayley, compose,
                        draw_residual_matrices, helmert_basis, matched_mlp_hidden, offdiag_mass, res_grad_norms,
                        shc_matrix, sigma2, sinkhorn_log, skew, small_inv)

torch.set_num_threads(1)
D = torch.float64


def _draws(count=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    zU = 3 * torch.randn(count, 3, generator=g, dtype=D)       # skew params ~ N(0, 3^2)
    zV = 3 * torch.randn(count, 3, generator=g, dtype=D)
    sig = torch.tanh(5 * torch.randn(count, 3, generator=g, dtype=D))  # sigma-logits ~ N(0, 5^2)
    return zU, zV, sig


def test_helmert_basis():
    for n in (2, 3, 4, 8):
        U = helmert_basis(n, D)
        assert U.shape == (n, n - 1)
        assert torch.allclose(U.T @ U, torch.eye(n - 1, dtype=D), atol=1e-12)
        assert U.T.sum(1).abs().max() < 1e-12
    U4 = helmert_basis(4, D)
    assert torch.allclose(U4[:, 2], torch.tensor([1, 1, 1, -3], dtype=D) / math.sqrt(12))


def test_shc_on_the_sphere_for_extreme_parameters():
    zU, zV, sig = _draws()
    H = shc_matrix(zU, zV, sig)
    assert (torch.linalg.matrix_norm(H, 2) - 1).abs().max() < 1e-5
    assert (H.sum(-1) - 1).abs().max() < 1e-5 and (H.sum(-2) - 1).abs().max() < 1e-5
    Q = cayley(skew(zU, 3))
    assert (Q.transpose(-1, -2) @ Q - torch.eye(3, dtype=D)).abs().max() < 1e-5
    assert (torch.linalg.det(Q) - 1).abs().max() < 1e-8
    assert bool((H < 0).flatten(1).any(1).any())             # some draws have negative entries
    # singular values are {1} U {|sigma_i|} (oracle: numpy SVD)
    s = np.sort(np.linalg.svd(H.numpy(), compute_uv=False), -1)
    expect = np.sort(np.concatenate([np.ones((len(sig), 1)), sig.abs().numpy()], 1), -1)
    assert np.allclose(s, expect, atol=1e-10)
    # float32 too
    H32 = shc_matrix(zU.float(), zV.float(), sig.float())
    assert (torch.linalg.matrix_norm(H32.double(), 2) - 1).abs().max() < 1e-5


def test_broken_builds_fail_the_checks():
    zU, zV, sig = _draws(50)
    unsquashed = shc_matrix(zU, zV, 5 * sig)                  # sigma not squashed -> off the sphere
    assert (torch.linalg.matrix_norm(unsquashed, 2) - 1).abs().max() > 1e-2
    U = helmert_basis(4, D)
    wrong = U + 0.1                                            # a basis not orthogonal to 1
    E = cayley(skew(zU, 3)) @ torch.diag_embed(sig) @ cayley(skew(zV, 3)).transpose(-1, -2)
    Hw = 0.25 + wrong @ E @ wrong.T
    assert (Hw.sum(-1) - 1).abs().max() > 1e-2


def test_shc_init_is_identity_and_orientation():
    m = HyperConnection(4, 8, "shc", layer_index=2)
    H0 = m.res_matrix(torch.zeros(m.n_res)).detach()
    assert (H0 - torch.eye(4)).abs().max() < 2e-3
    with torch.no_grad():
        m.static_U.copy_(torch.tensor([0.7, -0.3, 0.5]))
    H = m.res_matrix(torch.zeros(m.n_res)).detach()
    X = torch.randn(2, 3, 4, 8, generator=torch.Generator().manual_seed(0))
    out = m(X, lambda u: torch.zeros_like(u))
    assert torch.allclose(out, torch.einsum("st,bksc->bktc", H, X), atol=1e-6)
    assert not torch.allclose(out, torch.einsum("ts,bksc->bktc", H, X), atol=1e-3)
    # pre weights: sigma(+1) at stream k = layer_index mod n, sigma(-1) elsewhere
    y = {}
    m(X, lambda u: y.setdefault("u", u) * 0)
    a = torch.sigmoid(torch.tensor([-1.0, -1.0, 1.0, -1.0]))
    assert torch.allclose(y["u"], (a[:, None] * X).sum(-2), atol=1e-5)


def test_shc_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(1)
    zU = torch.randn(3, 3, generator=g, dtype=D, requires_grad=True)
    zV = torch.randn(3, 3, generator=g, dtype=D, requires_grad=True)
    sig = torch.tanh(torch.randn(3, 3, generator=g, dtype=D)).requires_grad_()
    assert torch.autograd.gradcheck(shc_matrix, (zU, zV, sig))


def test_small_inv_against_numpy():
    g = torch.Generator().manual_seed(2)
    for m in (1, 2, 3, 5):
        M = torch.randn(20, m, m, generator=g, dtype=D) + 3 * torch.eye(m, dtype=D)
        assert np.allclose(small_inv(M).numpy(), np.linalg.inv(M.numpy()), atol=1e-10)


def test_products_stay_on_the_sphere():
    zU, zV, sig = _draws(64, seed=3)
    Hs = list(shc_matrix(zU, zV, sig).unbind(0))
    P = compose(Hs)
    assert abs(float(torch.linalg.matrix_norm(P, 2)) - 1) < 1e-8
    assert float(amax(P)) <= 2.0 + 1e-9                       # bounded by sqrt(n)
    U = helmert_basis(4, D)
    E = torch.eye(3, dtype=D)
    for H in Hs:
        E = (U.T @ H.T @ U) @ E
    assert torch.allclose(P, 0.25 + U @ E @ U.T, atol=1e-10)


def test_sinkhorn_at_mhc_init_and_exactness():
    L = torch.full((4, 4), -8.0, dtype=D).fill_diagonal_(0.0)
    H = sinkhorn_log(L, 20)
    off = H[~torch.eye(4, dtype=torch.bool)]
    assert abs(float(off.max()) - 3.4e-4) < 0.2e-4
    assert bool((H >= 0).all()) and (H.sum(-1) - 1).abs().max() < 1e-6
    g = torch.Generator().manual_seed(4)
    H1 = sinkhorn_log(torch.randn(500, 4, 4, generator=g, dtype=D), 20)
    assert (H1.sum(-1) - 1).abs().max() < 1e-6 and (H1.sum(-2) - 1).abs().max() < 1e-3
    # limitation 3: with logits ~ N(0, 4^2) finite SK is visibly inexact, sHC on the same scale is not
    H4 = sinkhorn_log(4 * torch.randn(2000, 4, 4, generator=g, dtype=D), 20)
    assert float((H4.sum(-2) - 1).abs().max()) > 1e-2
    assert float(torch.linalg.matrix_norm(H4, 2).max()) > 1.0 + 1e-3
    zU, zV = 4 * torch.randn(2000, 3, generator=g, dtype=D), 4 * torch.randn(2000, 3, generator=g, dtype=D)
    Hs = shc_matrix(zU, zV, torch.tanh(4 * torch.randn(2000, 3, generator=g, dtype=D)))
    assert (Hs.sum(-2) - 1).abs().max() < 1e-5 and (torch.linalg.matrix_norm(Hs, 2) - 1).abs().max() < 1e-5


def test_sinkhorn_matches_pot():
    ot = pytest.importorskip("ot")
    g = torch.Generator().manual_seed(5)
    u = np.full(4, 0.25)
    for _ in range(5):
        L = 2 * torch.randn(4, 4, generator=g, dtype=D)
        for iters in (1, 3, 20):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = ot.sinkhorn(u, u, -L.numpy(), reg=1.0, numItermax=iters, stopThr=0.0)
            assert np.allclose(sinkhorn_log(L, iters).numpy(), 4 * plan, atol=1e-10), iters
        conv = ot.bregman.sinkhorn_log(u, u, -L.numpy(), reg=1.0, numItermax=5000, stopThr=1e-14)
        assert np.allclose(sinkhorn_log(L, 500).numpy(), 4 * conv, atol=1e-8)


def test_birkhoff_floor():
    T_ds = 0.5 * np.eye(4) + 0.125
    assert birkhoff_floor(T_ds) < 1e-10
    P = np.eye(4)[[2, 0, 3, 1]]
    assert birkhoff_floor(P) < 1e-10
    # a non-DS target: the floor is no more than the distance to J and to any DS matrix
    T = P + 0.3 * (np.eye(4) - 0.25)                         # rows/cols sum 1, some entries negative
    f = birkhoff_floor(T)
    assert 0 < f <= ((T - 0.25) ** 2).sum() / 4 + 1e-12 and f <= ((T - P) ** 2).sum() / 4 + 1e-12


def test_depth_families():
    g = torch.Generator().manual_seed(6)
    Hs = draw_residual_matrices("shc", 64, 0.5, 10, generator=g)
    P = compose(list(Hs.unbind(1)))
    assert (torch.linalg.matrix_norm(P, 2) - 1).abs().max() < 1e-10
    Hm = draw_residual_matrices("mhc_mixing", 64, 0.5, 10, generator=g)
    assert float(sigma2(compose(list(Hm.unbind(1)))).max()) < 1e-3
    Hi = draw_residual_matrices("mhc_identity", 64, 0.5, 10, generator=g)
    assert float(offdiag_mass(Hi).mean()) < 0.01
    with pytest.raises(ParameterError, match="mhc_identity"):
        draw_residual_matrices("dshc", 4, 0.5, 2, generator=g)


def test_hypergpt_variants_and_streams():
    for v in ("residual", "hc", "mhc", "mhc_mixing", "shc"):
        for n in (1, 2, 4):
            torch.manual_seed(0)
            m = HyperGPT(11, variant=v, n_streams=n, n_layer=2, d_model=16, n_heads=2, max_len=8)
            logits = m(torch.randint(0, 11, (2, 8)), keep=True)
            assert logits.shape == (2, 8, 11) and torch.isfinite(logits).all()
    # the core weights are identical across variants (same seed)
    torch.manual_seed(0); a = HyperGPT(11, variant="mhc", n_layer=1, d_model=16, n_heads=2, max_len=8)
    torch.manual_seed(0); b = HyperGPT(11, variant="shc", n_layer=1, d_model=16, n_heads=2, max_len=8)
    assert torch.equal(a.tok_emb.weight, b.tok_emb.weight) and torch.equal(a.branches[1].fc.weight, b.branches[1].fc.weight)


def test_bad_input_names_the_allowed_values():
    with pytest.raises(ParameterError, match="residual.*hc.*mhc.*shc"):
        HyperConnection(4, 8, "dshc")
    with pytest.raises(ParameterError, match="n_streams"):
        HyperConnection(0, 8, "shc")
    with pytest.raises(ParameterError, match="n_streams"):
        resolve(PRESETS, "smoke", n_streams=0)
    with pytest.raises(ParameterError, match="n_layer"):
        resolve(PRESETS, "smoke", n_layer=0)
    with pytest.raises(ParameterError, match="e2_layers"):
        resolve(PRESETS, "smoke", e2_layers=0)
    with pytest.raises(ParameterError, match="'residual', 'hc', 'mhc', 'mhc_mixing', 'shc'"):
        resolve(PRESETS, "smoke", variants=("shc", "dshc"))
    with pytest.raises(ParameterError, match="n_layer"):
        HyperGPT(11, variant="shc", n_layer=0)
    with pytest.raises(ParameterError, match="unknown preset"):
        resolve(PRESETS, "huge")


def _perturbed(variant, n=4, C=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = HyperConnection(n, C, variant, layer_index=1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


@pytest.mark.parametrize("variant", ["hc", "mhc", "mhc_mixing", "shc"])
def test_fused_forward_equals_the_two_step_formulation(variant):
    "The one-einsum forward ([a_pre | H] contracted with X) equals a_pre^T X into the branch and H^T X + b y, values and gradients."
    m = _perturbed(variant)
    lin = torch.nn.Linear(8, 8)
    X = torch.randn(2, 5, 4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = m(X, lin)
    gx, = torch.autograd.grad(out.square().sum(), X)
    # two-step reference from the module's own coefficients
    v = X.flatten(-2)
    xbar = torch.nn.functional.normalize(v, dim=-1, eps=1e-6) * math.sqrt(v.shape[-1]) * (1 + m.norm_gain)
    r = m.dynamic(xbar)
    if variant == "hc":
        a = m.static_pre + m.scale_pre * torch.tanh(r[..., :4]); b = m.static_post + m.scale_post * torch.tanh(r[..., 4:8])
    else:
        a = torch.sigmoid(m.scale_pre * r[..., :4] + m.static_pre); b = 2 * torch.sigmoid(m.scale_post * r[..., 4:8] + m.static_post)
    H = m.res_matrix(r[..., 8:])
    ref = torch.einsum("...st,...sc->...tc", H, X) + b[..., None] * lin((a[..., None] * X).sum(-2))[..., None, :]
    gref, = torch.autograd.grad(ref.square().sum(), X)
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(gx, gref, atol=1e-4)


def test_mhc_mixing_control_starts_at_J_and_mhc_at_I():
    J = torch.full((4, 4), 0.25)
    assert torch.allclose(HyperConnection(4, 8, "mhc_mixing").res_matrix(torch.zeros(16)), J, atol=1e-6)
    assert torch.allclose(HyperConnection(4, 8, "mhc").res_matrix(torch.zeros(16)), torch.eye(4), atol=2e-3)


def test_residual_baseline_is_parameter_matched():
    arch = dict(n_layer=2, d_model=16, n_heads=2, max_len=8)
    target = sum(p.numel() for p in HyperGPT(11, variant="shc", n_streams=4, **arch).parameters())
    h = matched_mlp_hidden(11, target, **arch)
    got = sum(p.numel() for p in HyperGPT(11, variant="residual", mlp_hidden=h, **arch).parameters())
    assert h > 4 * 16 and abs(got / target - 1) <= 0.02


def test_first_and_last_sublayers_get_no_gradient_on_H_in_shc():
    "Identical input streams with unit column sums, and the output sum with unit row sums, remove H: zero gradient."
    torch.manual_seed(0)
    m = HyperGPT(11, variant="shc", n_streams=4, n_layer=2, d_model=16, n_heads=2, max_len=8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move away from the identity init so every sublayer is generic
        for mix in m.mixers:
            mix.static_U.add_(torch.randn(mix.static_U.shape, generator=g))
            mix.dynamic.weight.add_(0.05 * torch.randn(mix.dynamic.weight.shape, generator=g))
    gn = res_grad_norms(m, torch.randint(0, 11, (4, 9), generator=g))
    inner = max(gn[1:-1])
    assert inner > 1e-5 and gn[0] < 1e-4 * inner and gn[-1] < 1e-4 * inner, gn
