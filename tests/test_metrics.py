import numpy as np
import ot
import pytest
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from genlab.core import ParameterError
from genlab.metrics import (ari, classifier_scores, cluster_accuracy, energy_distance, explained_variance,
                            frechet_distance, kl_divergence, mmd_rbf, nmi, sliced_w2, tv_distance)


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_sliced_w2_matches_pot_and_1d_exact():
    x, y = torch.randn(400, 3, generator=g(0)), torch.randn(400, 3, generator=g(1)) * 1.5 + 0.5
    ours = sliced_w2(x, y, n_proj=2000, generator=g(2))
    pot = ot.sliced_wasserstein_distance(x.double().numpy(), y.double().numpy(), n_projections=2000, seed=3)
    assert abs(ours - pot) / pot < 0.05
    # in 1-D the sliced distance is the exact W2 between sorted samples
    a, b = torch.randn(300, 1, generator=g(4)), torch.randn(300, 1, generator=g(5)) + 1
    exact = float(((a.double().sort(0).values - b.double().sort(0).values) ** 2).mean().sqrt())
    assert abs(sliced_w2(a, b, n_proj=3, generator=g(6)) - exact) < 1e-12


def test_mmd_is_zero_in_expectation_and_matches_direct_formula():
    x, y = torch.randn(60, 2, generator=g(0)), torch.randn(50, 2, generator=g(1)) + 1
    k = lambda a, b: sum(np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / (2 * h * h)) for h in (0.5, 1, 2, 4))
    X, Y = x.double().numpy(), y.double().numpy()
    kxx, kyy, kxy = k(X, X), k(Y, Y), k(X, Y)
    ref = (kxx.sum() - np.trace(kxx)) / (60 * 59) + (kyy.sum() - np.trace(kyy)) / (50 * 49) - 2 * kxy.mean()
    assert abs(mmd_rbf(x, y) - ref) < 1e-10


def test_energy_distance_against_scipy_in_1d():
    from scipy.stats import energy_distance as sp_energy
    x, y = torch.randn(200, 1, generator=g(0)), torch.randn(150, 1, generator=g(1)) + 0.7
    # scipy returns sqrt(2E|X-Y| - E|X-X'| - E|Y-Y'|) with V-statistics
    assert abs(np.sqrt(energy_distance(x, y)) - sp_energy(x[:, 0].numpy(), y[:, 0].numpy())) < 1e-6


def test_frechet_closed_form():
    a = torch.randn(40000, 2, generator=g(0))
    b = torch.randn(40000, 2, generator=g(1)) * 3 + torch.tensor([1.0, -1.0])
    # |mu|^2 = 2; tr(S1 + S2 - 2 sqrt(S1 S2)) = 2 * (1 + 9 - 6) = 8
    assert abs(frechet_distance(a, b) - 10.0) < 0.3


def test_tv_kl_and_input_checks():
    assert tv_distance([0.2, 0.8], [0.6, 0.4]) == pytest.approx(0.4)
    assert kl_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(np.log(2))
    assert kl_divergence([0.5, 0.5], [1.0, 0.0]) == float("inf")
    with pytest.raises(ParameterError, match="sum to 1"):
        tv_distance([0.2, 0.2], [0.5, 0.5])
    with pytest.raises(ParameterError, match="equal sample sizes"):
        sliced_w2(torch.zeros(3, 2), torch.zeros(4, 2))


def test_clustering_scores_against_sklearn_and_brute_force():
    rng = np.random.default_rng(0)
    t, p = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    assert nmi(t, p) == pytest.approx(normalized_mutual_info_score(t, p))
    assert ari(t, p) == pytest.approx(adjusted_rand_score(t, p))
    import itertools
    best = max(np.mean(np.array(perm)[p] == t) for perm in itertools.permutations(range(4)))
    assert cluster_accuracy(t, p) == pytest.approx(best)


def test_explained_variance_and_classifier_scores():
    x = torch.randn(100, 3, generator=g(0))
    assert explained_variance(x, x.mean(0).expand_as(x)) == pytest.approx(0.0, abs=1e-12)
    clf = torch.nn.Linear(2, 2)
    with torch.no_grad():
        clf.weight.copy_(torch.tensor([[10.0, 0.0], [0.0, 10.0]])); clf.bias.zero_()
    s = classifier_scores(clf, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.51, 0.5], [1.0, 0.0]]))
    assert s["confident_frac"] == 0.75 and s["hist"] == [0.75, 0.25] and s["hist_max_over_uniform"] == 1.5
