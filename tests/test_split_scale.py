"""Unit tests for genlab.split_scale (spec splitscale.md U1-U7 and bad input), each against an independent oracle."""
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from genlab.core import ParameterError, resolve
from genlab import split_scale as ss

torch.set_num_threads(1)


def _sphere(c=(0.0, 0.0, 0.0), r=0.5):
    return ss.SDFShape("plain", [ss.SDFObject(("sphere", {"c": torch.tensor([c], dtype=torch.float64),
                                                          "r": torch.tensor([r], dtype=torch.float64)}))])


# ---------------------------------------------------------------- U1 SDF library
def test_sphere_sdf_exact_and_volume():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.uniform(-1, 1, (1000, 3)))
    sh = _sphere((0.1, -0.2, 0.3), 0.4)
    exact = np.linalg.norm(x.numpy() - np.array([0.1, -0.2, 0.3]), axis=1) - 0.4
    assert np.abs(sh.sdf(x).numpy() - exact).max() < 1e-6
    unit = _sphere((0, 0, 0), 1.0)
    q = torch.as_tensor(rng.uniform(-1.2, 1.2, (400000, 3)))
    vol = float(unit.inside(q).double().mean()) * 2.4 ** 3
    assert abs(vol / (4 / 3 * math.pi) - 1) < 0.02


def test_union_subtraction_identities():
    rng = np.random.default_rng(1)
    x = torch.as_tensor(rng.uniform(-1, 1, (2000, 3)))
    base = ("sphere", {"c": torch.zeros(1, 3, dtype=torch.float64), "r": torch.tensor([0.6], dtype=torch.float64)})
    bump = ("sphere", {"c": torch.tensor([[0.6, 0, 0]], dtype=torch.float64), "r": torch.tensor([0.1], dtype=torch.float64)})
    a, b = ss.prim_sdf(*base, x), ss.prim_sdf(*bump, x)
    assert torch.allclose(ss.SDFObject(base, add=bump).sdf(x), torch.minimum(a, b))
    assert torch.allclose(ss.SDFObject(base, sub=bump).sdf(x), torch.maximum(a, -b))
    far = (a - b).abs() >= 0.02
    assert torch.allclose(ss.smooth_union(a, b, 0.02)[far], torch.minimum(a, b)[far])


def test_capsule_against_brute_force():
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (300, 3))
    a, b, r = np.array([-0.3, 0, 0.1]), np.array([0.4, 0.2, -0.1]), 0.05
    t = np.linspace(0, 1, 20001)
    seg = a + (b - a) * t[:, None]
    brute = np.array([np.linalg.norm(seg - p, axis=1).min() for p in x]) - r
    got = ss.sd_capsule(torch.as_tensor(x), torch.as_tensor(a[None]), torch.as_tensor(b[None]), torch.tensor([r], dtype=torch.float64))[:, 0]
    assert np.abs(got.numpy() - brute).max() < 1e-4


def test_surface_sampler_projection_and_coverage():
    rng = np.random.default_rng(3)
    for fam in ("bumpy", "drilled", "truss", "engraved", "scene"):
        sh = ss.make_shape(fam, rng)
        P = ss.sample_surface(sh, 3000, rng)
        assert len(P) == 3000 and sh.sdf(P).abs().max() < 2e-3 and P.abs().max() <= 1
    # a sphere with one small bump: the bump's exposed surface gets >= 1 point per 1e-3 of area
    base = ("sphere", {"c": torch.zeros(1, 3, dtype=torch.float64), "r": torch.tensor([0.5], dtype=torch.float64)})
    bump = ("sphere", {"c": torch.tensor([[0.5, 0, 0]], dtype=torch.float64), "r": torch.tensor([0.05], dtype=torch.float64)})
    sh = ss.SDFShape("bumpy", [ss.SDFObject(base, add=bump)])
    P = ss.sample_surface(sh, 20000, rng)
    on_bump = (ss.prim_sdf(*bump, P).abs() < 2e-3) & (ss.prim_sdf(*base, P) > 0)
    exposed = 4 * math.pi * 0.05 ** 2 * 0.5  # about half the bump sphere lies outside the base
    assert int(on_bump.sum()) >= exposed / 1e-3
    x = ss.project_to_surface(sh.sdf, torch.as_tensor(rng.normal(0, 0.6, (500, 3))))
    assert sh.sdf(x).abs().max() < 2e-3
    # normals of a sphere: radial (closed form)
    Q = ss.oriented_surface(_sphere((0.1, 0.0, 0.0), 0.5), 200, rng)
    radial = (Q[:, :3] - torch.tensor([0.1, 0.0, 0.0], dtype=torch.float64)) / 0.5
    assert torch.allclose(Q[:, 3:], radial, atol=5e-3)


