"""Unit tests for genlab.cdc with independent oracles: exact identities of the pyramid, closed forms of the
transport cost and the re-noising coefficients, finite differences of the interpolant, mocked networks that
record what the sampler feeds them, and hooks on the DiT's patch embedding."""
import math

import pytest
import torch
import torch.nn as nn

import genlab.cdc as cdc
from genlab.core import ParameterError, resolve


def _images(n=16, r=8, seed=0):
    return torch.rand(n, 1, r, r, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _perturbed_dit(**kw):
    "A DiT whose zero-initialised AdaLN-Zero gates and output layer are set to random values (so it is not constant)."
    m = cdc.StageDiT(**{"resolution": 8, "n_stages": 3, "patch": 2, "width": 32, "depth": 2, "heads": 4, **kw})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            if p.abs().sum() == 0:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return m.eval()


# ---- pyramid (Eq. 1)
@pytest.mark.parametrize("r,R", [(2, 4), (2, 8), (4, 16)])
def test_down_of_up_is_identity(r, R):
    y = torch.randn(5, 2, r, r)
    assert torch.allclose(cdc.downsample(cdc.upsample(y, R), r), y, atol=1e-6)


def test_pyramid_shapes_and_average_pool_oracle():
    x = _images(3, 8)
    levels = cdc.pyramid(x, (2, 4, 8))
    assert [tuple(l.shape) for l in levels] == [(3, 1, 2, 2), (3, 1, 4, 4), (3, 1, 8, 8)]
    # brute force: each coarse pixel is the mean of its 4x4 block
    assert torch.allclose(levels[0][:, 0, 1, 0], x[:, 0, 4:8, 0:4].mean((1, 2)), atol=1e-6)
    assert torch.equal(levels[2], x)


def test_bilinear_upsample_is_optional_and_breaks_the_identity():
    y = torch.randn(2, 1, 4, 4)
    assert not torch.allclose(cdc.downsample(cdc.upsample(y, 8, "bilinear"), 4), y, atol=1e-6)


# ---- bad input
@pytest.mark.parametrize("bad", [(2, 4, 6), (2, 8), (3, 6, 10), ()])
def test_resolutions_must_double(bad):
    with pytest.raises(ParameterError, match="resolutions"):
        cdc.check_resolutions(bad)


def test_resolution_not_a_power_of_two_multiple_of_the_coarsest():
    assert cdc.stage_resolutions(8, 3) == (2, 4, 8)
    assert cdc.stage_resolutions(16, 3, coarsest=4) == (4, 8, 16)
    with pytest.raises(ParameterError, match="resolution"):
        cdc.stage_resolutions(10, 3)
    with pytest.raises(ParameterError, match="resolution"):
        cdc.stage_resolutions(12, 3, coarsest=2)


@pytest.mark.parametrize("split", [(1, 1), (1, 1, 1, 1), (2, 0, 1)])
def test_nfe_split_length_and_values(split):
    with pytest.raises(ParameterError, match="nfe_split"):
        cdc.check_nfe_split(split, 3)


def test_bad_config_stops_before_training():
    with pytest.raises(ParameterError, match="low_split"):
        resolve(cdc.PRESETS, "full", low_split=(12, 2))
    with pytest.raises(ParameterError, match="nfe_splits"):
        resolve(cdc.PRESETS, "full", nfe_splits=((1, 1, 1), (2, 2)))
    with pytest.raises(ParameterError, match="resolutions"):
        resolve(cdc.PRESETS, "full", resolutions=(2, 4, 12))
    with pytest.raises(ParameterError, match="section"):
        resolve(cdc.PRESETS, "full", section="everything")
    assert resolve(cdc.PRESETS, "full", section="main").sections == ("main", "baselines", "res16", "diagnostics")


def test_sampler_rejects_a_bad_split_before_any_evaluation():
    calls = []

    class M(nn.Module):
        n_classes = 0

        def forward(self, xt, t, xi, k, y=None):
            calls.append(k)
            return xt

    with pytest.raises(ParameterError, match="nfe_split"):
        cdc.sample_cdc(M(), cdc.StagePlan(), 4, (3, 3))
    assert calls == []


# ---- interpolant (Eq. 4)
@pytest.mark.parametrize("gamma_a", [0.0, 0.1])
def test_interpolant_endpoints_and_finite_difference(gamma_a):
    g = torch.Generator().manual_seed(0)
    x0, x1, z = (torch.randn(6, 1, 4, 4, generator=g) for _ in range(3))
    xt0, _ = cdc.interpolant(x0, x1, torch.zeros(6), z, gamma_a)
    xt1, _ = cdc.interpolant(x0, x1, torch.ones(6), z, gamma_a)
    assert torch.allclose(xt0, x0, atol=1e-5) and torch.allclose(xt1, x1, atol=1e-5)
    t, h = torch.full((6,), 0.37, dtype=torch.float64), 1e-5
    x0d, x1d, zd = x0.double(), x1.double(), z.double()
    fd = (cdc.interpolant(x0d, x1d, t + h, zd, gamma_a)[0] - cdc.interpolant(x0d, x1d, t - h, zd, gamma_a)[0]) / (2 * h)
    assert torch.allclose(fd, cdc.interpolant(x0d, x1d, t, zd, gamma_a)[1], atol=1e-6)


# ---- coupling (Eqs. 2-3, 5)
def test_dependent_source_is_coarse_plus_sigma_noise():
    x = _images(4000, 8)
    plan = cdc.StagePlan(sigma=0.25, tau=0.0)
    x0, x1, xi = cdc.stage_batch(x, 2, plan, torch.Generator().manual_seed(0))
    coarse = cdc.upsample(cdc.downsample(x, 4), 8)
    assert torch.equal(xi, coarse) and torch.equal(x1, x)
    assert abs(float((x0 - coarse).std()) - 0.25) < 0.005 and abs(float((x0 - coarse).mean())) < 0.005


def test_stage_one_is_plain_flow_matching():
    x = _images(8, 8)
    x0, x1, xi = cdc.stage_batch(x, 0, cdc.StagePlan(), torch.Generator().manual_seed(0))
    assert torch.equal(x1, cdc.downsample(x, 2)) and torch.equal(xi, torch.zeros_like(x1))


def test_independent_coupling_source_is_noise_but_xi_is_still_fed():
    x = _images(8, 8)
    plan = cdc.StagePlan(coupling="independent", tau=0.0)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    x0, _, xi = cdc.stage_batch(x, 1, plan, g1)
    assert torch.equal(x0, torch.randn(x0.shape, generator=g2))           # exactly eps, no xi term
    assert torch.equal(xi, cdc.upsample(cdc.downsample(x, 2), 4))


def test_no_conditioning_input_feeds_zeros():
    x = _images(8, 8)
    _, _, xi = cdc.stage_batch(x, 2, cdc.StagePlan(condition_on_xi=False), torch.Generator().manual_seed(0))
    assert torch.equal(xi, torch.zeros_like(xi))


def test_training_perturbs_xi_by_tau():
    x = _images(2000, 8)
    _, _, xi = cdc.stage_batch(x, 2, cdc.StagePlan(tau=0.05), torch.Generator().manual_seed(0), train=True)
    d = xi - cdc.upsample(cdc.downsample(x, 4), 8)
    assert abs(float(d.std()) - 0.05) < 0.002


def test_renoise_coefficients_closed_form_and_block_noise():
    a, b = cdc.renoise_coefficients(0.25, 1 / 3)      # s0 = 0.75: alpha = 1 / (2 * 0.25 + 0.75), beta = alpha * 0.25 * sqrt(3)
    assert math.isclose(a, 0.8, rel_tol=1e-12) and math.isclose(b, 0.8 * 0.25 * math.sqrt(3), rel_tol=1e-12)
    n = cdc.block_noise((20000, 1, 4, 4), torch.Generator().manual_seed(0))
    assert float(cdc.downsample(n, 2).abs().max()) < 1e-5
    flat = n[:, 0].reshape(len(n), 2, 2, 2, 2).permute(0, 1, 3, 2, 4).reshape(-1, 4)   # 2x2 blocks
    cov = torch.cov(flat.T)
    assert torch.allclose(cov.diagonal(), torch.ones(4), atol=0.03)
    assert torch.allclose(cov[0, 1:], torch.full((3,), -1 / 3), atol=0.03)


# ---- transport cost (Eq. 6)
def test_transport_cost_matches_the_closed_form():
    x = torch.tensor([[[[1.0, -1.0], [0.5, 0.0]]], [[[0.0, 0.0], [1.0, 1.0]]]])   # two 2x2 images
    x = x.repeat(5000, 1, 1, 1)
    plan = cdc.StagePlan(resolutions=(1, 2), sigma=0.3, tau=0.0)
    exact = cdc.transport_cost_analytic(x, plan)
    # by hand: stage 2 residual of image 1 = x - 0.125: mean square over 4 pixels and both images
    r1 = torch.tensor([1.0, -1.0, 0.5, 0.0]) - 0.125
    r2 = torch.tensor([0.0, 0.0, 1.0, 1.0]) - 0.5
    assert math.isclose(exact["per_stage"][1], float((r1.pow(2).mean() + r2.pow(2).mean()) / 2) + 0.09, rel_tol=1e-6)
    assert math.isclose(exact["per_stage"][0], float((0.125 ** 2 + 0.5 ** 2) / 2) + 1.0, rel_tol=1e-6)
    mc = cdc.transport_costs(x, plan, torch.Generator().manual_seed(0), draws=2)
    assert all(abs(a - b) < 0.02 for a, b in zip(mc["per_stage"], exact["per_stage"]))
    assert abs(mc["ratio"] - exact["ratio"]) < 0.02


def test_transport_cost_weighting_and_independent_control():
    x = _images(500, 8, seed=2)
    plan = cdc.StagePlan(sigma=0.25)
    e = cdc.transport_cost_analytic(x, plan)
    assert math.isclose(e["weighted"], (4 * e["per_stage"][0] + 16 * e["per_stage"][1] + 64 * e["per_stage"][2]) / 64,
                        rel_tol=1e-9)
    ind = cdc.transport_cost_analytic(x, cdc.StagePlan(coupling="independent"))
    assert ind["ratio"] > 1.0 > e["ratio"]


# ---- the DiT (Eq. 7)
def test_token_counts_and_position_embedding_shapes():
    m = cdc.StageDiT(resolution=8, n_stages=3, patch=2, width=32, depth=1, heads=4)
    seen = []
    m.embed[0].register_forward_hook(lambda mod, inp, out: seen.append(out.shape[1]))
    for k, r in enumerate((2, 4, 8)):
        m(torch.randn(2, 1, r, r), torch.rand(2), torch.randn(2, 1, r, r), k)
        assert seen[-1] == (r // 2) ** 2 == m.n_tokens(r)
        assert m.pos_embed(r // 2).shape == ((r // 2) ** 2, 32)


def test_full_res_stages_token_count():
    m = cdc.StageDiT(resolution=8, n_stages=3, patch=2, width=32, depth=1, heads=4, full_res_stages=True)
    seen = []
    m.embed[0].register_forward_hook(lambda mod, inp, out: seen.append(out.shape[1]))
    for k, r in enumerate((2, 4, 8)):
        out = m(torch.randn(2, 1, r, r), torch.rand(2), torch.randn(2, 1, r, r), k)
        assert out.shape == (2, 1, r, r) and seen[-1] == 16 == m.n_tokens(r)


def test_sincos_embedding_distinguishes_positions():
    pe = cdc.sincos_pos_embed(4, 32)
    assert torch.cdist(pe, pe).fill_diagonal_(1.0).min() > 1e-3


def test_stage_embedding_conditions_the_output():
    m = _perturbed_dit()
    x, t, xi = torch.randn(3, 1, 4, 4), torch.rand(3), torch.randn(3, 1, 4, 4)
    base = m(x, t, xi, 1)
    with torch.no_grad():
        m.stage_embed.weight[1] += 1.0
    assert (m(x, t, xi, 1) - base).abs().max() > 1e-3
    with torch.no_grad():                                       # other stages' embeddings do not matter for stage 1
        m.stage_embed.weight[2] += 1.0
    assert torch.allclose(m(x, t, xi, 1), m(x, t, xi, 1))


def test_adaln_zero_starts_at_zero_output():
    m = cdc.StageDiT(resolution=8, width=32, depth=2, heads=4)
    assert m(torch.randn(2, 1, 8, 8), torch.rand(2), torch.randn(2, 1, 8, 8), 2).abs().max() == 0


def test_per_stage_embeddings():
    m = cdc.StageDiT(resolution=8, width=32, depth=1, heads=4, per_stage_embed=True)
    assert len(m.embed) == 3 and len(m.out) == 3


def test_cascade_dispatches_by_stage():
    a, b = _perturbed_dit(n_stages=1), _perturbed_dit(n_stages=1)
    c = cdc.Cascade([a, b])
    x, t = torch.randn(2, 1, 4, 4), torch.rand(2)
    assert torch.equal(c(x, t, x, 1), b(x, t, x, 0)) and torch.equal(c(x, t, x, 0), a(x, t, x, 0))


# ---- CFG (Eq. 9) and label dropout
def test_cfg_w1_is_the_conditional_velocity_and_w_mixes():
    m = _perturbed_dit(n_classes=10)
    x, t, xi, y = torch.randn(4, 1, 8, 8), torch.rand(4), torch.randn(4, 1, 8, 8), torch.tensor([0, 3, 5, 9])
    vc, vu = m(x, t, xi, 2, y), m(x, t, xi, 2, torch.full_like(y, 10))
    assert torch.equal(cdc.guided_velocity(m, x, t, xi, 2, y, 1.0), vc)
    assert torch.allclose(cdc.guided_velocity(m, x, t, xi, 2, y, 0.0), vu, atol=1e-6)
    assert torch.allclose(cdc.guided_velocity(m, x, t, xi, 2, y, 3.0), vu + 3 * (vc - vu), atol=1e-5)
    assert not torch.allclose(vc, vu)


def test_label_dropout_rate():
    y = torch.zeros(10000, dtype=torch.long)
    out = cdc.drop_labels(y, 10, 0.1, torch.Generator().manual_seed(0))
    assert abs(float((out == 10).float().mean()) - 0.1) < 0.02
    assert set(out.unique().tolist()) <= {0, 10}


# ---- which coarse image builds the stage source
class _Recorder(nn.Module):
    n_classes = 0

    def __init__(self):
        super().__init__()
        self.xi = {}

    def forward(self, xt, t, xi, k, y=None):
        self.xi.setdefault(k, xi.clone())
        return torch.full_like(xt, 0.5)


def test_sampling_uses_the_generated_coarse_image():
    rec = _Recorder()
    outs = cdc.sample_cdc(rec, cdc.StagePlan(sigma=0.25), 6, (2, 1, 1), generator=torch.Generator().manual_seed(0))
    assert torch.equal(rec.xi[1], cdc.upsample(outs[0], 4)) and torch.equal(rec.xi[2], cdc.upsample(outs[1], 8))
    # Euler with a constant velocity 0.5 moves the source by exactly 0.5 at every stage
    assert len(outs) == 3 and outs[2].shape == (6, 1, 8, 8)


def test_training_uses_the_ground_truth_coarse_image():
    rec = _Recorder()
    x = _images(64, 8)
    cdc.cdc_loss(rec, x, cdc.StagePlan(tau=0.0), torch.Generator().manual_seed(0), stage=2)
    assert torch.equal(rec.xi[2], cdc.upsample(cdc.downsample(x, 4), 8))


def test_sampling_from_real_coarse_images_and_identity_flow():
    c = cdc.downsample(_images(5, 8), 4)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    out = cdc.sample_cdc(None, cdc.StagePlan(sigma=0.25), 0, (1, 1, 3), coarse=c, identity_stages=True, generator=g1)
    assert len(out) == 1
    assert torch.equal(out[0], cdc.upsample(c, 8) + 0.25 * torch.randn((5, 1, 8, 8), generator=g2))


def test_euler_is_exact_for_a_constant_field():
    class Const(nn.Module):
        n_classes = 0

        def forward(self, xt, t, xi, k, y=None):
            return torch.ones_like(xt)

    x0 = torch.zeros(3, 1, 4, 4)
    assert torch.allclose(cdc.euler_stage(Const(), x0, x0, 0, 7), torch.ones_like(x0), atol=1e-6)


# ---- training and evaluation helpers
def test_training_lowers_the_loss_and_logs_a_budget():
    x = _images(64, 8, seed=4)
    m = cdc.StageDiT(resolution=8, width=32, depth=1, heads=4)
    res = cdc.train_cdc(m, cdc.StagePlan(), x, steps=120, batch_size=32, lr=2e-3, ema=0.9,
                        generator=torch.Generator().manual_seed(0), X_val=x[:16], val_every=40, progress=False)
    h = res["history"]
    assert sum(h.losses["fm"][-20:]) / 20 < 0.8 * sum(h.losses["fm"][:10]) / 10
    assert res["budget"]["steps"] == 120 and res["budget"]["samples"] == 120 * 32 and len(res["val"]) == 3


def test_training_extends_until_plateau_up_to_max_steps():
    x = _images(64, 8, seed=5)
    m = cdc.StageDiT(resolution=8, n_stages=1, width=32, depth=1, heads=4)
    res = cdc.train_cdc(m, cdc.StagePlan(resolutions=(8,)), x, steps=40, max_steps=80, batch_size=16, lr=1e-3,
                        generator=torch.Generator().manual_seed(0), X_val=x[:8], val_every=10, progress=False)
    assert 40 <= res["budget"]["steps"] <= 80 and res["budget"]["steps"] % 10 == 0
    if res["budget"]["steps"] < 80:
        assert cdc.plateaued(res["val"], 0.02)


def test_plateau_rule():
    assert cdc.plateaued([1.0, 0.8, 0.7, 0.69, 0.69, 0.689, 0.688, 0.688])
    assert not cdc.plateaued([1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
    assert not cdc.plateaued([1.0, 0.9])


def test_interp_log_fd():
    # linear in log FD: halfway in wall-clock between FD 4 and FD 1 gives FD 2
    assert math.isclose(cdc.interp_log_fd(1.5, [1.0, 2.0], [4.0, 1.0]), 2.0, rel_tol=1e-9)
    assert cdc.interp_log_fd(0.1, [1.0, 2.0], [4.0, 1.0]) == pytest.approx(4.0)


def test_frechet_pca_judge_and_consistency():
    x = _images(400, 8, seed=6)
    y = (x.flatten(1).mean(1) > 0).long()
    j = cdc.ImageJudge(x, y, pca_dim=5)
    assert j.fd(x) < 1e-6
    assert j.fd(x + 0.5) > 1.0
    assert 0 <= j.scores(x)["entropy"] <= math.log(2) + 1e-9
    coarse = cdc.downsample(x, 4)
    assert cdc.stage_consistency([coarse, cdc.upsample(coarse, 8)])["mean"] < 1e-10


def test_dit_initialisation_drawn_from_the_generator():
    from genlab.core import rng
    kw = dict(resolution=8, n_stages=3, patch=2, width=32, depth=1, heads=4, n_classes=3)
    a, b = (cdc.StageDiT(**kw, generator=rng(0, "init")) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    c = cdc.StageDiT(**kw, generator=rng(1, "init"))
    assert not torch.equal(a.stage_embed.weight, c.stage_embed.weight) and not torch.equal(a.embed[0].weight, c.embed[0].weight)
    # the embeddings keep nn.Embedding's N(0, 1) law and the AdaLN-Zero gates and output layers start at zero
    big = cdc.StageDiT(resolution=8, n_stages=3, patch=2, width=256, depth=1, heads=4, n_classes=40, generator=rng(2, "init"))
    w = big.label_embed.weight.detach()
    assert abs(float(w.mean())) < 0.02 and abs(float(w.std()) - 1) < 0.02
    with torch.no_grad():
        assert float(big.out[0].weight.abs().max()) == 0 and float(big.blocks[0].ada[1].weight.abs().max()) == 0
