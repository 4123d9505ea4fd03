"""Unit tests for genlab.physics_video with independent oracles: conservation laws, brute-force geometry,
scipy's rotation alignment, pybullet (cross-engine check S5), closed-form Gaussian flows, bad input."""
import itertools
import math

import numpy as np
import pytest
import torch

from genlab.core import ParameterError, np_rng, resolve, rng
from genlab import physics_video as pv

torch.set_num_threads(1)


def _three_body():
    return pv.make_scene([dict(kind="sphere", radius=0.1, centre=(0.2, 0.5, 0.5), velocity=(0.03, 0.002, 0)),
                          dict(kind="box", radius=0.08, centre=(0.5, 0.5, 0.5), velocity=(-0.01, 0, 0.001)),
                          dict(kind="sphere", radius=0.1, centre=(0.78, 0.52, 0.5), alpha=0.3, velocity=(-0.02, 0, 0))])


# ---------------------------------------------------------------- U1 simulator
def test_u1_momentum_conserved_without_gravity_and_floor():
    sc = _three_body()
    X = pv.simulate(sc, 24, gravity=0.0, floor=False)
    assert pv._first_contact(X, sc.obj) >= 0                     # the objects do collide
    P = np.diff(X, axis=0).sum(1)                                # total momentum per frame (equal masses)
    assert np.abs(P - sc.v0.sum(0)).max() <= 1e-9 * np.abs(sc.v0).sum()


def test_u1_rigid_objects_stay_rigid_and_rest_on_the_floor():
    sc = _three_body()
    X = pv.simulate(sc, 24)
    for k in (0, 1):
        idx = sc.obj == k
        d0 = np.linalg.norm(sc.rest[idx][:, None] - sc.rest[idx][None], axis=-1)
        for t in (5, 23):
            d = np.linalg.norm(X[t, idx][:, None] - X[t, idx][None], axis=-1)
            assert np.abs(d - d0).max() < 1e-6
    rest = pv.make_scene([dict(kind="box", radius=0.08, centre=(0.5, 0.2, 0.5))])
    Xr = pv.simulate(rest, 30)
    assert Xr[-1, :, 1].min() >= pv.R_P - 1e-9 and abs(Xr[-1, :, 1].min() - pv.R_P) < 1e-6


def test_shape_matching_rotation_matches_scipy():
    from scipy.spatial.transform import Rotation
    rng = np.random.default_rng(0)
    q = pv.lattice_shape("box", 0.08)
    R = Rotation.random(random_state=1).as_matrix()
    p = q @ R.T + rng.normal(0, 1e-3, q.shape)
    p -= p.mean(0)
    ours = pv._best_rotation(p, q)
    ref, _ = Rotation.align_vectors(p, q)
    assert np.allclose(ours, ref.as_matrix(), atol=1e-8)


def test_contact_projection_is_symmetric_and_finds_every_pair():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, (60, 3))
    obj = rng.integers(0, 3, 60)
    out = pv.contact_project(p, obj)
    assert np.allclose(out.sum(0), p.sum(0), atol=1e-12)          # equal and opposite corrections
    moved = set(np.flatnonzero(np.abs(out - p).sum(1) > 0))
    brute = {i for i, j in itertools.combinations(range(60), 2)
             if obj[i] != obj[j] and np.linalg.norm(p[i] - p[j]) < 2 * pv.R_P for i in (i, j)}
    brute = {k for i, j in itertools.combinations(range(60), 2)
             if obj[i] != obj[j] and np.linalg.norm(p[i] - p[j]) < 2 * pv.R_P for k in (i, j)}
    assert moved == brute


def test_free_fall_matches_semi_implicit_euler_closed_form():
    sc = pv.make_scene([dict(kind="sphere", radius=0.1, centre=(0.5, 1.0, 0.5))])
    X = pv.simulate(sc, 8)
    g, n = pv.GRAVITY, 4
    t = np.arange(8)
    # semi-implicit Euler with n substeps of 1/n: y = 1 - g t^2/2 - g t/(2n)
    assert np.allclose(X[:, :, 1].mean(1), 1 - g * t ** 2 / 2 - g * t / (2 * n), atol=1e-12)


