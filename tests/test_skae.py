"""Unit tests for genlab.skae with independent oracles (closed forms, brute force, scipy, sklearn)."""
import inspect
import math

import numpy as np
import pytest
import torch

from genlab.core import ParameterError, resolve
from genlab import skae as S


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- shrink / LISTA / sign split -------------------------------------------------------------

def test_shrink_is_odd_zero_inside_and_1_lipschitz():
    a = torch.randn(5000, generator=gen(), dtype=torch.float64) * 2
    b = torch.randn(5000, generator=gen(1), dtype=torch.float64) * 2
    for tau in (0.0, 0.05, 0.7):
        assert torch.equal(S.shrink(-a, tau), -S.shrink(a, tau))
        assert (S.shrink(a[a.abs() <= tau], tau) == 0).all()
        lhs = (S.shrink(a, tau) - S.shrink(b, tau)).abs()
        assert (lhs <= (a - b).abs() + 1e-12).all()


def test_shrink_is_the_l1_proximal_map_brute_force():
    # shrink(a, tau) = argmin_u 0.5 (u - a)^2 + tau |u|, checked on a fine grid
    grid = np.linspace(-4, 4, 160001)
    for a in (-2.3, -0.04, 0.0, 0.3, 1.7):
        for tau in (0.05, 0.5):
            u = grid[np.argmin(0.5 * (grid - a) ** 2 + tau * np.abs(grid))]
            assert abs(float(S.shrink(torch.tensor(a), tau)) - u) < 1e-4


def test_lista_q0_equals_shrink_of_precode():
    enc = S.LISTAEncoder(2, 16, 32, 0, 0.2, gen())
    x = torch.randn(50, 2, generator=gen(3))
    assert torch.allclose(enc.codes(x), S.shrink(enc.pre(x), 0.2))


def test_lista_iteration_matches_hand_loop():
    enc = S.LISTAEncoder(2, 16, 32, 3, 0.1, gen())
    x = torch.randn(20, 2, generator=gen(4))
    c = enc.pre(x)
    u = S.shrink(c, 0.1)
    for _ in range(3):
        u = S.shrink(u @ enc.S.T + c, 0.1)
    assert torch.allclose(enc.codes(x), u)


def test_sign_split_nonnegative_and_invertible():
    u = torch.randn(100, 8, generator=gen())
    z = S.sign_split(u)
    assert z.shape == (100, 16) and (z >= 0).all()
    assert torch.allclose(z[:, :8] - z[:, 8:], u)
    m = S.KAE("lista", 2, 64, 32, gen())
    assert (m.encode(torch.randn(30, 2, generator=gen(1))) >= 0).all()


def test_dense_and_sparse_encoders():
    x = torch.randn(200, 2, generator=gen(5))
    dense = S.KAE("dense", 2, 64, 64, gen())
    assert (dense.encode(x).abs() > 1e-3).float().mean() > 0.95
    sp = S.KAE("sparse_mlp", 2, 64, 64, gen())
    assert (sp.encode(x) >= 0).all()


# --- rollouts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", S.MODELS)
def test_rollout_equals_matrix_power(kind):
    m = S.KAE(kind, 2, 32, 16, gen())
    with torch.no_grad():
        m.K.mul_(0.98)
        x0 = torch.randn(7, 2, generator=gen(2))
        pred = S.rollout(m, x0, 12)
        z0 = m.encode(x0)
        for h in (1, 5, 12):
            direct = z0 @ torch.linalg.matrix_power(m.K, h).T @ m.D.T
            assert torch.allclose(pred[:, h - 1], direct, atol=1e-5)


def test_reencode_infinite_period_equals_no_reencode_and_period_one_matches_loop():
    m = S.KAE("lista", 2, 32, 16, gen())
    x0 = torch.randn(6, 2, generator=gen(2))
    with torch.no_grad():
        assert torch.equal(S.rollout(m, x0, 20), S.rollout(m, x0, 20, reencode=1000))
        x, out = x0, []
        for _ in range(5):  # m = 1: every step decodes and re-encodes (eq. 10)
            x = m.decode(m.step(m.encode(x)))
            out.append(x)
        assert torch.allclose(S.rollout(m, x0, 5, reencode=1), torch.stack(out, 1), atol=1e-6)


def test_forecast_mse_and_failures():
    truth = torch.zeros(3, 6, 2)
    pred = torch.ones(3, 5, 2)
    pred[1, 2] = float("nan")
    e = S.forecast_mse(pred, truth, 4)
    assert e[0] == 1 and e[2] == 1 and e[1] == S.FAIL_MSE