def test_detail_points_are_thin_features_and_holes():
    rng = np.random.default_rng(4)
    b = ss.make_shape("bumpy", rng)
    thin = ss.detail_points(b, 500, rng, "thin")
    o = b.objects[0]
    assert len(thin) > 100 and (o.base_sdf(thin) > 0).all() and (b.sdf(thin) < 0).all()
    d = ss.make_shape("drilled", rng)
    hole = ss.detail_points(d, 500, rng, "hole")
    assert len(hole) > 100 and (d.objects[0].base_sdf(hole) < 0).all() and (d.sdf(hole) > 0).all()


# ---------------------------------------------------------------- U2 cells
@pytest.mark.parametrize("s", [1, 2, 3, 4])
def test_cells_cover_and_partition_of_unity(s):
    rng = np.random.default_rng(s)
    x = rng.uniform(-1, 1, (10000, 3))
    grid = np.linspace(-1, 1, 2 * s + 1)  # faces and corners
    x[:len(grid) ** 3] = np.stack(np.meshgrid(grid, grid, grid, indexing="ij"), -1).reshape(-1, 3)[:10000]
    x = torch.as_tensor(x)
    c = ss.make_cells(s, 0.125)
    W = c.weights(x)
    assert torch.allclose(W.sum(-1), torch.ones(len(x), dtype=torch.float64), atol=1e-6)
    assert (torch.stack([c.in_enlarged(x, k) for k in range(s ** 3)], -1).any(-1)).all()
    for k in range(s ** 3):
        assert torch.allclose(c.uncanon(c.canon(x, k), k), x, atol=1e-6)
    c0 = ss.make_cells(s, 0.0)
    W0 = c0.weights(x)
    assert ((W0 > 0).sum(-1) == 1).all()


# ---------------------------------------------------------------- U3 canonicalisation equivariance
def test_translation_by_one_cell_permutes_latents():
    torch.manual_seed(0)
    model = ss.SetTokenizer(d=16, heads=2, M=4, C=3, L_enc=1, L_dec=1, K_f=4).double().eval()
    rng = np.random.default_rng(0)
    sh = _sphere((-0.45, -0.3, -0.3), 0.3)
    P = ss.oriented_surface(sh, 6000, rng)
    shift6 = torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    shift = shift6[:3]
    P2 = P + shift6
    inside1 = lambda q: sh.inside(torch.as_tensor(q)).numpy()
    inside2 = lambda q: sh.inside(torch.as_tensor(q) - shift).numpy()
    a = ss.split_encode(model, P, inside1, 4, margin=0.125, N_in=64, n_min=8)
    b = ss.split_encode(model, P2, inside2, 4, margin=0.125, N_in=64, n_min=8)
    cells = a.cells
    nonempty = 0
    for k in range(64):
        i, j, l = cells.ijk[k].tolist()
        if i == 3:
            assert a.flags[k] != 2
            continue
        k2 = l * 16 + j * 4 + (i + 1)
        assert a.flags[k] == b.flags[k2]
        if a.flags[k] == 2:
            nonempty += 1
            assert torch.allclose(a.z[k], b.z[k2], atol=1e-5) and torch.allclose(a.anchors[k], b.anchors[k2], atol=1e-9)
    assert nonempty >= 4
    x = torch.as_tensor(rng.uniform(-1, 1, (4000, 3)))
    x = x[(x[:, 0] > -0.9) & (x[:, 0] < 0.4)]  # away from the domain faces whose neighbour cell has no counterpart
    la, lb = ss.split_decode(model, a, x), ss.split_decode(model, b, x + shift)
    assert torch.allclose(la, lb, atol=1e-5)