# ---------------------------------------------------------------- S5 cross-engine (pybullet)
def test_s5_gt_simulator_agrees_with_pybullet():
    r = pv.validate_gt_simulator()
    assert r["a"]["ok"], r["a"]
    assert r["b"]["ok"], r["b"]
    assert r["c"]["ok"], r["c"]
    assert abs(r["a"]["y6"]["pybullet"] - 0.75) < 0.01              # pybullet itself reproduces 1 - g t^2/2


# ---------------------------------------------------------------- U2 graph / PGDS
def test_u2_edges_symmetric_without_self_edges_and_knn_brute_force():
    sc = _three_body()
    e = pv.intra_edges(sc, 6)
    pairs = set(map(tuple, e.T))
    assert all((j, i) in pairs for i, j in pairs) and all(i != j for i, j in pairs)
    idx = np.flatnonzero(sc.obj == 1)
    i0 = idx[0]
    d = np.linalg.norm(sc.rest[idx] - sc.rest[i0], axis=1)
    kth = np.sort(d)[6]
    nbrs = {j for (i, j) in pairs if i == i0}
    assert {idx[k] for k in np.flatnonzero((d <= kth - 1e-9) & (d > 0))} <= nbrs
    x = sc.x0.copy(); x[sc.obj == 1] -= (0.25, 0, 0)
    ie = pv.inter_edges(x, sc.obj, 2.5 * pv.R_P)
    ip = set(map(tuple, ie.T))
    brute = {(i, j) for i in range(len(x)) for j in range(len(x))
             if sc.obj[i] != sc.obj[j] and np.linalg.norm(x[i] - x[j]) < 2.5 * pv.R_P}
    assert ip == brute and len(ip) > 0


def test_u2_translation_invariance_without_floor_feature():
    sc = _three_body()
    X = pv.simulate(sc, 6, gravity=0.0, floor=False)
    m = pv.PGDS(16, 2, use_floor=False, generator=rng(0, "pgds", "init"))
    b = pv.batch_scenes([sc])
    H = pv.history_of(X, sc.v0, 4)
    outs = []
    for shift in (np.zeros(3), np.array([3.0, -2.0, 0.7])):
        hist = torch.as_tensor(H + shift, dtype=torch.float32)
        e, same = pv._edge_tensors(m, H[-1] + shift, b)
        outs.append(m(hist, e, b.kind, b.alpha, b.rest, same))
    assert torch.allclose(outs[0], outs[1], atol=1e-5)


def test_history_synthesis_and_noise_free_targets():
    sc = _three_body()
    X = pv.simulate(sc, 6)
    H = pv.history_of(X, sc.v0, 0, 3)
    assert np.allclose(H, X[0][None] - np.arange(3, -1, -1)[:, None, None] * sc.v0[None])
    m = pv.PGDS(8, 1)
    m.set_stats(*pv.pgds_stats([(sc, X)]))
    hist, e, same, b, target = pv.pgds_batch(m, [(sc, X)], [(0, 3)], 0.0, np.random.default_rng(0))
    a = target.double() * m.a_std.double() + m.a_mean.double()
    assert torch.allclose(a, torch.as_tensor(X[4] - 2 * X[3] + X[2]), atol=1e-6)


def test_pgds_learns_and_rollout_shapes():
    clips = pv.make_clips(2, np_rng(0, "clips"), ("collide", "enter"))
    m = pv.PGDS(16, 2, generator=rng(0, "pgds", "init"))
    m.set_stats(*pv.pgds_stats(clips))
    before = pv.pgds_fixed_loss(m, clips)
    pv.train_pgds(m, clips, steps=60, batch=2, rng=np_rng(0, "pgds", "batches"))
    assert pv.pgds_fixed_loss(m, clips) < before
    P = pv.rollout(m, [s for s, _ in clips], 10)
    assert [p.shape for p in P] == [(10, len(s.obj), 3) for s, _ in clips]
    assert all(np.allclose(p[0], s.x0) for p, (s, _) in zip(P, clips))