def test_iqm_closed_form():
    v = [1, 2, 3, 4, 5, 6, 7, 100]
    assert S.iqm(v) == pytest.approx(np.mean([3, 4, 5, 6]))


# --- losses -----------------------------------------------------------------------------------

def test_losses_match_formula_by_hand():
    m = S.KAE("sparse_mlp", 2, 8, 8, gen())
    xw = torch.randn(4, 4, 2, generator=gen(6))  # B = 4, L = 3
    lam = dict(lambda_pred=0.3, lambda_rec=1.0, lambda_lin=0.2, lambda_sp=0.1)
    out = S.kae_losses(m, xw, **lam)
    with torch.no_grad():
        E, D, K = m.encode, m.D.numpy(), m.K.numpy()
        tot = {"pred": 0.0, "rec": 0.0, "lin": 0.0, "sp": 0.0}
        for b in range(4):
            z = E(xw[b, :1]).numpy()[0]
            for l in range(1, 4):
                z = K @ z
                x = xw[b, l].numpy()
                ze = E(xw[b, l:l + 1]).numpy()[0]
                tot["pred"] += np.linalg.norm(D @ z - x) / (12 * math.sqrt(2))
                tot["rec"] += np.linalg.norm(D @ ze - x) / (12 * math.sqrt(2))
                tot["lin"] += np.linalg.norm(z - ze) / 12
                tot["sp"] += np.abs(z).sum() / 12
    for k, v in tot.items():
        assert float(out[k]) == pytest.approx(v, rel=1e-5)
    want = (0.3 * tot["pred"] + tot["rec"] + 0.2 * tot["lin"] + 0.1 * tot["sp"]) / 3
    assert float(out["loss"].detach()) == pytest.approx(want, rel=1e-5)


def test_training_never_takes_labels():
    params = inspect.signature(S.train_kae).parameters
    assert list(params)[:4] == ["kind", "train", "cfg", "generator"]
    assert not any("label" in p or "basin" in p for p in params)


def test_sample_windows_are_consecutive():
    x = torch.arange(5 * 30, dtype=torch.float32).reshape(5, 30, 1)
    w = S.sample_windows(x, 64, 8, gen())
    assert w.shape == (64, 9, 1) and (w[:, 1:] - w[:, :-1] == 1).all()


# --- supports, families, entropies ------------------------------------------------------------

def test_support_functions():
    z = torch.tensor([[0.5, 0.0, -2e-3, 5e-4], [0.0, 0.0, 0.0, 1.0]])
    assert S.support_keys(S.supports_abs(z)) == [(0, 2), (3,)]
    assert S.support_keys(S.supports_top(torch.tensor([[0.1, -3.0, 2.0, 0.5]]), 2)) == [(1, 2)]
    assert S.jaccard((0, 1), (1, 2)) == pytest.approx(1 / 3) and S.jaccard((), ()) == 1.0


def test_families_on_a_hand_computed_list():
    keys = [(0, 1, 2), (0, 1, 2), (0, 1), (3, 4), (3, 4), (3, 4), (0, 1, 2, 3), (9,)]
    fam, protos = S.support_families(keys)
    # order: (3,4)x3, (0,1,2)x2, then (0,1), (0,1,2,3), (9,) by sorted tuple
    assert protos == [(3, 4), (0, 1, 2), (9,)]
    assert fam.tolist() == [1, 1, 1, 0, 0, 0, 1, 2]
    masks = np.zeros((3, 10), bool)
    masks[0, [0, 1]] = True  # Jaccard 2/3 with (0, 1, 2)
    masks[1, 4] = True  # Jaccard 1/2 with (3, 4)
    masks[2, 7] = True  # no prototype within 0.5
    assert S.fam_all_states(masks, protos).tolist() == [1, 0, -1]


def test_entropies_against_sklearn():
    from sklearn.metrics import mutual_info_score
    rng = np.random.default_rng(0)
    b = rng.integers(0, 3, 500)
    s = (b + rng.integers(0, 2, 500)) % 4
    hb = S.entropy_bits(b)
    assert S.cond_entropy_bits(b, s) == pytest.approx(hb - mutual_info_score(b, s) / math.log(2), abs=1e-9)
    det = [("k", int(x)) for x in b]  # deterministic support -> label map
    assert S.cond_entropy_bits(b, det) == pytest.approx(0.0, abs=1e-12)
    assert S.cond_entropy_bits(b, [()] * len(b)) == pytest.approx(hb)


