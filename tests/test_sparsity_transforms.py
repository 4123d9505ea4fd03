"""Unit tests for genlab.sparsity_transforms with independent oracles (hand computations, brute-force loops,
numpy/scipy closed forms)."""
import itertools
import math

import numpy as np
import pytest
import torch

from genlab.core import ParameterError, resolve
from genlab.lm import CharTokenizer, tinygpt_handle
from genlab.sparsity_transforms import (PRESETS, TRANSFORMS, apply_transform, block_excess, block_gains, block_hadamard,
                                        calibration_stats,
                                        cayley_rotation, check_layers, degrid, distinct_per_block, greedy_24_columns,
                                        haar_orthogonal, jaccard_stats, magnitude_mask, numerical_rank, q41_roundtrip,
                                        random_mask, spectrum_stats, structure, structured_wanda_mask, wanda_mask)


def _brute_wanda(W, xn, s):
    m, n = W.shape
    k = int(math.floor(s * n))
    keep = np.ones((m, n), bool)
    for i in range(m):
        order = sorted(range(n), key=lambda j: (abs(W[i, j]) * xn[j], j))
        keep[i, order[:k]] = False
    return keep


def test_wanda_against_hand_computation():
    W = torch.tensor([[1.0, -3.0, 2.0, 0.5], [4.0, 1.0, -1.0, 2.0]])
    keep = wanda_mask(W, torch.tensor([1.0, 1.0, 10.0, 1.0]), 0.5)   # scores [1, 3, 20, .5] and [4, 1, 10, 2]
    assert keep.tolist() == [[False, True, True, False], [True, False, True, False]]


@pytest.mark.parametrize("s", [0.0, 0.25, 0.5, 0.7])
def test_wanda_against_brute_force_and_properties(s):
    g = torch.Generator().manual_seed(1)
    W = torch.randn(13, 24, generator=g)
    W[0, :6] = 0.5                                   # ties: broken by column index
    xn = torch.rand(24, generator=g) + 0.1
    keep = wanda_mask(W, xn, s)
    assert (keep.numpy() == _brute_wanda(W.double().numpy(), xn.double().numpy(), s)).all()
    assert ((~keep).sum(1) == int(math.floor(s * 24))).all()
    assert (wanda_mask(W, 7.3 * xn, s) == keep).all()                       # invariant to scaling X by c > 0
    assert (wanda_mask(W, torch.ones(24), s) == magnitude_mask(W, s)).all()  # ||X_j|| = 1: magnitude pruning


def test_ties_pruned_in_column_order():
    keep = wanda_mask(torch.ones(3, 8), torch.ones(8), 0.5)
    assert (~keep[:, :4]).all() and keep[:, 4:].all()


def test_bad_input_raises_before_work():
    W = torch.randn(4, 8)
    for s in (1.0, -0.1, 1.5):
        with pytest.raises(ParameterError, match="sparsity"):
            wanda_mask(W, None, s)
    with pytest.raises(ParameterError, match="transform"):
        apply_transform("fourier", np.eye(4), rng=np.random.default_rng(0))
    with pytest.raises(ParameterError, match="layer"):
        check_layers((0, 30), 30)
    with pytest.raises(ParameterError, match="smol_layers"):
        resolve(PRESETS, "smoke", smol_layers=(31,))
    with pytest.raises(ParameterError, match="sparsity"):
        resolve(PRESETS, "smoke", sparsity=1.0)
    with pytest.raises(ParameterError, match="transforms"):
        resolve(PRESETS, "smoke", transforms=("rot_right", "wavelet"))
    with pytest.raises(ParameterError, match="xnorm"):
        wanda_mask(W, torch.ones(4), 0.5)


