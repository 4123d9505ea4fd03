"""Unit tests for genlab.scfm, each against an independent oracle (closed form, Monte Carlo,
finite differences, Gauss-Hermite quadrature, torch.distributions, brute force)."""
import math

import numpy as np
import pytest
import torch

from genlab.core import ParameterError, resolve, rng
from genlab.data import sample_ring
from genlab.metrics import cluster_accuracy
from genlab.scfm import (PRESETS, SCFM, MixturePrior, SCFMConfig, StopRule, c6_statistic, categorical_kl, elbo_terms,
                         encode, gaussian_kl, make_pinwheel_data, make_ring_data, make_source, mixture_kl,
                         prior_match, results_table, run_2d, run_experiment, sample_pinwheel, sample_scfm,
                         scfm_losses, structured_coupling, summarise, train_scfm, transport_cost_per_dim,
                         trunk_parameters, icfm_params, matched_width, plateau_gain, linear_probe, velocity_params,
                         RecognitionNet, reparameterise)

torch.set_num_threads(1)


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(1)
    mq, mp = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    lq, lp = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mq, (0.5 * lq).exp()),
                                            torch.distributions.Normal(mp, (0.5 * lp).exp())).sum(-1)
    assert torch.allclose(gaussian_kl(mq, lq, mp, lp), ref, atol=1e-5)
    assert torch.allclose(gaussian_kl(mq, lq, mq, lq), torch.zeros(5), atol=1e-6)


def test_mixture_kl_against_monte_carlo():
    """Σ_c q(c) KL(q(z)‖p(z|c)) + KL(q(c)‖π) = E_q[log q(c,z) − log p(c,z)] within 3 standard errors (10⁵ samples)."""
    g = torch.Generator().manual_seed(2)
    prior = MixturePrior(3, 2, generator=g).double()
    with torch.no_grad():
        prior.logits_pi.copy_(torch.tensor([0.3, -0.5, 0.1]))
        prior.log_s.copy_(torch.tensor([[0.1, -0.3], [0.2, 0.0], [-0.4, 0.3]]))
    logits = torch.tensor([[0.5, 1.0, -1.0]], dtype=torch.float64)
    mu, logvar = torch.tensor([[0.3, -0.2]], dtype=torch.float64), torch.tensor([[-0.5, 0.2]], dtype=torch.float64)
    kl_z, kl_c = mixture_kl(logits, mu, logvar, prior)
    analytic = float((kl_z + kl_c).detach())
    n = 100_000
    qc = torch.softmax(logits[0], -1)
    c = torch.multinomial(qc, n, replacement=True, generator=g)
    z = mu + (0.5 * logvar).exp() * torch.randn(n, 2, generator=g, dtype=torch.float64)
    log_qz = torch.distributions.Normal(mu, (0.5 * logvar).exp()).log_prob(z).sum(-1)
    with torch.no_grad():
        log_p = prior.log_prob(c, z)
    vals = qc.log()[c] + log_qz - log_p
    se = float(vals.std() / math.sqrt(n))
    assert abs(float(vals.mean()) - analytic) <= 3 * se, (float(vals.mean()), analytic, se)


def test_elbo_bound_on_linear_gaussian_toy():
    """K=1, g(z) = a z + b, p(z) = N(0,1): ELBO ≤ log p(x), with equality at the exact posterior.
    Recon's expectation is computed exactly by Gauss-Hermite quadrature (it is quadratic in z)."""
    D, sigma = 3, 0.4
    a, b = torch.tensor([[1.0, -0.5, 0.7]], dtype=torch.float64), torch.tensor([0.2, 0.1, -0.3], dtype=torch.float64)
    dec = lambda z: z @ a + b  # noqa: E731
    prior = MixturePrior(1, 1).double()
    with torch.no_grad():
        prior.mu.zero_(); prior.log_s.zero_()
    x = torch.tensor([[0.5, -0.4, 0.9]], dtype=torch.float64)
    cov = a.T @ a + sigma ** 2 * torch.eye(D, dtype=torch.float64)
    logpx = float(torch.distributions.MultivariateNormal(b, cov).log_prob(x[0]))
    prec = 1 + float((a @ a.T)) / sigma ** 2
    post_var = 1 / prec
    post_mu = post_var * float((x - b) @ a.T) / sigma ** 2
    nodes, weights = np.polynomial.hermite.hermgauss(10)

    def elbo(m, v):
        mu, lv = torch.tensor([[m]], dtype=torch.float64), torch.tensor([[math.log(v)]], dtype=torch.float64)
        recon = 0.0
        for xi, w in zip(nodes, weights):
            z = mu + math.sqrt(2 * v) * xi
            r, kz, kc = elbo_terms(x, torch.zeros(1, 1, dtype=torch.float64), mu, lv, dec, prior, sigma, z=z)
            recon += w / math.sqrt(math.pi) * float(r)
        return recon - float(kz) - float(kc)

    assert abs(elbo(post_mu, post_var) - logpx) < 1e-4
    for m, v in [(post_mu + 0.3, post_var), (post_mu, 2 * post_var), (0.0, 1.0)]:
        assert elbo(m, v) < logpx - 1e-6