# ---------------------------------------------------------------- U4 empty cells
def test_empty_cells_in_and_out_flags_decode_constant():
    model = ss.SetTokenizer(d=16, heads=2, M=4, C=3, K_f=4).eval()
    rng = np.random.default_rng(0)
    sh = _sphere((-0.25, -0.25, -0.25), 0.6)
    P = ss.oriented_surface(sh, 20000, rng)
    code = ss.split_encode(model, P, lambda q: sh.inside(torch.as_tensor(q)).numpy(), 4, margin=0.125, N_in=64, n_min=32)
    cells = code.cells
    k_in = int(((cells.ijk == torch.tensor([1, 1, 1])).all(-1)).nonzero()[0])  # cell [-0.5, 0]^3
    k_out = int(((cells.ijk == torch.tensor([3, 3, 3])).all(-1)).nonzero()[0])  # cell [0.5, 1]^3
    assert code.flags[k_in] == 1 and code.flags[k_out] == 0
    assert (code.flags == 1).sum() >= 1 and (code.flags == 0).sum() >= 1
    x = torch.as_tensor(rng.uniform(-1, 1, (20000, 3)))
    W = cells.weights(x)
    lg = ss.split_decode(model, code, x)
    for k, want in ((k_in, True), (k_out, False)):
        core = W[:, k] == 1
        assert core.sum() > 10 and ((lg[core] > 0) == want).all()


# ---------------------------------------------------------------- U5 metrics
def test_metric_identities_and_chamfer_oracle():
    rng = np.random.default_rng(0)
    gt = rng.uniform(size=500) < 0.3
    assert ss.iou(gt, gt) == 1.0
    a, b = rng.normal(size=(50, 3)), rng.normal(size=(70, 3))
    assert ss.chamfer(a, a) == 0.0
    D = ((a[:, None] - b[None]) ** 2).sum(-1)
    assert abs(ss.chamfer(a, b) - (D.min(1).mean() + D.min(0).mean())) < 1e-10


def _cloud(kind, rng, n=256):
    if kind == "sphere":
        v = rng.normal(size=(n, 3))
        return v / np.linalg.norm(v, axis=1, keepdims=True) * rng.uniform(0.4, 0.6)
    x = rng.uniform(-1, 1, (n, 3))
    ax = rng.integers(0, 3, n)
    x[np.arange(n), ax] = np.sign(rng.uniform(-1, 1, n))
    return x * rng.uniform(0.4, 0.6)


def test_one_nna_same_and_different_distributions():
    rng = np.random.default_rng(0)
    A = [_cloud("sphere", rng) for _ in range(64)]
    B = [_cloud("sphere", rng) for _ in range(64)]
    Cb = [_cloud("box", rng) for _ in range(64)]
    assert abs(ss.generation_metrics(A, B)["nna"] - 0.5) <= 0.1
    assert ss.generation_metrics(A, Cb)["nna"] >= 0.9