class _OracleAcc(pv.PGDS):
    "Outputs the GT normalised target of pgds_batch for each frame of the clips, in order (an oracle simulator)."

    def __init__(self, clips):
        super().__init__(8, 0, edges="none")
        self.set_stats(*pv.pgds_stats(clips))
        self.clips, self.t = clips, 0

    def forward(self, hist, *args):
        C = self.history
        a = [X[self.t + 1] - 2 * pv.history_of(X, sc.v0, self.t, C)[-1] + pv.history_of(X, sc.v0, self.t, C)[-2]
             for sc, X in self.clips]
        self.t += 1
        return (torch.as_tensor(np.concatenate(a), dtype=torch.float32) - self.a_mean) / self.a_std


def test_rollout_with_oracle_accelerations_reproduces_gt():
    "Rollout integration and synthesised history match pgds_batch's target definition: an oracle rolls out exactly."
    clips = pv.make_clips(1, np_rng(0, "clips"), ("collide", "enter"))
    for proj in (False, True):
        P = pv.rollout(_OracleAcc(clips), [s for s, _ in clips], 12, rigid_proj=proj)
        assert pv.rollout_rmse(P, clips, 12)["rmse"] < 1e-5
    assert pv.rollout_rmse([pv.ballistic(s) for s, _ in clips], clips, 12)["rmse"] > 1e-3   # the metric sees contacts


def test_pgds_huber_loss_option():
    clips = pv.make_clips(1, np_rng(0, "clips"), ("collide", "enter"))
    m = pv.PGDS(16, 2, generator=rng(0, "pgds", "init"))
    with pytest.raises(ParameterError, match="loss"):
        pv.train_pgds(m, clips, steps=1, loss="l1", rng=np_rng(0, "pgds", "batches"))
    before = pv.pgds_fixed_loss(m, clips) if m.set_stats(*pv.pgds_stats(clips)) is None else None
    h, _ = pv.train_pgds(m, clips, steps=40, batch=2, loss="huber", huber_beta=0.5, rng=np_rng(0, "pgds", "batches"))
    assert pv.pgds_fixed_loss(m, clips) < before
    assert pv.PRESETS["full"].pgds_loss == "huber" and pv.PRESETS["full"].pgds_steps >= 3000


# ---------------------------------------------------------------- U3 VIMF
def _box(centre, v=(0, 0, 0)):
    return pv.make_scene([dict(kind="box", radius=0.08, centre=centre, velocity=v)])


def test_u3_static_scene_has_zero_motion_channels():
    sc = _box((0.2, pv.R_P + 0.0675, 0.5))
    F_ = pv.motion_field(pv.simulate(sc, 24), sc, 24, [3, 6, 9])
    assert F_[:, 0].sum() > 0 and np.abs(F_[:, 2:7]).max() < 1e-12


def test_u3_unoccluded_translation_has_no_invisible_content_and_visible_only_equals_vimf():
    sc = _box((0.2, 0.5, 0.5), (0.008, 0.004, 0))
    X = pv.constant_velocity(sc, 24)
    vi = pv.motion_field(X, sc, 24, [3, 6, 9, 12])
    vo = pv.motion_field(X, sc, 24, [3, 6, 9, 12], visible_only=True)
    assert vi[:, 2].max() == 0 and np.array_equal(vi, vo)


