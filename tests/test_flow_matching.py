import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from genlab.core import ParameterError
from genlab.flow_matching import (PRESETS, VelocityMLP, cfm_loss, held_out_pairs, ot_coupling, ot_plan_index,
                                  path_straightness, sample_euler, sample_ode, sample_path, shuffled_ot_coupling,
                                  train_cfm, transport_cost)
from genlab.core import resolve


def g(s=0):
    return torch.Generator().manual_seed(s)


@pytest.mark.parametrize("seed", range(5))
def test_ot_coupling_equals_brute_force_assignment(seed):
    x0, x1 = torch.randn(6, 2, generator=g(seed)), torch.randn(6, 2, generator=g(100 + seed))
    best = min(float(((x0 - x1[list(p)]) ** 2).sum()) for p in itertools.permutations(range(6)))
    a, b = ot_coupling(x0, x1)
    assert torch.equal(a, x0)
    assert abs(float(((a - b) ** 2).sum()) - best) < 1e-5
    assert sorted(map(tuple, b.tolist())) == sorted(map(tuple, x1.tolist()))      # a permutation of x1


def test_ot_coupling_matches_scipy_on_larger_batches():
    x0, x1 = torch.randn(64, 5, generator=g(1)), torch.randn(64, 5, generator=g(2))
    c = torch.cdist(x0.double(), x1.double()).pow(2).numpy()
    r, col = linear_sum_assignment(c)
    a, b = ot_coupling(x0, x1)
    assert abs(transport_cost(a, b) - c[r, col].mean()) < 1e-4


def test_shuffled_ot_control_is_a_uniformly_random_pairing():
    # the control's pairing ignores geometry: over many batches each row of x0 meets each row of x1 equally often,
    # and its mean cost equals the independent pairing's (the exact expectation: mean over all pairs)
    x0, x1 = torch.randn(5, 2, generator=g(3)), torch.randn(5, 2, generator=g(4)) * 3
    gen, counts, costs = g(5), np.zeros((5, 5)), []
    j_ot = ot_plan_index(x0, x1)
    for _ in range(4000):
        a, b = shuffled_ot_coupling(x0, x1, gen)
        assert torch.equal(a, x0) and sorted(map(tuple, b.tolist())) == sorted(map(tuple, x1.tolist()))
        j = [int((x1 == row).all(1).nonzero()[0]) for row in b]
        counts[range(5), j] += 1
        costs.append(transport_cost(a, b))
    assert np.abs(counts / 4000 - 0.2).max() < 0.03                          # uniform over partners (sd ~ 0.006)
    all_pairs = float(torch.cdist(x0, x1).pow(2).mean())
    assert abs(np.mean(costs) - all_pairs) < 0.03 * all_pairs
    assert transport_cost(x0, x1[j_ot]) < all_pairs                          # while OT itself pairs by geometry


def test_held_out_pairs_follow_the_coupling_within_batches():
    x0, x1 = torch.randn(40, 3, generator=g(6)), torch.randn(40, 3, generator=g(7)) + 1
    a, b = held_out_pairs(x0, x1, "independent", 16)
    assert torch.equal(a, x0) and torch.equal(b, x1)
    a, b = held_out_pairs(x0, x1, "ot", 16)
    for i in range(0, 40, 16):                                               # each minibatch is its own OT problem
        assert torch.equal(b[i:i + 16], ot_coupling(x0[i:i + 16], x1[i:i + 16])[1])
    a, b = held_out_pairs(x0, x1, "shuffled_ot", 16, g(8))
    assert torch.equal(a, x0) and sorted(map(tuple, b[:16].tolist())) == sorted(map(tuple, x1[:16].tolist()))
    with pytest.raises(ParameterError, match="coupling"):
        held_out_pairs(x0, x1, "sinkhorn", 16)


def test_path_endpoints_and_velocity_by_finite_differences():
    x0, x1 = torch.randn(8, 3, generator=g(0), dtype=torch.float64), torch.randn(8, 3, generator=g(1), dtype=torch.float64)
    zeros, ones = torch.zeros(8, dtype=torch.float64), torch.ones(8, dtype=torch.float64)
    assert torch.equal(sample_path(x0, x1, zeros)[0], x0) and torch.allclose(sample_path(x0, x1, ones)[0], x1)
    t = torch.rand(8, generator=g(2), dtype=torch.float64)
    h = 1e-6
    fd = (sample_path(x0, x1, t + h)[0] - sample_path(x0, x1, t - h)[0]) / (2 * h)
    assert torch.allclose(fd, sample_path(x0, x1, t)[1], atol=1e-8)
    # with noise the velocity target is unchanged and x_t moves by sigma * noise
    noise = torch.randn(8, 3, generator=g(3), dtype=torch.float64)
    xt, ut = sample_path(x0, x1, t, sigma=0.1, noise=noise)
    assert torch.allclose(xt - sample_path(x0, x1, t)[0], 0.1 * noise) and torch.equal(ut, x1 - x0)


def test_loss_is_zero_for_the_exact_velocity():
    class Exact(torch.nn.Module):  # for a single pair the conditional velocity is x1 - x0 everywhere
        def __init__(self, d): super().__init__(); self.d = d
        def forward(self, t, x): return self.d.expand_as(x)
    x0, x1 = torch.zeros(4, 2), torch.ones(4, 2)
    assert float(cfm_loss(Exact(x1[0] - x0[0]), x0, x1, torch.rand(4, generator=g()))) == 0.0


def test_euler_and_dopri_on_a_linear_field():
    class Linear(torch.nn.Module):  # dx/dt = -x  ->  x(1) = x0 e^{-1}
        def forward(self, t, x): return -x
    x0 = torch.randn(10, 2, generator=g(0))
    exact = x0 * np.exp(-1)
    assert torch.allclose(sample_euler(Linear(), x0, 1000), exact, atol=1e-3)
    x1, nfe = sample_ode(Linear(), x0, rtol=1e-7, atol=1e-7)
    assert torch.allclose(x1, exact, atol=1e-5) and nfe > 6
    _, path = sample_euler(Linear(), x0, 50, return_path=True)
    assert path.shape == (51, 10, 2) and path_straightness(path) > 0


def test_training_lowers_loss_and_ot_coupling_lowers_cost():
    gauss = lambda n, gen: torch.randn(n, 2, generator=gen) * 0.3 + 3.0
    losses = {}
    for coupling in ("independent", "ot"):
        m = VelocityMLP(2, 32, 2)
        h = train_cfm(m, gauss, coupling=coupling, steps=200, batch_size=64, lr=3e-3, generator=g(0), progress=False)
        losses[coupling] = h.last("cfm", 20)
        assert h.last("cfm", 20) < np.mean(h.losses["cfm"][:5])
    assert losses["ot"] < losses["independent"]


def test_bad_inputs():
    with pytest.raises(ParameterError, match="coupling"):
        train_cfm(VelocityMLP(2), lambda n, gen: torch.zeros(n, 2), coupling="sinkhorn", steps=1)
    with pytest.raises(ParameterError, match="n_steps"):
        sample_euler(VelocityMLP(2), torch.zeros(3, 2), 0)
    with pytest.raises(ParameterError, match="toy_steps"):
        resolve(PRESETS, "smoke", toy_steps=0)
    with pytest.raises(ParameterError, match="equal batch shapes"):
        ot_coupling(torch.zeros(3, 2), torch.zeros(4, 2))