def test_prior_sampler_cluster_frequencies():
    g = torch.Generator().manual_seed(3)
    prior = MixturePrior(4, 2, generator=g)
    with torch.no_grad():
        prior.logits_pi.copy_(torch.tensor([1.0, 0.0, -1.0, 0.5]))
    c, z = prior.sample(100_000, g)
    freq = torch.bincount(c, minlength=4).double() / len(c)
    assert torch.allclose(freq, torch.softmax(prior.logits_pi.detach().double(), 0), atol=0.01)
    # component moments
    sel = z[c == 0]
    assert torch.allclose(sel.mean(0), prior.mu[0].detach(), atol=0.03)


def test_categorical_posterior_normalised_and_kl():
    g = torch.Generator().manual_seed(4)
    m = SCFM(3, 5, 2, hidden=16, dec_hidden=16, generator=g)
    q, mu = encode(m, torch.randn(50, 3, generator=g), t=0.3)
    assert q.shape == (50, 5) and mu.shape == (50, 2)
    assert torch.allclose(q.sum(1), torch.ones(50), atol=1e-6) and (q >= 0).all()
    lp, lq = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    p, qq = torch.softmax(lp, -1), torch.softmax(lq, -1)
    brute = (p * (p.log() - qq.log())).sum(-1)
    assert torch.allclose(categorical_kl(lp, lq), brute, atol=1e-6)


def test_coupling_shapes_and_stop_gradient_to_source():
    g = torch.Generator().manual_seed(5)
    m = SCFM(4, 3, 2, hidden=16, dec_hidden=16, generator=g)
    x1 = torch.randn(8, 4, generator=g)
    x0, z, q = structured_coupling(m, x1, g)
    assert x0.shape == (8, 4) and z.shape == (8, 2) and q.shape == (8, 3)
    terms = scfm_losses(m, x1, torch.rand(8, generator=g), generator=g, fm_grad_to_source=False)
    terms["fm"].backward()
    assert all(p.grad is None or float(p.grad.abs().max()) == 0 for p in m.decoder.parameters())
    m.zero_grad(set_to_none=True)
    terms = scfm_losses(m, x1, torch.rand(8, generator=g), generator=g, fm_grad_to_source=True)
    terms["fm"].backward()
    assert any(p.grad is not None and float(p.grad.abs().max()) > 0 for p in m.decoder.parameters())


def test_concat_source_mode():
    g = torch.Generator().manual_seed(6)
    z = torch.randn(5, 2, generator=g)
    x0 = make_source(z, None, 0.2, 6, "concat", g)
    assert x0.shape == (5, 6) and torch.equal(x0[:, :2], z)
    with pytest.raises(ParameterError):
        make_source(torch.randn(5, 7), None, 0.2, 6, "concat", g)


def test_cluster_accuracy_permutation_invariant():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 300)
    pred = np.where(rng.random(300) < 0.7, y, rng.integers(0, 5, 300))
    perm = rng.permutation(5)
    assert cluster_accuracy(y, pred) == cluster_accuracy(y, perm[pred])
    assert cluster_accuracy(y, perm[y]) == 1.0


def _short_run(seed):
    g = rng(seed, "test")  # draws the data, every layer's initial weights, the training and the sampling noise
    x = sample_ring(512, g, std=0.3)
    m = SCFM(2, 8, 2, hidden=32, dec_hidden=32, generator=g)
    h = train_scfm(m, x / 3, steps=5, batch_size=64, lr=1e-3, generator=g, pretrain_steps=3, progress=False)
    return h.losses["loss"], sample_scfm(m, 10, 2, g)["x"]


def test_seeded_run_bit_reproducible():
    l1, s1 = _short_run(7)
    l2, s2 = _short_run(7)
    assert l1 == l2 and len(l1) == 5 and torch.equal(s1, s2)