def _brute_inv(X, W, t, tau=0.9 * pv.H_SPACING):
    "Brute-force inv map: per pixel, the front-most visible particle whose 2x2 footprint covers it; 1 if not visible at t=0."
    def vis(x):
        uv = pv.project(x, W)
        pix = np.floor(uv).astype(int)
        ins = (pix >= 0).all(1) & (pix < W).all(1)
        bg, oc = pv.background(W)
        out = np.zeros(len(x), bool)
        for i in np.flatnonzero(ins):
            same = [j for j in np.flatnonzero(ins) if (pix[j] == pix[i]).all()]
            zb = max(x[j, 2] for j in same)
            if oc[pix[i, 1], pix[i, 0]]:
                zb = max(zb, pv.OCCLUDER["z"])
            out[i] = x[i, 2] >= zb - tau
        return out
    v0, vt = vis(X[0]), vis(X[t])
    oc = pv.background(W)[1]                                         # the occluder hides every particle
    inv = np.zeros((W, W))
    best = np.full((W, W), -np.inf)
    uv = pv.project(X[t], W)
    for i in np.flatnonzero(vt):
        c0, r0 = int(np.floor(uv[i, 0] - 0.5)), int(np.floor(uv[i, 1] - 0.5))
        for r, c in itertools.product((r0, r0 + 1), (c0, c0 + 1)):
            if 0 <= r < W and 0 <= c < W and not oc[r, c] and X[t, i, 2] > best[r, c]:
                best[r, c] = X[t, i, 2]; inv[r, c] = 0.0 if v0[i] else 1.0
    return inv


def test_u3_emerging_object_inv_matches_brute_force():
    sc = _box((0.48, 0.3, 0.5), (0.012, 0, 0))                  # behind the occluder, moving out to the right
    X = pv.constant_velocity(sc, 24)
    W = 16
    frames = [1, 6, 12]
    F_ = pv.motion_field(X, sc, W, frames)
    for k, t in enumerate(frames):
        assert np.array_equal(F_[k, 2], _brute_inv(X, W, t)), t
    assert F_[-1, 2].sum() > 0                                   # hidden content is visible at the end
    still = pv.motion_field(pv.constant_velocity(_box((0.48, 0.3, 0.5)), 24), _box((0.48, 0.3, 0.5)), W, frames)
    assert still[:, 2].max() == 0                                # and never while the object does not move


def test_u3_backward_warp_reproduces_translation():
    sc = _box((0.25, 0.5, 0.5), (0.01, 0.004, 0))
    X = pv.constant_velocity(sc, 24)
    W, fr = 24, [3, 6, 9]
    F_ = pv.motion_field(X, sc, W, fr)
    f0 = pv.to_model(pv.render(X[0], sc, W))[None].expand(len(fr), -1, -1, -1)
    wp = pv.warp_frame0(f0, torch.as_tensor(F_, dtype=torch.float32))
    gt = pv.to_model(np.stack([pv.render(X[t], sc, W) for t in fr]))
    m = torch.as_tensor(F_[:, 1:2] > 0.5).expand(-1, 3, -1, -1)
    mse = (((wp - gt) / 2)[m] ** 2).mean().item()
    assert 10 * math.log10(1 / mse) > 30


# ---------------------------------------------------------------- U4 flow matching
class _GaussVelocity(torch.nn.Module):
    "Exact marginal velocity of x_tau = (1 - tau) eps + tau x, eps ~ N(0, 1), x ~ N(mu, s^2)."

    def __init__(self, mu, s):
        super().__init__(); self.mu, self.s = mu, s

    def forward(self, x, tau, cond):
        t = tau[:, None, None, None, None]
        var = (1 - t) ** 2 + t ** 2 * self.s ** 2
        dev = x - t * self.mu
        return self.mu + (t * self.s ** 2 - (1 - t)) * dev / var


def _euler_moments(mu, s, n):
    "Closed form of n Euler steps on the exact Gaussian velocity: each step is affine, x <- a x + b."
    m, v = 0.0, 1.0
    for k in range(n):
        t = k / n
        c = (t * s ** 2 - (1 - t)) / ((1 - t) ** 2 + t ** 2 * s ** 2)
        a, b = 1 + c / n, (mu - c * t * mu) / n
        m, v = a * m + b, a * a * v
    return m, v


