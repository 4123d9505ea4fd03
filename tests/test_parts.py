"""The shared building blocks of genlab.parts against closed forms, brute force, finite differences and torch's own
initialisation."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from genlab.core import ParameterError, rng
from genlab.parts import (TopKSAE, aux_k_loss, linear, linear_interpolant, mlp, time_embedding, topk_sae_quality,
                          train_topk_sae)


# ---------------------------------------------------------------------------------------------- time embedding
def test_time_embedding_hand_computed_value_and_frequencies():
    e = time_embedding(torch.tensor([0.5]), 4, low=1.0, high=100.0)
    assert torch.allclose(e, torch.tensor([[math.sin(0.5), math.sin(50.0), math.cos(0.5), math.cos(50.0)]]))
    e = time_embedding(torch.tensor([2.0, -1.0], dtype=torch.float64), 6, low=1.0, high=4.0)   # f = 1, 2, 4
    want = torch.tensor([[math.sin(2), math.sin(4), math.sin(8), math.cos(2), math.cos(4), math.cos(8)],
                         [math.sin(-1), math.sin(-2), math.sin(-4), math.cos(-1), math.cos(-2), math.cos(-4)]],
                        dtype=torch.float64)
    assert torch.allclose(e, want, atol=1e-15)
    f = time_embedding(torch.tensor([1e-9], dtype=torch.float64), 16, low=2.0, high=500.0)[0, :8] / 1e-9
    assert torch.allclose(f, 2.0 * 250.0 ** (torch.arange(8, dtype=torch.float64) / 7), rtol=1e-9)
    assert torch.allclose(time_embedding(torch.tensor([0.3]), 2, low=3.0, high=99.0),     # one frequency: low
                          torch.tensor([[math.sin(0.9), math.cos(0.9)]]))


def test_time_embedding_reproduces_the_method_copies():
    "The formulas the methods wrote for themselves are settings of (low, high)."
    t = torch.rand(50, generator=rng(0, "t"), dtype=torch.float64)
    h = 16
    i = torch.arange(h, dtype=torch.float64)
    cases = {  # name: (frequencies as the method wrote them, low, high)
        "flow_matching": (1000.0 * torch.exp(-math.log(1000.0) * i / h), 1000.0, 1000.0 ** (1 / h)),
        "cdc": (1000.0 * torch.exp(-math.log(10000.0) * i / h), 1000.0, 1000.0 * 10000.0 ** (-(h - 1) / h)),
        "scfm": (torch.exp(torch.linspace(0.0, math.log(100.0), h, dtype=torch.float64)), 1.0, 100.0),
        "heat_diffusion": (torch.exp(torch.linspace(0, math.log(1000.0), h, dtype=torch.float64)) * math.pi,
                           math.pi, 1000.0 * math.pi),
    }
    for name, (freqs, low, high) in cases.items():
        a = t[:, None] * freqs[None]
        assert torch.allclose(time_embedding(t, 2 * h, low=low, high=high), torch.cat([a.sin(), a.cos()], 1),
                              atol=1e-9), name


def test_time_embedding_shape_dtype_device_and_bad_input():
    assert time_embedding(0.3, 8).shape == (1, 8)
    assert time_embedding(torch.tensor(0.3), 8).shape == (1, 8)
    assert time_embedding(torch.arange(5), 6).dtype == torch.float32
    for dt in (torch.float16, torch.float32, torch.float64):
        assert time_embedding(torch.rand(3).to(dt), 8).dtype == dt
    e = time_embedding(torch.rand(7, dtype=torch.float64), 32)
    assert e.shape == (7, 32) and torch.allclose(e[:, :16] ** 2 + e[:, 16:] ** 2, torch.ones(7, 16, dtype=torch.float64))
    assert time_embedding(torch.zeros(3, device="meta"), 8).device.type == "meta"
    if torch.cuda.is_available():
        assert time_embedding(torch.rand(3, device="cuda"), 8).device.type == "cuda"
    for bad in (dict(dim=7), dict(dim=0), dict(dim=8.0), dict(dim=8, low=0.0), dict(dim=8, high=-1.0)):
        with pytest.raises(ParameterError):
            time_embedding(torch.rand(3), **bad)


# ---------------------------------------------------------------------------------------------- linear / mlp
def test_mlp_structure_and_activations():
    net = mlp([3, 16, 16, 2], act="tanh", generator=rng(0, "init"))
    assert [type(m).__name__ for m in net] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    assert [(m.in_features, m.out_features) for m in net if isinstance(m, nn.Linear)] == [(3, 16), (16, 16), (16, 2)]
    assert [type(m).__name__ for m in mlp([2, 5, 1], last_act=True)] == ["Linear", "SiLU", "Linear", "SiLU"]
    for act, cls in (("silu", nn.SiLU), ("relu", nn.ReLU), ("tanh", nn.Tanh), ("gelu", nn.GELU)):
        assert isinstance(mlp([2, 3, 1], act=act)[1], cls)
    assert net(torch.randn(4, 3)).shape == (4, 2)
    with pytest.raises(ParameterError, match="act must be one of"):
        mlp([2, 3], act="sigmoid")
    with pytest.raises(ParameterError, match="sizes"):
        mlp([4])
    with pytest.raises(ParameterError, match="d_in"):
        mlp([0, 3])


def test_mlp_same_generator_same_weights_and_no_global_draw():
    state = torch.random.get_rng_state()
    a = mlp([3, 8, 2], generator=rng(0, "init"))
    b = mlp([3, 8, 2], generator=rng(0, "init"))
    c = mlp([3, 8, 2], generator=rng(1, "init"))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a[0].weight, c[0].weight)


def test_linear_draw_order_matches_skae():
    "Layer by layer, weight then bias, each (rand * 2 - 1) / sqrt(d_in): the draw skae's _linear made."
    g_ref = torch.Generator().manual_seed(5)
    ref = []
    for d_in, d_out in ((4, 6), (6, 3)):
        ref.append((torch.rand(d_out, d_in, generator=g_ref) * 2 - 1) / math.sqrt(d_in))
        ref.append((torch.rand(d_out, generator=g_ref) * 2 - 1) / math.sqrt(d_in))
    net = mlp([4, 6, 3], act="relu", generator=torch.Generator().manual_seed(5))
    assert all(torch.allclose(p, r) for p, r in zip(net.parameters(), ref))


def test_linear_init_law_is_torch_default():
    "Weights and biases U(-1/sqrt(d_in), 1/sqrt(d_in)): the bound, the variance 1/(3 d_in), and torch's own law."
    from scipy.stats import ks_2samp
    d_in = 256
    lay = linear(d_in, 2048, generator=rng(0, "law"))
    w, b, bound = lay.weight.detach().flatten().double(), lay.bias.detach().double(), 1 / math.sqrt(d_in)
    assert w.abs().max() <= bound and b.abs().max() <= bound and w.abs().max() > 0.999 * bound
    assert abs(float(w.var()) * 3 * d_in - 1) < 4.5 * math.sqrt(0.8 / w.numel())     # sd of a uniform's variance
    assert abs(float(b.var()) * 3 * d_in - 1) < 4.5 * math.sqrt(0.8 / b.numel())
    assert abs(float(w.mean())) < 4.5 * bound / math.sqrt(3 * w.numel())
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ref = nn.Linear(d_in, 2048)
    rw = ref.weight.detach().flatten().double()
    assert abs(float(rw.var()) * 3 * d_in - 1) < 4.5 * math.sqrt(0.8 / rw.numel())   # the oracle obeys Eq. 2 too
    assert ks_2samp(w.numpy(), rw.numpy()).pvalue > 1e-3
    assert ks_2samp(b.numpy(), ref.bias.detach().double().numpy()).pvalue > 1e-3
    assert linear(3, 2, bias=False).bias is None


# ---------------------------------------------------------------------------------------------- linear interpolant
def test_linear_interpolant_endpoints_broadcasting_and_derivative():
    g = rng(0, "path")
    x0 = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    x1 = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    t = torch.rand(5, generator=g, dtype=torch.float64)
    xt, ut = linear_interpolant(x0, x1, t)
    assert xt.shape == x0.shape and torch.equal(ut, x1 - x0)
    assert torch.equal(linear_interpolant(x0, x1, torch.zeros(5, dtype=torch.float64))[0], x0)
    assert torch.equal(linear_interpolant(x0, x1, torch.ones(5, dtype=torch.float64))[0], x1)
    for i in range(5):
        assert torch.allclose(xt[i], (1 - t[i]) * x0[i] + t[i] * x1[i])
    h = 1e-6
    fd = (linear_interpolant(x0, x1, t + h)[0] - linear_interpolant(x0, x1, t - h)[0]) / (2 * h)
    assert torch.allclose(fd, ut, atol=1e-8)
    a, b = x0[:, 0, 0], x1[:, 0, 0]                                                   # (b, d) and a scalar t
    assert torch.allclose(linear_interpolant(a, b, 0.25)[0], 0.75 * a + 0.25 * b)
    assert torch.allclose(linear_interpolant(a, b, t)[0], (1 - t[:, None]) * a + t[:, None] * b)
    with pytest.raises(ParameterError, match="same shape"):
        linear_interpolant(a, b[:, :2], t)
    with pytest.raises(ParameterError, match="one entry per row"):
        linear_interpolant(a, b, t[:3])


# ---------------------------------------------------------------------------------------------- TopK SAE
def test_topk_sae_codes_shapes_and_layout():
    sae = TopKSAE(12, 40, 4, generator=rng(0, "sae"))
    assert sae.W_enc.shape == (12, 40) and sae.W_dec.shape == (40, 12)
    assert sae.b_pre.shape == (12,) and sae.b_enc.shape == (40,)
    assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(40)) and torch.equal(sae.W_enc, sae.W_dec.T)
    x = torch.randn(64, 12, generator=rng(0, "x"))
    x_hat, z = sae(x)
    assert z.shape == (64, 40) and x_hat.shape == (64, 12)
    assert ((z != 0).sum(1) == 4).all()
    p = sae.pre(x)
    top = p.topk(4, dim=1)
    assert torch.equal(z.gather(1, top.indices), top.values)
    assert torch.allclose(sae.decode(sae.encode(x)), z @ sae.W_dec + sae.b_pre)
    zr = TopKSAE(12, 40, 4, generator=rng(0, "sae"), relu=True).encode(x - 10.0)    # ReLU: at most k, positive
    assert ((zr != 0).sum(1) <= 4).all() and (zr >= 0).all()
    a, b = TopKSAE(6, 9, 2, generator=rng(0, "s")), TopKSAE(6, 9, 2, generator=rng(0, "s"))
    assert all(torch.equal(u, v) for u, v in zip(a.parameters(), b.parameters()))
    with pytest.raises(ParameterError, match="k must be in"):
        TopKSAE(12, 8, 9)


def test_aux_k_loss_brute_force_zero_when_none_dead_and_reaches_only_dead_latents():
    sae = TopKSAE(12, 40, 4, generator=rng(0, "sae"))
    x = torch.randn(64, 12, generator=rng(0, "x"))
    e = torch.randn(64, 12, generator=rng(0, "e"))
    p = sae.pre(x)
    assert float(aux_k_loss(sae, p, e, torch.zeros(40, dtype=torch.bool), 8)) == 0.0
    dead = torch.arange(40) % 5 == 0
    loss = aux_k_loss(sae, p, e, dead, 3)
    idx = torch.nonzero(dead).flatten()
    with torch.no_grad():
        ref = sum(float((e[r] - p[r, idx[p[r, idx].argsort(descending=True)[:3]]]
                         @ sae.W_dec[idx[p[r, idx].argsort(descending=True)[:3]]]).pow(2).sum()) for r in range(64)) / 64
    assert abs(float(loss.detach()) - ref) < 1e-5 * ref
    loss.backward()
    assert (sae.W_dec.grad[~dead] == 0).all() and (sae.W_dec.grad[dead] != 0).any()
    assert (sae.W_enc.grad[:, ~dead] == 0).all() and (sae.W_enc.grad[:, dead] != 0).any()
    # more dead latents asked for than exist: all of them are used
    few = torch.zeros(40, dtype=torch.bool)
    few[[3, 7]] = True
    with torch.no_grad():
        want = (e - p[:, [3, 7]] @ sae.W_dec[[3, 7]]).pow(2).sum(1).mean()
        assert torch.allclose(aux_k_loss(sae, p, e, few, 10), want)


def test_train_topk_sae_aux_is_zero_while_nothing_is_dead_and_history_fields():
    X = torch.randn(512, 8, generator=rng(0, "X"))
    sae = TopKSAE(8, 16, 2, generator=rng(0, "init"))
    hist = train_topk_sae(sae, X, steps=30, batch=64, dead_steps=1000, generator=rng(0, "b"))
    assert set(hist.losses) == {"fvu", "aux", "dead_frac", "loss"} and len(hist.losses["fvu"]) == 30
    assert all(v == 0.0 for v in hist.losses["aux"]) and all(v == 0.0 for v in hist.losses["dead_frac"])
    assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(16), atol=1e-5)         # renormalised every step
    assert int(sae.steps_since_fired.max()) <= 30
    # dead_steps = 0: from the second step on, every latent that fired neither then nor now is dead, aux is on
    sae0 = TopKSAE(8, 16, 2, generator=rng(0, "init"))
    h0 = train_topk_sae(sae0, X, steps=5, batch=4, dead_steps=0, generator=rng(0, "b"))
    assert h0.losses["aux"][0] == 0.0 and h0.losses["dead_frac"][0] == 0.0          # step 0: nothing can be dead yet
    assert all(v > 0 for v in h0.losses["aux"][1:]) and all(0 < v < 1 for v in h0.losses["dead_frac"][1:])
    with pytest.raises(ParameterError, match=r"X must be \(n, 8\)"):
        train_topk_sae(sae, torch.randn(10, 7), steps=1)
    with pytest.raises(ParameterError, match="b_pre must be one of"):
        train_topk_sae(sae, X, steps=1, b_pre="zero")
    with pytest.raises(ParameterError, match="X is on meta but the SAE on cpu"):
        train_topk_sae(sae, torch.zeros(10, 8, device="meta"), steps=1)


def test_train_topk_sae_b_pre_init_and_reproducibility():
    X = torch.randn(300, 6, generator=rng(0, "X")) * 2 + 3
    a = TopKSAE(6, 12, 2, generator=rng(0, "i"))
    train_topk_sae(a, X, steps=0, b_pre="mean")
    assert torch.allclose(a.b_pre, X.mean(0))
    train_topk_sae(a, X, steps=0, b_pre="median", generator=rng(0, "m"))
    perm = torch.randperm(300, generator=rng(0, "m"))
    assert torch.allclose(a.b_pre, X[perm].median(0).values)
    before = a.b_pre.detach().clone()
    train_topk_sae(a, X, steps=0, b_pre=None)
    assert torch.equal(a.b_pre, before)
    runs = []
    for _ in range(2):
        s = TopKSAE(6, 12, 2, generator=rng(0, "i"))
        runs.append((s, train_topk_sae(s, X, steps=20, batch=32, generator=rng(0, "b"))))
    assert runs[0][1].losses == runs[1][1].losses
    assert all(torch.equal(p, q) for p, q in zip(runs[0][0].parameters(), runs[1][0].parameters()))


def _planted(seed):
    A = torch.randn(24, 16, generator=rng(seed, "planted", "dictionary"))
    A = A / A.norm(dim=1, keepdim=True)

    def data(n, name):
        g = rng(seed, "planted", name)
        idx = torch.rand(n, 24, generator=g).argsort(1)[:, :3]
        return torch.zeros(n, 24).scatter(1, idx, 0.5 + torch.rand(n, 3, generator=g)) @ A
    return A, data(8192, "train"), data(2048, "test")


def _recovered(sae, A, thr=0.9):
    cos = A @ (sae.W_dec / sae.W_dec.norm(dim=1, keepdim=True)).T
    return float((cos.max(1).values > thr).float().mean())


@pytest.mark.parametrize("relu,b_pre", [(False, "mean"), (True, "median")])
def test_topk_sae_recovers_a_planted_dictionary(relu, b_pre):
    "x = sparse positive combinations of 24 unit atoms in R^16: most atoms get a decoder row at cosine > 0.9."
    A, X, X_test = _planted(0)
    sae = TopKSAE(16, 48, 3, generator=rng(0, "planted", "init"), relu=relu)
    assert _recovered(sae, A) < 0.2                                                   # a random decoder does not
    hist = train_topk_sae(sae, X, steps=1500, batch=256, lr=3e-3, dead_steps=50, b_pre=b_pre,
                          generator=rng(0, "planted", "batches"))
    assert _recovered(sae, A) >= 0.8
    q = topk_sae_quality(sae, X_test, chunk=500)
    assert q["fvu"] < 0.1 and abs(q["ev"] - (1 - q["fvu"])) < 1e-12 and 0 <= q["dead_frac"] < 0.5
    assert hist.last("fvu", 100) < 0.1


def test_topk_sae_quality_against_direct_computation():
    sae = TopKSAE(5, 20, 2, generator=rng(0, "q"))
    X = torch.randn(100, 5, generator=rng(0, "X"))
    with torch.no_grad():
        x_hat, z = sae(X)
        fvu = float((X - x_hat).pow(2).sum() / (X - X.mean(0)).pow(2).sum())
        dead = float(((z != 0).sum(0) == 0).float().mean())
    q = topk_sae_quality(sae, X, chunk=7)
    assert abs(q["fvu"] - fvu) < 1e-5 and q["dead_frac"] == dead


def test_layers_without_a_generator_are_real_tensors_on_the_default_device():
    import torch

    from genlab.parts import linear, mlp
    net = mlp([3, 4, 2])                                      # no generator: torch's global one, no meta tensors
    assert all(p.device == torch.get_default_device() and not p.is_meta for p in net.parameters())
    assert net(torch.randn(5, 3)).shape == (5, 2) and not linear(3, 2).weight.is_meta