def test_sampler_endpoints_and_fixed_cluster():
    g = torch.Generator().manual_seed(8)
    m = SCFM(2, 4, 2, hidden=16, dec_hidden=16, generator=g)
    out = sample_scfm(m, 12, 4, g, c=1, return_path=True)
    assert (out["c"] == 1).all() and out["path"].shape == (5, 12, 2)
    assert torch.equal(out["path"][0], out["x0"]) and torch.equal(out["path"][-1], out["x"])


@pytest.mark.parametrize("bad", [{"n_clusters": 0}, {"digit_clusters": 0}, {"sigma0": -0.1}, {"sigma0": 0.0},
                                 {"sigma0": 0.7}, {"latent_2d": 0}, {"latent_digits": 0}, {"source_mode": "stack"},
                                 {"lt_mode": "x"}, {"section": "video"}, {"nfes": (1, 5)}, {"pretrain_steps": 400}])
def test_bad_config_rejected(bad):
    with pytest.raises(ParameterError) as e:
        resolve(PRESETS, "smoke", **bad)
    assert list(bad)[0] in str(e.value)


def test_bad_model_arguments_rejected():
    with pytest.raises(ParameterError):
        SCFM(2, 0, 2)
    with pytest.raises(ParameterError):
        SCFM(2, 3, 0)
    with pytest.raises(ParameterError):
        SCFM(2, 3, 2, sigma0=-1.0)
    with pytest.raises(ParameterError):
        SCFM(2, 3, 2, source_mode="unknown")


def test_pinwheel_generator_and_ring_data():
    g = torch.Generator().manual_seed(9)
    x, y = sample_pinwheel(100, g, n_arms=5)
    assert x.shape == (500, 2) and torch.bincount(y).tolist() == [100] * 5
    d = make_ring_data(0, n_train=4000, n_val=10, n_test=10)  # D1 standardised: radius 4, std 0.3 -> per-axis sd sqrt(8 + 0.09)
    assert torch.bincount(d["y_train"], minlength=8).min() > 400 and abs(float(d["x_train"].std(0).mean()) - 1) < 1e-4
    raw = d["x_train"] * math.sqrt(8 + 0.09)
    assert abs(float(raw.norm(dim=1).mean()) - 4.0) < 0.1