def test_depth_margin_and_freeze_ratio_identity_mask():
    att = torch.tensor([[0.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    assert S.depth_margin(torch.tensor([[1.0, 0.0]]), att).item() == pytest.approx(1.0)
    m = S.KAE("lista", 2, 16, 16, gen())
    with torch.no_grad():
        z0 = m.encode(torch.randn(10, 2, generator=gen(1)))
        canon = {0: np.ones(16, np.float32), 1: np.ones(16, np.float32)}
        r = S.freeze_ratio(m, z0, torch.randn(10, 2, generator=gen(2)), np.array([0, 1] * 5), canon, 3)
    assert r == pytest.approx(1.0)


def test_routing_without_classes_is_the_global_rollout():
    m = S.KAE("lista", 2, 16, 16, gen())
    x0 = torch.randn(5, 2, generator=gen(1))
    pred, frac = S.routed_rollout(m, x0, 10, {})
    assert frac == 0 and torch.allclose(pred, S.rollout(m, x0, 10))


def test_deep_slice_excludes_converged_states_and_cuts_per_basin():
    att = torch.tensor([[0.0, 0.0], [10.0, 0.0]], dtype=torch.float64)
    rng = np.random.default_rng(0)
    # basin 0: 40 states at the attractor, 60 moving with distinct margins; basin 1: 30 moving states whose margins tie
    x0 = np.r_[np.zeros((40, 2)), np.c_[rng.uniform(1, 4, 60), np.zeros(60)]]
    x1 = np.c_[np.full(30, 7.0), np.zeros(30)]
    x = torch.tensor(np.r_[x0, x1])
    b = np.r_[np.zeros(100, int), np.ones(30, int)]
    keep = S.deep_slice_mask(x, x, b, att)
    assert not keep[:40].any()                      # converged states never enter
    m = S.depth_margin(x, att).numpy()
    mov0 = np.arange(40, 100)
    assert (keep[mov0] == (m[mov0] >= np.median(m[mov0]))).all()   # per-basin median cut
    assert keep[100:].all()                          # a tied basin is kept whole, not dropped
    # the old rule: a global top quartile of the margin (converged states included)
    old = S.deep_slice_mask(x, x, b, att, rule="margin_q75")
    assert (old == (m >= np.quantile(m, 0.75))).all()
    assert S.present_basins(b[keep], 20) == [0, 1] and S.present_basins(b[keep], 31) == []


def test_canonical_masks_take_the_most_frequent_support():
    keys = [(0, 1), (0, 1), (2,), (3, 4), (3, 4), (3, 4), (5,)]
    b = np.array([0, 0, 0, 1, 1, 1, 1])
    c = S.canonical_masks(keys, b, 6)
    assert c[0].tolist() == [1, 1, 0, 0, 0, 0] and c[1].tolist() == [0, 0, 0, 1, 1, 0]


def test_freeze_errors_closed_forms():
    m = S.KAE("lista", 2, 16, 16, gen())
    with torch.no_grad():
        x0 = torch.randn(10, 2, generator=gen(1))
        z0 = m.encode(x0)
        xt = torch.randn(10, 2, generator=gen(2))
        ones = {0: np.ones(16, np.float32), 1: np.ones(16, np.float32)}
        e = S.freeze_errors(m, z0, x0, xt, np.array([0, 1] * 5), ones, 3)
        assert e["ratio"] == pytest.approx(1.0) and e["own_ratio"] == pytest.approx(1.0)   # all-ones masks change nothing
        assert e["persist"] == pytest.approx(float(((x0 - xt) ** 2).mean()))
        assert e["nfe"] == pytest.approx(e["wrong"] / e["persist"])
        zero = {0: np.zeros(16, np.float32), 1: np.ones(16, np.float32)}
        e = S.freeze_errors(m, z0, x0, xt, np.array([1] * 10), zero, 1)   # basin 1 gets basin 0's empty mask
        assert e["wrong"] == pytest.approx(float((xt ** 2).mean()))     # K(0 * z) = 0 decodes to 0


def test_spectral_radius_and_rollout_with_normalised_k():
    th, r = 0.3, 1.2
    K = r * torch.tensor([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    assert S.spectral_radius(K) == pytest.approx(r, rel=1e-6)       # eigenvalues r e^{+-i th}
    m = S.KAE("dense", 2, 8, 8, gen())
    x0 = torch.randn(3, 2, generator=gen(1))
    with torch.no_grad():
        K2 = m.K * 0.5
        z0 = m.encode(x0)
        pred = S.rollout(m, x0, 4, K=K2)
        assert torch.allclose(pred[:, 3], z0 @ torch.linalg.matrix_power(K2, 4).T @ m.D.T, atol=1e-6)


def test_official_code_options():
    m = S.KAE("lista", 2, 16, 16, gen(), sign_split=False, normalize_atoms=True, k_init="identity")
    x = torch.randn(20, 2, generator=gen(3))
    assert torch.equal(m.K, torch.eye(16)) and m.encoder.n_units == 16
    assert torch.equal(m.encode(x), m.encoder.codes(x))            # signed code, no split
    assert (m.encode(x) < 0).any()
    with torch.no_grad():
        z = m.encode(x)
        y = m.decode(z)
        m.D.mul_(torch.rand(16, generator=gen(4)) * 5 + 0.1)       # rescaling an atom does not change the decoder
        assert torch.allclose(m.decode(z), y, atol=1e-5)
    with pytest.raises(ParameterError, match="k_init"):
        S.KAE("dense", 2, 8, 8, gen(), k_init="zeros")


def test_lr_k_mult_scales_the_first_adam_step_of_k():
    cfg = resolve(S.PRESETS, "smoke")
    import dataclasses
    x = torch.randn(10, 12, 2, generator=gen(5))
    steps = {}
    for mult in (1.0, 0.1):
        c = dataclasses.replace(cfg, steps=1, lr_k_mult=mult, k_init="identity")
        m, _, _ = S.train_kae("lista", x, c, gen(0), progress=False)
        steps[mult] = float((m.K.detach() - torch.eye(64)).abs().max())
    # Adam's first step moves each coordinate by lr * g / (|g| + eps), i.e. at most lr
    assert steps[1.0] == pytest.approx(cfg.lr, rel=1e-3)
    assert steps[0.1] == pytest.approx(0.1 * cfg.lr, rel=1e-3)


def test_validation_monitor_and_convergence_rule():
    cfg = resolve(S.PRESETS, "smoke", steps=200)
    import dataclasses
    cfg = dataclasses.replace(cfg, val_every=50)
    x = torch.randn(20, 30, 2, generator=gen(6)).cumsum(1) * 0.05
    m, hist, mon = S.train_kae("dense", x[:15], cfg, gen(0), held_out=x[15:], progress=False)
    assert mon.steps == [50, 100, 150, 200] and all(math.isfinite(v) for v in mon.values)
    assert S.converged(mon) == (mon.relative_improvement(window=0.2) < 0.02) and not S.converged(None)


def test_routed_rollout_with_reencode_and_no_classes_is_the_global_rollout():
    m = S.KAE("lista", 2, 16, 16, gen())
    x0 = torch.randn(5, 2, generator=gen(1))
    pred, frac = S.routed_rollout(m, x0, 12, {}, reencode=5)
    assert frac == 0 and torch.allclose(pred, S.rollout(m, x0, 12, reencode=5))


def test_full_mask_zero_centre_routing_is_the_global_rollout_and_drops_nothing():
    # step (13) with zbar_c = 0 and m_c = 1 is the global step K z; every state is routed (min_count = 1)
    m = S.KAE("lista", 2, 16, 16, gen())
    X = torch.randn(60, 2, generator=gen(2))
    cl = S.routing_classes(m, X, min_count=1, k=4)
    flat = {key: (torch.zeros(16), torch.ones(16), c) for key, (_, _, c) in cl.items()}
    pred, frac = S.routed_rollout(m, X[:10], 8, flat, k=4, reencode=3)
    assert frac > 0 and torch.allclose(pred, S.rollout(m, X[:10], 8, reencode=3), atol=1e-6)
    assert S.routed_mass_dropped(m, X, flat, k=4) == 0


def test_routed_mass_dropped_by_hand():
    # brute force: for each routed state, ||(1 - m_c)(z - zbar_c)||^2 / ||z - zbar_c||^2, averaged
    m = S.KAE("sparse_mlp", 2, 12, 16, gen(3))
    X = torch.randn(80, 2, generator=gen(4))
    cl = S.routing_classes(m, X, min_count=5, k=3)
    assert cl, "no class with >= 5 members"
    with torch.no_grad():
        z = m.encode(X)
    keys = S.support_keys(S.supports_top(z, 3))
    want = []
    for zi, key in zip(z.double().numpy(), keys):
        if key in cl:
            zbar, mask, _ = cl[key]
            d = zi - zbar.double().numpy()
            want.append(float(((1 - mask.double().numpy()) * d * d).sum() / (d * d).sum()))
    assert S.routed_mass_dropped(m, X, cl, k=3) == pytest.approx(np.mean(want), rel=1e-5)
    empty = {key: (c0, torch.zeros(12), c) for key, (c0, _, c) in cl.items()}
    assert S.routed_mass_dropped(m, X, empty, k=3) == pytest.approx(1.0)
    assert np.isnan(S.routed_mass_dropped(m, X, {}, k=3))


# --- systems and data -------------------------------------------------------------------------

@pytest.mark.parametrize("name,steps,x0", [
    ("triple_well", 40, [[0.5, 1.0], [-2.5, 0.3], [1.2, -1.0]]),
    ("polygon_4", 40, [[0.3, -0.2], [2.5, 2.5], [-1.0, 0.4]]),
    ("lorenz", 50, [[1.0, 1.0, 20.0], [-5.0, 3.0, 25.0]]),
])
def test_ode_data_against_scipy_solve_ivp(name, steps, x0):
    from scipy.integrate import solve_ivp
    sys_ = S.make_system(name)
    x0 = torch.tensor(x0, dtype=torch.float64)
    ours = S.simulate(sys_, x0, steps)
    t = np.arange(steps + 1) * sys_.dt
    f = lambda tt, y: sys_.field(tt, torch.tensor(y)[None]).numpy()[0]
    for i in range(len(x0)):
        ref = solve_ivp(f, (0, t[-1]), x0[i].numpy(), t_eval=t, rtol=1e-10, atol=1e-10, method="DOP853").y.T
        assert np.abs(ours[i].numpy() - ref).max() < 2e-3, name


def test_vector_fields_closed_forms():
    x = torch.randn(20, 2, dtype=torch.float64, generator=gen()).requires_grad_(True)
    c = S.polygon_centres(4)
    V = (-(3 * torch.exp(-((x[:, None] - c) ** 2).sum(-1) / (2 * 0.64))).sum(-1) + 0.05 * (x ** 2).sum(-1)).sum()
    grad, = torch.autograd.grad(V, x)
    assert torch.allclose(S.polygon_field(4)(0, x.detach()), -grad, atol=1e-10)
    p = torch.tensor([[2.0, 0.0], [0.0, 0.0], [-2.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(S.triple_well_field(0, p)[:3], torch.zeros(3, 2, dtype=torch.float64))
    assert S.triple_well_field(0, p)[3, 1] == 0  # x = 1 is the unstable equilibrium between wells


def test_gated_linear_map_contracts_to_quadrant_centres():
    c = S._GATED_C
    assert torch.allclose(S.gated_linear_step(c), c)
    x = c[0] + torch.tensor([[0.1, 0.0]], dtype=torch.float64)
    d = S.gated_linear_step(x) - c[0]
    assert d.norm().item() == pytest.approx(0.9 * 0.1)
    lab = S.basin_labels(S.make_system("gated_linear"), torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64), 500)
    assert lab.tolist() == [0, 2]


def test_boundary_ics_have_disagreeing_jitters():
    sys_ = S.make_system("gated_linear")
    g = gen(0)
    x = S.boundary_ics(sys_, 20, g, n_jitter=16, label_steps=300)
    assert x.shape == (20, 2)
    jit = x[:, None] + 0.05 * torch.randn(20, 64, 2, generator=gen(9), dtype=torch.float64)
    lab = S.basin_labels(sys_, jit.reshape(-1, 2), 300).reshape(20, 64)
    assert (lab != lab[:, :1]).any(1).float().mean() > 0.7  # near a separatrix


# --- configuration ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad,word", [
    (dict(lambda_sp=1.5), "lambda_sp"), (dict(lambda_sp=-0.1), "lambda_sp"), (dict(d_z=0), "d_z"),
    (dict(systems=("double_pendulum",)), "triple_well"), (dict(models=("relu_dense",)), "lista"),
    (dict(d_z=63), "even"), (dict(deep_slice="top"), "deep_slice"), (dict(control_systems=("gated_linear",)), "control_systems"),
    (dict(ablations=("dropout",)), "ablations"), (dict(lr_k_mult=0.0), "lr_k_mult"),
])
def test_bad_input_names_parameter_and_allowed_values(bad, word):
    with pytest.raises(ParameterError, match=word):
        resolve(S.PRESETS, "smoke", **bad)


def test_presets_validate():
    for p in S.PRESETS.values():
        p.validate()
    with pytest.raises(ParameterError):
        S.make_system("duffing")