def test_u4_euler_sampler_matches_gaussian_target():
    mu, s = 2.0, 0.5
    noise = torch.randn(200_000, 1, 1, 1, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    cond = torch.zeros(len(noise), 1, 1, 1, 1)
    out = pv.sample_video(_GaussVelocity(mu, s), cond, noise, 16, chunk=len(noise), clamp=False)
    m16, v16 = _euler_moments(mu, s, 16)
    assert abs(out.mean().item() - mu) / mu < 0.02                       # the mean within 2% at 16 steps
    assert abs(out.var().item() - v16) / v16 < 0.01                      # exactly the Euler discretisation
    fine = pv.sample_video(_GaussVelocity(mu, s), cond, noise, 512, chunk=len(noise), clamp=False)
    assert abs(fine.var().item() - s ** 2) / s ** 2 < 0.02              # and the target variance as steps grow
    # (16 Euler steps underestimate this variance by ~17%: the independent-coupling Gaussian path is curved)


def test_u4_overfitting_a_fixed_batch_lowers_the_loss():
    torch.manual_seed(0)
    m = pv.VideoUNet(ch=(8, 8, 8), generator=rng(0, "unet", "temb"))
    g = torch.Generator().manual_seed(0)
    x1 = torch.rand(2, 2, 3, 8, 8, generator=g) * 2 - 1
    cond = torch.rand(2, 2, 16, 8, 8, generator=g)
    opt = torch.optim.Adam(m.parameters(), 3e-3)
    losses = []
    for _ in range(80):
        opt.zero_grad()
        loss = pv.fm_loss(m, x1, cond, torch.Generator().manual_seed(1))
        loss.backward(); opt.step(); losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_u4_none_condition_is_exactly_zero_and_keeps_frame0():
    f0 = torch.rand(3, 3, 8, 8)
    c = pv.build_condition(f0, None)
    assert c.shape == (3, 1, 16, 8, 8) and c[:, :, 3:].abs().max() == 0 and torch.equal(c[:, 0, :3], f0)
    full = pv.build_condition(f0, torch.rand(3, 2, 10, 8, 8))
    assert full.shape == (3, 2, 16, 8, 8)


def test_condition_dropout_frequencies():
    idx = pv.dropout_conditions(20000, (0.4, 0.4, 0.2), torch.Generator().manual_seed(0))
    freq = torch.bincount(idx, minlength=3).double() / len(idx)
    assert torch.allclose(freq, torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64), atol=0.015)


# ---------------------------------------------------------------- metrics
def test_metrics_of_the_ground_truth_itself():
    sc, X = pv.make_clips(1, np_rng(3, "clips"), ("emerge",))[0]
    W, fr = 24, [3, 6, 9]
    gt = np.stack([pv.render(X[t], sc, W) for t in fr])
    inv = pv.motion_field(X, sc, W, fr)[:, 2]
    r = pv.clip_metrics(gt, gt, pv.render(X[0], sc, W), inv, sc, fr)
    assert r["iou"] == 1 and r["centroid"] == 0 and r["area"] == 0 and r["tear"] == 0
    assert r["presence_hit"] == r["presence_n"]
    lab = pv.label_image(pv.background(W)[0])
    assert set(np.unique(lab)) <= {0, 1, 2}


# ---------------------------------------------------------------- bad input
def test_bad_input_is_named():
    with pytest.raises(ParameterError, match="stride"):
        pv.target_frames(2, 6, n_frames=4)
    with pytest.raises(ParameterError, match="condition"):
        pv.condition_fields(np.zeros((24, 10, 3)), _box((0.5, 0.5, 0.5)), 16, [3], "flowfield")
    with pytest.raises(ParameterError, match="template"):
        pv.scene_template("explode", np.random.default_rng(0))
    with pytest.raises(ParameterError, match="W"):
        resolve(pv.PRESETS, "smoke", W=18)
    with pytest.raises(ParameterError, match="stride"):
        resolve(pv.PRESETS, "smoke", n_frames=3, stride=4, K=1)
    with pytest.raises(ParameterError, match="cond_probs"):
        resolve(pv.PRESETS, "smoke", cond_probs=(0.5, 0.5, 0.5))
    with pytest.raises(ParameterError, match="edges"):
        pv.PGDS(edges="radius")
