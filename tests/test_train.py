import math

import pytest
import torch

from genlab.core import ParameterError
from genlab.train import NonFiniteLossError, fit


def test_fit_reaches_least_squares_solution():
    g = torch.Generator().manual_seed(0)
    A, b = torch.randn(50, 3, generator=g), torch.randn(50, generator=g)
    w = torch.zeros(3, requires_grad=True)
    h = fit(lambda s: {"mse": ((A @ w - b) ** 2).mean()}, [w], steps=1500, lr=0.05, progress=False)
    ref = torch.linalg.lstsq(A, b[:, None]).solution[:, 0]
    assert torch.allclose(w.detach(), ref, atol=1e-3)
    assert h.steps == 1500 and len(h.losses["mse"]) == 1500 and h.losses["loss"] == h.losses["mse"]


def test_only_grad_terms_are_optimised_and_all_are_logged():
    w = torch.ones(1, requires_grad=True)
    h = fit(lambda s: {"a": (w ** 2).sum(), "monitor": 7.0, "detached": w.detach().sum()},
            [w], steps=5, lr=0.1, optimizer="sgd", progress=False)
    assert h.losses["monitor"] == [7.0] * 5
    # d/dw w^2 = 2w; SGD: w <- w (1 - 0.2) each step
    assert math.isclose(float(w.detach()), 0.8 ** 5, rel_tol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fit_names_step_and_term_on_nonfinite_loss(bad):
    w = torch.ones(1, requires_grad=True)
    with pytest.raises(NonFiniteLossError, match=r"step 3: loss term 'kl' is (nan|inf)"):
        fit(lambda s: {"rec": w.sum() ** 2, "kl": w.sum() * (bad if s == 3 else 1.0)}, [w], steps=10, progress=False)


def test_callbacks_stop_and_every():
    w = torch.ones(1, requires_grad=True)
    seen = []
    h = fit(lambda s: {"l": w.sum() ** 2}, [w], steps=100, progress=False,
            callbacks=[lambda step, hist: step == 9], every=[(4, lambda step, hist: seen.append(step))])
    assert h.steps == 10 and h.stopped_early and seen == [3, 7]


def test_bad_arguments():
    w = torch.ones(1, requires_grad=True)
    with pytest.raises(ParameterError, match="optimizer"):
        fit(lambda s: {"l": w.sum()}, [w], steps=1, optimizer="lbfgsx", progress=False)
    with pytest.raises(ParameterError, match="no term that requires grad"):
        fit(lambda s: {"l": 1.0}, [w], steps=1, progress=False)
    with pytest.raises(ParameterError, match="steps"):
        fit(lambda s: {"l": w.sum()}, [w], steps=-1, progress=False)


def test_cosine_schedule_ends_near_zero():
    w = torch.ones(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1.0)
    fit(lambda s: {"l": w.sum()}, [w], steps=10, optimizer=opt, schedule="cosine", progress=False)
    assert opt.param_groups[0]["lr"] < 0.05


@pytest.mark.parametrize("schedule,warmup", [("cosine", 0), ("cosine", 5), (None, 4), ("constant", 1)])
def test_schedules_follow_the_closed_form(schedule, warmup):
    "fit's rate at every step (torch schedulers) equals the closed form: linear warm-up (k+1)/w, then cosine or constant."
    steps, lr = 30, 0.3
    w = torch.ones(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=lr)
    seen = []
    fit(lambda s: (seen.append(opt.param_groups[0]["lr"]), {"l": w.sum()})[1], [w], steps=steps, optimizer=opt,
        schedule=schedule, warmup=warmup, progress=False)

    def closed(k):
        if k < warmup:
            return lr * (k + 1) / warmup
        if schedule == "cosine":
            return lr * 0.5 * (1 + math.cos(math.pi * (k - warmup) / (steps - warmup)))
        return lr
    assert seen == pytest.approx([closed(k) for k in range(steps)], rel=1e-9, abs=1e-12)


def test_unknown_schedule_is_rejected_before_training():
    w = torch.ones(1, requires_grad=True)
    with pytest.raises(ParameterError, match="schedule"):
        fit(lambda s: {"l": w.sum()}, [w], steps=3, schedule="linear", progress=False)


def test_grad_norm_is_logged_before_clipping():
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    opt = torch.optim.SGD([w], lr=1.0)
    h = fit(lambda s: {"l": (w * torch.tensor([3.0, 4.0])).sum()}, [w], steps=1, optimizer=opt, grad_clip=1.0,
            track_grad_norm=True, progress=False)
    assert abs(h.losses["grad_norm"][0] - 5.0) < 1e-6
    assert torch.allclose(w.detach(), torch.tensor([3.0 - 0.6, 4.0 - 0.8]), atol=1e-5)   # the step used the clipped gradient
    w2 = torch.tensor([1.0, 2.0, 2.0], requires_grad=True)
    h = fit(lambda s: {"l": (w2 ** 2).sum() / 2}, [w2], steps=1, lr=0.0, optimizer="sgd", track_grad_norm=True, progress=False)
    assert abs(h.losses["grad_norm"][0] - 3.0) < 1e-6
    assert "grad_norm" not in fit(lambda s: {"l": w2.sum()}, [w2], steps=1, progress=False).losses


def test_validation_monitor_stops_at_the_plateau_and_keeps_the_best_weights():
    from genlab.train import ValidationMonitor, budget
    g = torch.Generator().manual_seed(0)
    A, Av = torch.randn(64, 4, generator=g), torch.randn(64, 4, generator=g)
    w_true = torch.randn(4, generator=g)
    b, bv = A @ w_true, Av @ w_true + 0.5 * torch.randn(64, generator=g)
    lin = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(lin.weight)
    mon = ValidationMonitor(lambda: ((lin(Av)[:, 0] - bv) ** 2).mean(), patience=4, model=lin)
    h = fit(lambda s: {"mse": ((lin(A)[:, 0] - b) ** 2).mean()}, lin, steps=20000, lr=0.05, progress=False,
            every=[(25, mon)])
    assert mon.stopped and h.stopped_early and h.steps < 20000
    assert mon.best == min(mon.values) and mon.converged()
    mon.restore_best()
    assert abs(float(((lin(Av)[:, 0] - bv) ** 2).mean()) - mon.best) < 1e-6
    row = budget(h, lin, 64, mon, stop="patience 4")
    assert row["params"] == 4 and row["samples"] == 64 * h.steps and row["converged"]


def test_monitor_reports_a_run_still_improving():
    from genlab.train import ValidationMonitor
    mon = ValidationMonitor(lambda: 0.0)
    mon.values = [1.0, 0.8, 0.6, 0.4]
    assert not mon.converged() and mon.relative_improvement() > 0.3


def test_monitor_improvement_rule_holds_for_negative_losses():
    "A held-out score below zero (e.g. a negative ELBO) improves when it falls by the relative margin of |best|."
    from genlab.train import ValidationMonitor
    vals = iter([-10.0, -10.005, -11.0])   # -10.005 is within 0.1% of |-10|: not an improvement; -11 is
    mon = ValidationMonitor(lambda: next(vals), patience=5, min_rel_delta=1e-3)
    mon(0, None); mon(1, None)
    assert mon.best == -10.0 and mon.bad == 1
    mon(2, None)
    assert mon.best == -11.0 and mon.best_step == 3          # steps are counted from 1
    vals2 = iter([-10.0, -9.995])          # worse (higher) is never an improvement, whatever the sign
    mon2 = ValidationMonitor(lambda: next(vals2), patience=5, min_rel_delta=1e-3)
    mon2(0, None); mon2(1, None)
    assert mon2.best == -10.0 and mon2.best_step == 1