def _brute_structure(A, eps):
    Z = np.abs(A) <= eps * np.abs(A).max()
    m, n = Z.shape
    zr = [i for i in range(m) if Z[i].all()]
    zc = [j for j in range(n) if Z[:, j].all()]
    S = sum(1 for i in range(m) for j in range(n) if i in zr or j in zc) / (m * n)
    n24 = [Z[i, 4 * g:4 * g + 4].sum() >= 2 for i in range(m) for g in range(n // 4)]
    tiles = [Z[a:a + 4, b:b + 4].all() for a in range(0, m - 3, 4) for b in range(0, n - 3, 4)]
    return S, len(zr) + len(zc), np.mean(n24), np.mean(tiles)


def test_structure_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(5):
        A = rng.standard_normal((12, 16)) * (rng.random((12, 16)) < 0.4)
        A[rng.integers(12)] = 0
        A[:, rng.integers(16)] = 0
        A[:4, :4] = 0
        st = structure(A)
        S, rem, n24, t4 = _brute_structure(A, 1e-6)
        assert math.isclose(st["S"], S) and st["removable"] == rem
        assert math.isclose(st["z_24"], n24) and math.isclose(st["z_blk4"], t4)


def test_factor_removable_dims():
    F1 = np.array([[1.0, 0, 2], [0, 0, 0], [3, 0, 4]])      # zero row 1 (output), zero column 1 (inner)
    F2 = np.array([[1.0, 2, 0], [5, 6, 0], [0, 0, 0]])      # zero row 2 (inner), zero column 2 (input)
    assert structure([F1, F2])["removable"] == 1 + 2 + 1


def test_transforms_are_exact():
    rng = np.random.default_rng(3)
    W = rng.standard_normal((32, 16)) * (rng.random((32, 16)) < 0.5)
    sv = np.linalg.svd(W, compute_uv=False)
    for t, fam in TRANSFORMS.items():
        f = apply_transform(t, W, rng=rng, gram=np.cov(rng.standard_normal((100, 16)).T), opt_steps=20, swaps=100)
        if fam == "decomposition":
            assert len(f) == 2 and np.allclose(f[0] @ f[1], W, atol=1e-10), t
        else:
            assert len(f) == 1 and np.allclose(np.linalg.svd(f[0], compute_uv=False), sv, atol=1e-8), t
        if fam == "permutation":
            assert np.array_equal(np.sort(f[0].ravel()), np.sort(W.ravel())), t


def test_rotations_orthogonal():
    rng = np.random.default_rng(0)
    for n in (64, 576, 1536):
        H = block_hadamard(n, rng)
        assert np.allclose(H @ H.T, np.eye(n), atol=1e-10)
    Q = haar_orthogonal(50, rng)
    assert np.allclose(Q.T @ Q, np.eye(50), atol=1e-10)
    Qc = cayley_rotation(rng.standard_normal((20, 12)), 30, rng)
    assert np.allclose(Qc.T @ Qc, np.eye(12), atol=1e-10)


def test_cayley_rotation_lowers_l1():
    rng = np.random.default_rng(1)
    B = rng.standard_normal((40, 16)) * (rng.random((40, 16)) < 0.3)
    W = B @ haar_orthogonal(16, rng)
    Q = cayley_rotation(W, 200, rng)
    assert np.abs(W @ Q).sum() < np.abs(W).sum()


def test_permutation_undone_by_its_inverse():
    rng = np.random.default_rng(2)
    Z = rng.random((16, 24)) < 0.5
    order = greedy_24_columns(Z, 500, rng)
    assert sorted(order.tolist()) == list(range(24))
    assert np.array_equal(Z[:, order][:, np.argsort(order)], Z)                  # the inverse permutation undoes it
    before = (Z.reshape(16, 6, 4).sum(2) >= 2).mean()
    after = (Z[:, order].reshape(16, 6, 4).sum(2) >= 2).mean()
    assert after >= before
    W = rng.standard_normal((16, 24)) * Z
    once = apply_transform("perm_row_sort", W, rng=rng)[0]
    assert np.array_equal(apply_transform("perm_row_sort", once, rng=rng)[0], once)   # sorting a sorted matrix: identity


def test_qr_of_tall_matrix_creates_the_same_structure_dense_and_pruned():
    rng = np.random.default_rng(4)
    W = rng.standard_normal((48, 16))
    Ws = W * wanda_mask(torch.from_numpy(W), torch.ones(16), 0.5).numpy()
    sd, sp = structure(apply_transform("qr", W, rng=rng)), structure(apply_transform("qr", Ws, rng=rng))
    assert sd["removable"] == sp["removable"] == 48 - 16 and math.isclose(sd["S"], sp["S"])


def test_rank_formula_tall_and_wide():
    rng = np.random.default_rng(5)
    for m, n in ((40, 16), (16, 40)):
        W = rng.standard_normal((m, n))
        assert numerical_rank(W) == np.linalg.matrix_rank(W) == min(m, n)
        xn = np.ones(n); xn[3] = 1e-9                                         # a dead input channel
        keep = wanda_mask(torch.from_numpy(W), torch.from_numpy(xn), 0.5).numpy()
        assert (~keep[:, 3]).all()
        assert numerical_rank(W * keep) == min(m, n - 1)


def test_jaccard_against_brute_force():
    rng = np.random.default_rng(6)
    P = np.zeros((10, 12), bool)
    for i in range(10):
        P[i, rng.permutation(12)[:6]] = True
    J = np.array([[len(set(np.where(P[i])[0]) & set(np.where(P[j])[0])) / len(set(np.where(P[i])[0]) | set(np.where(P[j])[0]))
                   for j in range(10)] for i in range(10)])
    off = ~np.eye(10, dtype=bool)
    st = jaccard_stats(P, 0.5)
    J0 = 1 / 3
    assert math.isclose(st["jbar"], J[off].mean(), rel_tol=1e-6)
    assert math.isclose(st["kappa"], (J[off].mean() - J0) / (1 - J0), rel_tol=1e-5)
    assert math.isclose(st["kappa_nn"], (np.where(off, J, -1).max(1).mean() - J0) / (1 - J0), rel_tol=1e-5)


def test_independent_masks_have_jaccard_j0():
    g = torch.Generator().manual_seed(0)
    for s in (0.3, 0.5):
        st = jaccard_stats((~random_mask(300, 400, s, g)).numpy(), s)
        assert abs(st["jbar"] - s / (2 - s)) < 0.005


def test_nearest_neighbour_kappa_detects_planted_groups():
    "C3b's statistic: closed form for independent rows (hypergeometric intersections), 1 for rows in identical groups."
    from scipy.stats import hypergeom
    m, n, k = 160, 96, 48
    x = np.arange(k + 1)
    F = hypergeom(n, k, k).cdf(x)
    pmax = F ** (m - 1) - np.concatenate([[0.0], F[:-1]]) ** (m - 1)   # the largest of m - 1 iid intersections
    expect = ((pmax * x / (2 * k - x)).sum() - 1 / 3) / (2 / 3)
    g = torch.Generator().manual_seed(3)
    got = np.mean([jaccard_stats((~random_mask(m, n, 0.5, g)).numpy(), 0.5)["kappa_nn"] for _ in range(4)])
    assert abs(got - expect) < 0.01, (got, expect)
    rng = np.random.default_rng(4)
    P = np.zeros((m, n), bool)
    for i in range(0, m, 8):
        P[i:i + 8, rng.permutation(n)[:k]] = True
    st = jaccard_stats(P, 0.5)
    assert math.isclose(st["kappa_nn"], 1.0) and st["kappa_nn"] - expect >= 0.5   # the planted control is seen
    assert abs(st["kappa"] - 7 / (m - 1)) < 0.01                                    # the mean-pairwise kappa is not


def test_block_gains_are_gain_minus_surrogate():
    res = {"sur_gain": {"perm_col_sort": {"blk": {4: 0.1, 8: 0.0, 16: 0.0}, "n24": 0.02}},
           "T": {"perm_col_sort": {"blk_gain": {4: 0.3, 8: 0.05, 16: 0.0}, "n24_gain": 0.01}}}
    g = block_gains(res)
    assert math.isclose(g[("perm_col_sort", "z_blk4")], 0.2) and math.isclose(g[("perm_col_sort", "z_24")], -0.01)
    assert math.isclose(block_excess(res), 0.2) and block_excess({"sur_gain": {}, "T": {}}) == 0.0


def test_structured_controls():
    g = torch.Generator().manual_seed(0)
    W, xn = torch.randn(20, 10, generator=g), torch.rand(10, generator=g) + 0.1
    kr, kc = structured_wanda_mask(W, xn, 0.5, "rows"), structured_wanda_mask(W, xn, 0.5, "cols")
    assert math.isclose(structure(W.numpy() * kr.numpy())["S"], 0.5) and math.isclose(structure(W.numpy() * kc.numpy())["S"], 0.5)
    assert math.isclose(jaccard_stats((~kc).numpy(), 0.5)["kappa"], 1.0)


def test_spectrum_closed_form():
    rng = np.random.default_rng(7)
    s = np.array([4.0, 3.0, 2.0, 1.0])
    U, V = haar_orthogonal(6, rng)[:, :4], haar_orthogonal(4, rng)
    st = spectrum_stats(U @ np.diag(s) @ V.T)
    p = s / s.sum()
    assert math.isclose(st["erank"], math.exp(-(p * np.log(p)).sum()), rel_tol=1e-9)
    assert math.isclose(st["trunc_err"], math.sqrt((4 + 1) / 30), rel_tol=1e-9)
    assert math.isclose(st["stable_rank"], 30 / 16, rel_tol=1e-9)


def test_q41_grid_and_degrid():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(8, 64, generator=g)
    Q = q41_roundtrip(W)
    assert distinct_per_block(Q).max() <= 16
    assert torch.allclose(q41_roundtrip(Q), Q, atol=1e-6)              # the grid is a fixed point
    d = (W.reshape(8, 2, 32).amax(-1) - W.reshape(8, 2, 32).amin(-1)) / 15
    assert ((Q - W).abs().reshape(8, 2, 32) <= d[..., None] / 2 + 1e-6).all()
    D = degrid(Q, g)
    dq = (Q.reshape(8, 2, 32).amax(-1) - Q.reshape(8, 2, 32).amin(-1)) / 15
    assert ((D - Q).abs().reshape(8, 2, 32) <= dq[..., None] / 2 + 1e-6).all() and distinct_per_block(D).min() == 32


def test_calibration_norms_are_the_layer_input_norms():
    text = "the quick brown fox jumps over the lazy dog " * 20
    tok = CharTokenizer.from_text(text)
    h = tinygpt_handle(tok, generator=torch.Generator().manual_seed(0), d_model=16, n_layers=2, n_heads=2, max_len=32)
    for blk in h.model.blocks:
        blk.mlp[1] = torch.nn.ReLU()
    ids = torch.tensor(tok.encode(text))[:8 * 32].reshape(8, 32)
    st = calibration_stats(h, ids, {"fc1": "mlp.0", "fc2": "mlp.2"}, [0, 1], gram_layers=[1], batch=3)
    # oracle: the input of the whole MLP captured by a plain torch hook, pushed through fc1 and ReLU by hand
    seen = []
    hk = h.model.blocks[1].mlp.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        h.model(ids)
    hk.remove()
    x = seen[0].reshape(-1, 16).double()
    mlp = h.model.blocks[1].mlp
    z = torch.relu(x @ mlp[0].weight.double().T + mlp[0].bias.double())
    assert torch.allclose(st["norms"][(1, "fc1")].double(), x.norm(dim=0), rtol=1e-5)
    assert torch.allclose(st["norms"][(1, "fc2")].double(), z.norm(dim=0), rtol=1e-5)
    assert np.allclose(st["gram"][(1, "fc1")], (x.T @ x).numpy(), rtol=1e-5, atol=1e-6)
    perm = calibration_stats(h, ids[torch.randperm(8)], {"fc2": "mlp.2"}, [1], batch=5)   # token order does not matter
    assert torch.allclose(perm["norms"][(1, "fc2")], st["norms"][(1, "fc2")], rtol=1e-5)
    with pytest.raises(ParameterError, match="layer"):
        calibration_stats(h, ids, {"fc1": "mlp.0"}, [2])