# ---------------------------------------------------------------- U6 AR bookkeeping
def _ar_batch(b=3, K=8, M=3, C=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    flags = torch.randint(0, 3, (b, K), generator=g)
    flags[:, 0] = 2
    z = torch.randn(b, K, M, C, generator=g) * (flags == 2)[..., None, None]
    return flags, z, torch.randint(0, 2, (b,), generator=g)


def test_teacher_forced_nll_is_sum_of_per_token_nlls():
    torch.manual_seed(0)
    ar = ss.SplitAR(8, 3, 2, d=16, layers=2, heads=2, K_mix=3).eval()
    flags, z, y = _ar_batch()
    iso = torch.zeros(3, dtype=torch.bool)
    f_full, z_full = ar.token_nll(flags, z, y, iso)
    total, _ = ar.nll(flags, z, y, iso)
    assert torch.allclose(total, (f_full.sum() + z_full.sum()) / 3)
    # causality: each token's NLL computed from its prefix alone (future zeroed) equals the full-sequence value
    K, M = 8, 3
    for c in range(K):
        for j in range(M + 1):
            fl2, z2 = flags.clone(), z.clone()
            if j == 0:
                fl2[:, c + 1:] = 0; z2[:, c:] = 0
            else:
                fl2[:, c + 1:] = 0; z2[:, c, j:] = 0; z2[:, c + 1:] = 0
            f_p, z_p = ar.token_nll(fl2, z2, y, iso)
            if j == 0:
                assert torch.allclose(f_p[:, c], f_full[:, c], atol=1e-5)
            else:
                assert torch.allclose(z_p[:, c, j - 1], z_full[:, c, j - 1], atol=1e-5)


def test_sampling_reproduces_a_fixed_gaussian_head():
    ar = ss.SplitAR(2, 2, 2, d=8, layers=1, heads=2, K_mix=2).eval()
    with torch.no_grad():
        ar.flag_head.weight.zero_(); ar.flag_head.bias.copy_(torch.tensor([-30.0, -30.0, 30.0]))
        ar.mix_head.weight.zero_()
        mu, logs = torch.tensor([0.7, -1.2]), torch.log(torch.tensor([0.5, 2.0]))
        ar.mix_head.bias.copy_(torch.cat([torch.zeros(1), mu, logs]).repeat(2))
    flags, z = ar.sample(torch.zeros(4000, dtype=torch.long), tau=1.0, generator=torch.Generator().manual_seed(0))
    assert (flags == 2).all()
    zz = z.reshape(-1, 2)
    assert torch.allclose(zz.mean(0), mu, atol=0.05 * 2.0)
    assert torch.allclose(zz.var(0), torch.tensor([0.25, 4.0]), rtol=0.05)


def test_context_dropout_isolates_cells():
    torch.manual_seed(1)
    ar = ss.SplitAR(8, 3, 2, d=16, layers=2, heads=2, K_mix=2).eval()
    flags, z, y = _ar_batch(b=2, seed=3)
    fl2, z2 = flags.clone(), z.clone()
    fl2[:, 2] = (fl2[:, 2] + 1) % 3
    z2[:, 2] = torch.randn(2, 3, 2)
    for iso, same in ((True, True), (False, False)):
        isov = torch.full((2,), iso)
        a, ma = ar(flags, z, y, isov)
        b, mb = ar(fl2, z2, y, isov)
        other = [0, 1, 3, 4, 5, 6, 7]
        d = max((a[:, other] - b[:, other]).abs().max(), (ma[:, other] - mb[:, other]).abs().max())
        assert (d < 1e-6) == same


# ---------------------------------------------------------------- U7 real meshes
def test_real_meshes_load_normalise_and_inside_tests_agree():
    import igl
    import trimesh
    rng = np.random.default_rng(0)
    for rel in ss.REAL_MESHES + ss.PLACEBO_MESHES:
        t = ss.load_real_mesh(rel, 2000, 0)
        V, F = t.mesh
        assert np.abs(V).max() <= 0.9 + 1e-9 and np.isclose(np.abs(V).max(), 0.9)
        q = rng.uniform(-1, 1, (50000, 3))
        w = t.inside_np(q)
        sd = igl.signed_distance(q, V, F)[0]
        assert np.mean(w == (sd < 0)) >= 0.995, rel
        if rel == "sphere_smooth.obj":
            assert np.mean(w == (np.linalg.norm(q, axis=1) < 0.9)) >= 0.99
        if rel == "cube.obj":
            assert np.mean(w == (np.abs(q).max(1) < 0.9)) >= 0.99
        if rel == "bunny.obj":  # a second library: trimesh's ray test on the watertight bunny
            m = trimesh.Trimesh(V, F)
            assert np.mean(w[:5000] == m.contains(q[:5000])) >= 0.99


# ---------------------------------------------------------------- bad input
def test_bad_input_errors(tmp_path):
    with pytest.raises(ParameterError, match="split factor"):
        ss.make_cells(0)
    with pytest.raises(ParameterError, match="splits"):
        resolve(ss.PRESETS, "smoke", splits=(0, 2))
    with pytest.raises(ParameterError, match="splits must contain 1 and 2"):
        resolve(ss.PRESETS, "smoke", splits=(2, 3))
    with pytest.raises(ParameterError, match="not found"):
        ss.load_real_mesh("no_such_mesh.obj")
    flat = tmp_path / "plane.obj"
    flat.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 1 1 0\nf 1 2 3\nf 2 4 3\n")
    with pytest.raises(ParameterError, match="not a closed surface"):
        ss.load_real_mesh(str(flat))
    with pytest.raises(ParameterError, match="large_steps"):
        resolve(ss.PRESETS, "full", large_steps=10)


def test_distance_bias_matches_brute_force():
    torch.manual_seed(0)
    m = ss.SetTokenizer(d=16, heads=2, M=4, C=3, K_f=2)
    q, k = torch.rand(2, 5, 3), torch.rand(2, 7, 3)
    B = m.dist_bias(q, k, m.log_beta_dec).reshape(2, 2, 5, 7)
    for b in range(2):
        for h in range(2):
            for i in range(5):
                for j in range(7):
                    want = -float(m.log_beta_dec[h].exp()) * float(((q[b, i] - k[b, j]) ** 2).sum())
                    assert abs(float(B[b, h, i, j]) - want) < 1e-5 * max(1, abs(want))


# ---------------------------------------------------------------- K1 diagnostics: the evaluation path and the labels
@pytest.mark.parametrize("s", [1, 2, 3])
def test_iou_through_split_decode_is_exact_for_an_oracle(monkeypatch, s):
    "Cells that return the true SDF as logits give IoU 1 through split_decode; a smaller sphere gives the analytic (r'/r)^3."
    sph = _sphere(r=0.6)
    t = ss.make_eval_points(ss.procedural_target("sph", sph, ss.oriented_surface(sph, 2000, np.random.default_rng(0))),
                            20000, np.random.default_rng(1), ())
    x, occ = t.pts["uniform"]
    cells = ss.make_cells(s, 0.125)
    code = ss.SplitCode(cells, torch.full((len(cells.centers),), 2), torch.zeros(len(cells.centers), 2, 2), torch.zeros(len(cells.centers), 2, 3))

    def oracle(r):  # per-cell logits from the cell's own canonical coordinates, mapped back to world
        return lambda model, code, xx, c, empty_logit=8.0: -100 * (code.cells.uncanon(code.cells.canon(xx, c), c).norm(dim=-1) - r)
    monkeypatch.setattr(ss, "cell_logits", oracle(0.6))
    assert ss.iou((ss.split_decode(None, code, torch.as_tensor(x)) > 0).numpy(), occ) == 1.0
    monkeypatch.setattr(ss, "cell_logits", oracle(0.5))
    got = ss.iou((ss.split_decode(None, code, torch.as_tensor(x)) > 0).numpy(), occ)
    assert abs(got - (0.5 / 0.6) ** 3) < 0.02


def test_region_labels_agree_with_the_world_shape():
    "Whole-domain regions: inputs map back onto the surface and labels are the world inside test; crops: labels agree with the input normals."
    sph = _sphere(r=0.6)
    P = ss.oriented_surface(sph, 3000, np.random.default_rng(0))
    rng = np.random.default_rng(2)
    inp, q, occ = ss.sample_region(sph, P, rng, p_crop=0.0, margin=0.125, N_in=256, Q_u=200, Q_s=200, sigma_s=0.02)
    h = 1.25
    assert float(sph.sdf(inp[:, :3] * h).abs().max()) < 2e-3
    assert torch.equal(occ > 0.5, sph.sdf(q * h) < 0)
    for _ in range(5):  # crops (unknown centre and scale): the near-surface labels follow the nearest input normal
        inp, q, occ = ss.sample_region(sph, P, rng, p_crop=1.0, margin=0.125, N_in=256, Q_u=50, Q_s=400, sigma_s=0.02)
        r = ss.side_accuracy(ss.SetTokenizer(d=16, heads=2, M=4, C=3).eval(), inp[None].float(), q[None].float(), occ[None].float(), 50)
        assert r["rule"] >= 0.95, r


def test_side_accuracy_matches_brute_force():
    torch.manual_seed(0)
    tk = ss.SetTokenizer(d=16, heads=2, M=4, C=3).eval()
    inp = torch.cat([torch.rand(2, 40, 3) * 2 - 1, F.normalize(torch.randn(2, 40, 3), dim=-1)], -1)
    q, occ = torch.rand(2, 30, 3) * 2 - 1, (torch.rand(2, 30) < 0.5).float()
    r = ss.side_accuracy(tk, inp, q, occ, 10)
    with torch.no_grad():
        mu, _, an = tk.encode(inp)
        pm = tk.decode(mu, an, q)[:, 10:] > 0
    rule = []
    for b in range(2):
        for i in range(10, 30):
            j = int(((inp[b, :, :3] - q[b, i]) ** 2).sum(-1).argmin())
            rule.append(bool(((q[b, i] - inp[b, j, :3]) * inp[b, j, 3:]).sum() < 0) == bool(occ[b, i] > 0.5))
    assert abs(r["rule"] - np.mean(rule)) < 1e-6
    assert abs(r["model"] - float((pm == (occ[:, 10:] > 0.5)).float().mean())) < 1e-6
    with pytest.raises(ParameterError, match="Q_u"):
        ss.side_accuracy(tk, inp, q, occ, 30)