def test_model_initialisation_drawn_from_the_generator():
    a, b = (SCFM(3, 4, 2, hidden=16, dec_hidden=16, generator=rng(0, "init")) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    c = SCFM(3, 4, 2, hidden=16, dec_hidden=16, generator=rng(1, "init"))
    assert not torch.equal(a.net.inp.weight, c.net.inp.weight)


def test_independent_coupling_source_ignores_the_posterior():
    """coupling='independent': the L_FM partner is N(0, I) whatever the decoder and posterior (same generator, same loss)."""
    g0 = torch.Generator().manual_seed(11)
    m = SCFM(3, 4, 2, hidden=16, dec_hidden=16, generator=g0)
    x1, t = torch.randn(32, 3, generator=g0), torch.rand(32, generator=g0)
    a = scfm_losses(m, x1, t, generator=torch.Generator().manual_seed(1), coupling="independent")["fm"]
    with torch.no_grad():
        for p in m.decoder.parameters():
            p.add_(1.0)
    b = scfm_losses(m, x1, t, generator=torch.Generator().manual_seed(1), coupling="independent")
    assert torch.equal(a, b["fm"])
    b["fm"].backward()
    assert all(p.grad is None or float(p.grad.abs().max()) == 0 for p in m.decoder.parameters())
    # the same partner by hand: the generator's first draws go to z, then to x0 ~ N(0, I)
    g = torch.Generator().manual_seed(1)
    torch.randn(32, 2, generator=g)
    x0 = torch.randn(32, 3, generator=g)
    xt = (1 - t[:, None]) * x0 + t[:, None] * x1
    v = m.net.velocity(m.net.features(xt, t))
    assert torch.allclose(((v - (x1 - x0)) ** 2).sum(-1).mean(), a, atol=1e-6)


def test_c6_statistic_zero_when_the_network_ignores_t():
    g = torch.Generator().manual_seed(12)
    m = SCFM(2, 3, 2, hidden=16, dec_hidden=16, generator=g)
    with torch.no_grad():
        m.net.temb.weight.zero_()
    out = c6_statistic(m, torch.randn(100, 2, generator=g), g)
    assert abs(out["delta"]) < 1e-6 and set(out["kl_time"]) == {0.0, 0.25, 0.5}


def test_stop_rule_semantics_and_best_checkpoint():
    lin = torch.nn.Linear(1, 1)
    vals = iter([1.0, 0.9, 0.88, 0.87, 0.86])
    states = []

    def score():
        v = next(vals)
        with torch.no_grad():
            lin.bias.fill_(v)
        return v
    rule = StopRule(score, lin, patience=3, min_improvement=0.05)
    stops = [rule(i * 10) for i in range(5)]
    assert stops == [False, False, False, False, True] and rule.stopped and not rule.hit_budget
    assert rule.best == 0.86 and rule.best_step == 41
    with torch.no_grad():
        lin.bias.fill_(5.0)
    rule.restore_best()
    assert float(lin.bias) == pytest.approx(0.86)
    rule2 = StopRule(iter([3.0, 2.0, 1.0]).__next__, lin, patience=3)
    assert not any(rule2(i) for i in range(3)) and rule2.hit_budget   # still improving when the budget ends


def test_prior_match_tv_against_hand_computation_and_transport_cost():
    g = torch.Generator().manual_seed(13)
    m = SCFM(2, 3, 2, hidden=16, dec_hidden=16, generator=g)
    with torch.no_grad():
        m.net.logits_c.weight.zero_()
        m.net.logits_c.bias.copy_(torch.tensor([1.0, 0.0, -1.0]))
        m.prior.logits_pi.copy_(torch.tensor([0.0, 0.5, 0.2]))
    out = prior_match(m, torch.randn(200, 2, generator=g), g, n=400)
    q, pi = torch.softmax(torch.tensor([1.0, 0.0, -1.0]), 0), torch.softmax(torch.tensor([0.0, 0.5, 0.2]), 0)
    assert out["tv_pi"] == pytest.approx(float(0.5 * (q - pi).abs().sum()), abs=1e-6)
    x0, x1 = torch.randn(50, 4, generator=g), torch.randn(50, 4, generator=g)
    assert transport_cost_per_dim(x0, x1) == pytest.approx(float(((x1 - x0) ** 2).sum() / 200), rel=1e-6)


def test_trunk_parameters_are_the_shared_layers():
    m = SCFM(2, 3, 2, hidden=16, n_layers=3)
    ids = {id(p) for p in trunk_parameters(m.net)}
    heads = list(m.net.logits_c.parameters()) + list(m.net.vel.parameters())
    assert len(ids) == 2 + 2 + 2 * 2 and not any(id(p) in ids for p in heads)


def test_2d_harness_on_a_50_step_toy_run():
    """run_2d trains SCFM, its controls and B1 with the stopping rule and returns every metric the notebook records."""
    cfg = SCFMConfig(max_steps_2d=50, max_steps_c6=50, pretrain_steps=5, eval_every_2d=20, n_eval=100, nfes=(1, 2), hidden_2d=16)
    d = make_ring_data(0, n_train=300, n_val=100, n_test=100)
    r = run_2d(cfg, d, 0, variants=("scfm", "indep", "c6", "c6_blind"))
    assert set(r["eval"]) == {"scfm", "indep", "c6", "c6_blind", "b1", "b1m"} and set(r["eval"]["scfm"]["fid"]) == {0, 1, 2}
    e = r["eval"]["scfm"]
    for key in ("nmi", "acc", "ari", "sizes", "n_big", "tc", "m5", "m9", "c6", "nmi_t", "nmi_t_indep"):
        assert key in e, key
    assert set(e["m5"]) == {"mmd", "floor", "tv_pi"} and set(e["tc"]) == {"structured", "independent", "shuffled"}
    assert len(e["sizes"]) == 8 and abs(sum(e["sizes"]) - 1) < 1e-5 and r["models"]["c6"].sigma0 == 0.5
    assert r["models"]["c6_blind"].sigma0 == 0.5 and r["budgets"]["b1"]["params"] == icfm_params(2, 16)
    # B1m: the I-CFM at SCFM's parameter count (within one width step), wider than B1
    step = icfm_params(2, r["budgets"]["b1m"]["hidden"] + 1) - icfm_params(2, r["budgets"]["b1m"]["hidden"])
    assert abs(r["budgets"]["b1m"]["params"] - r["budgets"]["scfm"]["params"]) <= step and r["budgets"]["b1m"]["hidden"] > 16
    for v in ("scfm", "indep", "c6", "c6_blind", "b1", "b1m"):
        b = r["budgets"][v]
        assert b["plateau_gain"] == plateau_gain(r["curves"][v]["values"], cfg.patience)
        assert b["steps"] <= 50 and b["samples"] == b["steps"] * cfg.batch_size and len(r["curves"][v]["values"]) >= 1
    assert r["budgets"]["scfm"]["pretrain_steps"] == 10 and "nmi" in r["ctrl_kmeans_noise"]
    s = summarise(r)
    assert {"nmi", "tc_ratio", "fid_scfm_2", "fid_b1_2", "m5_mmd", "steps_b1"} <= set(s)
    table = results_table({"toy": [s, s]}, [("nmi", "NMI"), ("fid_b1_2", "B1")])
    assert table.count("\n") == 3 and " ± 0 |" in table.replace("± 0.0", "± 0")


def test_digits_harness_logs_usage_and_gradients():
    cfg = SCFMConfig(max_steps_digits=40, pretrain_steps=5, eval_every_d3=20, usage_every=10, grad_every=10, n_eval=60,
                     nfes=(2,), hidden_digits=16, latent_digits=3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(150, 6, generator=g)
    y = torch.arange(150) % 10  # 5 test points per class for the 5-fold probe
    d = {"name": "D3", "kind": "digits", "k": 10, "x_train": x[:80], "y_train": y[:80], "x_val": x[80:100],
         "y_val": y[80:100], "x_test": x[100:], "y_test": y[100:], "feat": lambda a: a.detach().double()[:, :3]}
    r = run_experiment(cfg, d, 0, ("scfm", "b3"), log_usage=("scfm", "b3"), log_grads=("scfm",))
    u = r["usage"]["scfm"]
    assert u.steps[0] == 10 and len(u.steps) == len(u.sizes) == len(u.pi) == len(u.nmi) >= 3
    gl = r["grads"]["scfm"]
    assert len(gl.steps) >= 3 and all(len(gl.norms[k]) == len(gl.steps) for k in ("fm", "lvm", "t"))
    assert all(v > 0 for v in gl.norms["lvm"]) and set(r["eval"]["b3"]["fid"]) == {0}


def test_icfm_params_closed_form_and_matched_width():
    """The closed-form parameter count equals the module's; matched_width is the nearest width (brute force)."""
    for dim, h, L in ((2, 7, 3), (64, 33, 2), (5, 1, 1)):
        assert icfm_params(dim, h, L) == sum(p.numel() for p in velocity_params(RecognitionNet(dim, 3, 2, hidden=h, n_layers=L)))
    for target in (1000, 56632, 266096):
        w = matched_width(target, 64)
        assert w == min(range(1, 2000), key=lambda h: abs(icfm_params(64, h) - target))


def test_plateau_gain_matches_the_stop_rule():
    """A model the stopping rule stopped has gain <= min_improvement over its last `patience` scores; a still-improving one more."""
    lin = torch.nn.Linear(1, 1)
    vals = [1.0, 0.7, 0.69, 0.68, 0.67]
    rule = StopRule(iter(vals).__next__, lin, patience=3, min_improvement=0.05)
    assert [rule(i) for i in range(5)][-1] and plateau_gain(rule.values, 3) <= 0.05
    improving = [1.0, 0.8, 0.6, 0.4]
    assert plateau_gain(improving, 3) == pytest.approx((1.0 - 0.4) / 1.0) and plateau_gain(improving[:3], 3) == math.inf


def test_linear_probe_oracles():
    rng_ = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 30)
    assert linear_probe(np.eye(4)[y] * 3 + 0.05 * rng_.normal(size=(120, 4)), y) == 1.0
    assert linear_probe(rng_.normal(size=(120, 4)), y) < 0.5  # chance is 0.25


def test_blind_distillation_reads_the_posterior_at_t_one():
    """lt_mode='blind': L_T is the distillation KL into the posterior of h(x_t, 1), recomputed by hand from the same draws."""
    m = SCFM(2, 3, 2, hidden=16, dec_hidden=16, generator=rng(0, "blind"))
    x1, t = torch.randn(32, 2, generator=rng(1, "x")), torch.rand(32, generator=rng(1, "t"))
    terms = scfm_losses(m, x1, t, generator=rng(2, "g"), lt_mode="blind", lambda_t=0.5)
    g = rng(2, "g")
    with torch.no_grad():
        l1, mu1, lv1 = m.net.posterior(m.net.features(x1, torch.ones(32)))
        z = reparameterise(mu1, lv1, g)
        x0 = m.source(z, g)
        xt = (1 - t)[:, None] * x0 + t[:, None] * x1
        lb, mb, vb = m.net.posterior(m.net.features(xt, torch.ones(32)))
        want = 0.5 * (categorical_kl(l1, lb) + gaussian_kl(mu1, lv1, mb, vb)).mean()
    assert torch.allclose(terms["t"].detach(), want, atol=1e-6)
    aware = scfm_losses(m, x1, t, generator=rng(2, "g"), lt_mode="distill", lambda_t=0.5)
    assert not torch.allclose(aware["t"], terms["t"])  # the time-aware L_T reads h(x_t, t)
