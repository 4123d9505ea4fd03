"""Device discipline, checked without a GPU: every tensor a function creates follows its inputs' device.

The inputs live on the `meta` device (shapes and dtypes, no data). `DeviceAudit` watches every aten op the
call runs and lists the ones that would break, or silently move data, on a GPU:

- a factory (`torch.zeros(k)`, `torch.arange(k)`, `torch.randn(n, generator=g)`) that makes a non-scalar tensor
  on another device than the inputs' (the CPU, usually: a missing `device=`);
- an op that mixes non-scalar tensors of two devices (legal for a few ops on `meta`, an error on CUDA);
- `.numpy()` on a device tensor (a numpy round trip without `.cpu()`) raises, as it does on CUDA.

Meta tensors hold no data, so reading a scalar (`float(t)`, `.item()`, `bool(t)`) returns a stand-in (0.5, 1,
False) and an explicit host copy (`.cpu()`) returns zeros: the function runs to its end. Data samplers are
also checked against the device of their generator: with torch's default device set to `meta` and a CPU
generator, a sampler that follows its generator returns CPU tensors; one that ignores it returns meta ones
(and on a GPU, with a CUDA generator, raises).

A device mistake found later gets a test here first (as a strict xfail naming its cause while it is open).
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from genlab import data, metrics, parts

META = torch.device("meta")
aten = torch.ops.aten


class DeviceAudit(TorchDispatchMode):
    "Runs ops as usual and records in `problems` each one that leaves `device` (see the module docstring)."

    def __init__(self, device: torch.device = META):
        super().__init__()
        self.device, self.problems, self.ops = torch.device(device), [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_dev = [t for t in ins if t.device.type == self.device.type]
        self.ops += 1
        if func is aten._local_scalar_dense.default and on_dev:  # .item(), float(t), bool(t) on a meta tensor
            return {torch.bool: False}.get(ins[0].dtype, 0.5 if ins[0].is_floating_point() else 1)
        if func is aten._to_copy.default and on_dev and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type == "cpu":  # an explicit host copy: zeros stand in for data
            return torch.zeros(ins[0].shape, dtype=kwargs.get("dtype") or ins[0].dtype)
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        devs = {t.device.type for t in ins if t.dim() > 0}
        if len(devs) > 1:
            self.problems.append(f"{func} mixes devices {sorted(devs)}")
        elif not ins:
            off = [t for t in outs if t.device.type != self.device.type and t.dim() > 0]
            if off:
                self.problems.append(f"{func} created a {tuple(off[0].shape)} tensor on {off[0].device.type}")
        return out


def audit(fn, *args, **kwargs):
    "Run `fn(*args, **kwargs)` under a `DeviceAudit` on meta; assert nothing left the device; return the result."
    with DeviceAudit() as a:
        out = fn(*args, **kwargs)
    assert a.ops > 0, "the call ran no tensor op: nothing was checked"
    assert not a.problems, f"{getattr(fn, '__name__', fn)}: " + "; ".join(a.problems)
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor):
            assert t.device == META, f"{getattr(fn, '__name__', fn)} returned a tensor on {t.device}, inputs on meta"
    return out


def m(*shape, dtype=torch.float32):
    return torch.empty(*shape, device=META, dtype=dtype)


# ---- the audit itself catches what it claims to (else every test below would pass vacuously)

def test_audit_flags_a_cpu_factory():
    with pytest.raises(AssertionError, match="created a \\(3,\\) tensor on cpu"):
        audit(lambda x: x * torch.ones(3).sum(), m(3))


def test_audit_flags_mixed_devices():
    with pytest.raises(AssertionError, match="mixes devices"):
        audit(lambda x: x @ torch.ones(3, 2), m(4, 3))  # matmul meta @ cpu runs on meta; it raises on CUDA


def test_audit_flags_numpy_round_trip_and_cpu_result():
    with pytest.raises(TypeError, match="numpy"):
        audit(lambda x: x.numpy(), m(3))
    with pytest.raises(AssertionError, match="returned a tensor on cpu"):
        audit(lambda x: torch.as_tensor(x.cpu().numpy()) + 1, m(3))  # host copy is allowed, a CPU result is not


def test_audit_passes_device_following_code():
    out = audit(lambda x: float((x + torch.zeros(3, device=x.device) + torch.tensor(1.0)).sum()), m(3))
    assert out == 0.5  # the stand-in for a scalar read off a meta tensor


# ---- genlab.parts

def test_time_embedding_follows_t():
    e = audit(parts.time_embedding, m(7), 16)
    assert e.shape == (7, 16) and e.dtype == torch.float32
    assert audit(parts.time_embedding, m(5, dtype=torch.float64), 8).dtype == torch.float64


@pytest.mark.parametrize("t", [0.3, "vector"])
def test_linear_interpolant_follows_x0(t):
    t = m(4) if t == "vector" else t
    xt, ut = audit(parts.linear_interpolant, m(4, 3), m(4, 3), t)
    assert xt.shape == ut.shape == (4, 3)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: parts.time_embedding(x[:, 0], 8), id="time_embedding"),
    pytest.param(lambda x: parts.linear_interpolant(x, x, 0.5)[0], id="linear_interpolant"),
    pytest.param(lambda x: metrics.entropy_from_logits(x), id="entropy_from_logits"),
    pytest.param(lambda x: metrics.entropy(x.softmax(-1)), id="entropy"),
])
def test_inputs_keep_their_device_under_another_default_device(fn):
    x = torch.rand(4, 3)
    with torch.device(META):  # torch's default device is not the input's
        out = fn(x)
    assert out.device.type == "cpu", f"the result moved to {out.device}, the input is on cpu"


def test_mlp_and_linear_follow_the_default_device():
    with torch.device(META):
        net = parts.mlp([3, 8, 2], act="relu")
        lin = parts.linear(3, 5, bias=True)
    assert {p.device for p in [*net.parameters(), *lin.parameters()]} == {META}
    assert audit(net, m(4, 3)).shape == (4, 2)


def test_topk_sae_on_the_device():
    with torch.device(META):
        sae = parts.TopKSAE(6, 12, 3)
    assert {t.device for t in [*sae.parameters(), *sae.buffers()]} == {META}
    x_hat, z = audit(sae, m(5, 6))
    assert x_hat.shape == (5, 6) and z.shape == (5, 12)
    dead = torch.ones(12, dtype=torch.bool, device=META)
    assert audit(parts.aux_k_loss, sae, m(5, 12), m(5, 6), dead, 4).shape == ()
    q = audit(parts.topk_sae_quality, sae, m(10, 6), chunk=4)
    assert set(q) == {"fvu", "ev", "dead_frac"}


# ---- genlab.data: the samplers draw on their generator's device (and on the default device without one)

SAMPLERS = ["ring", "8gaussians", "moons", "gaussian", "checkerboard"]  # TOY_SAMPLERS["8gaussians"] is sample_ring


def _draw(name, g):
    return data.sample_toy(name, 16, g)


def test_toy_sampler_lists_are_complete():
    assert set(SAMPLERS) == set(data.TOY_SAMPLERS)


@pytest.mark.parametrize("name", SAMPLERS)
def test_sampler_follows_its_generator(name):
    with torch.device(META):  # the default device is not the generator's
        x = _draw(name, torch.Generator())
    assert x.device.type == "cpu", f"sample_{name} drew on {x.device}, its generator is on cpu"


@pytest.mark.parametrize("name", SAMPLERS)
def test_sampler_without_generator_follows_the_default_device(name):
    with torch.device(META):
        x = _draw(name, None)
    assert x.device == META and x.shape == (16, 2)


def test_sample_gmm_follows_its_means():
    audit(data.sample_gmm, 16, m(3, 2), 1.0)


# ---- genlab.metrics

@pytest.mark.parametrize("fn", [metrics.mmd_rbf, metrics.energy_distance, metrics.explained_variance])
def test_sample_metrics_stay_on_the_device(fn):
    assert isinstance(audit(fn, m(20, 3), m(20, 3)), float)


def test_entropies_and_hit_rate_stay_on_the_device():
    assert audit(metrics.entropy, m(4, 5)).shape == (4,)
    assert audit(metrics.entropy_from_logits, m(4, 5)).shape == (4,)
    assert isinstance(audit(metrics.hit_rate_at_k, m(6, 5, dtype=torch.long), m(6, dtype=torch.long), 3), float)


def test_ndcg_stays_on_the_device():
    audit(metrics.ndcg_at_k, m(6, 5, dtype=torch.long), m(6, dtype=torch.long), 3)


def test_sliced_w2_stays_on_the_device():
    audit(metrics.sliced_w2, m(20, 3), m(20, 3), 8)


def test_frechet_distance_copies_to_the_host():
    audit(metrics.frechet_distance, m(20, 3), m(20, 3))


# ---- a method's steps: the flow-matching template

def test_flow_matching_model_and_loss_on_the_device():
    fm = pytest.importorskip("genlab.flow_matching")
    with torch.device(META):
        model = fm.VelocityMLP(2, hidden=16, n_layers=2, time_dim=8)
    assert audit(model, m(5), m(5, 2)).shape == (5, 2)
    assert audit(model, 0.25, m(5, 2)).shape == (5, 2)  # a Python time is put on x's device
    assert audit(fm.cfm_loss, model, m(5, 2), m(5, 2), m(5), 0.1).shape == ()


def test_flow_matching_euler_sampler_on_the_device():
    fm = pytest.importorskip("genlab.flow_matching")
    with torch.device(META):
        model = fm.VelocityMLP(2, hidden=16, n_layers=2, time_dim=8)
    audit(fm.sample_euler, model, m(5, 2), 3)


def test_flow_matching_ot_coupling_on_the_device():
    fm = pytest.importorskip("genlab.flow_matching")
    pytest.importorskip("ot")
    audit(fm.ot_coupling, m(6, 2), m(6, 2))
