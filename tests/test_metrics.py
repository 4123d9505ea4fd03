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


# ---- shared pieces moved into the core (issue 11): entropies, ranking metrics, Fréchet on PCA features ----
import math

from scipy import stats as _stats

from genlab.metrics import (conditional_entropy, entropy, entropy_from_logits, frechet_distance_pca, hit_rate_at_k,
                            mutual_information, ndcg_at_k, rank_metrics)


def test_entropy_matches_scipy():
    p = torch.rand(5, 7, generator=g(0), dtype=torch.float64)
    p[0, :3] = 0
    p = p / p.sum(1, keepdim=True)
    assert torch.allclose(entropy(p), torch.from_numpy(_stats.entropy(p.numpy(), axis=1)), atol=1e-12)
    assert torch.allclose(entropy(p, base=2), torch.from_numpy(_stats.entropy(p.numpy(), base=2, axis=1)), atol=1e-12)
    logits = torch.log(p)                                # zeros become -inf: masked choices
    assert torch.allclose(entropy_from_logits(logits), entropy(p), atol=1e-12)
    with pytest.raises(ParameterError, match="negative"):
        entropy(torch.tensor([0.5, -0.1, 0.6]))


def test_conditional_entropy_and_mutual_information_brute_force():
    j = torch.rand(4, 6, generator=g(1), dtype=torch.float64)
    j = j / j.sum()
    px = j.sum(1)
    h_cond = sum(float(px[x]) * float(_stats.entropy((j[x] / px[x]).numpy())) for x in range(4))
    assert abs(conditional_entropy(j) - h_cond) < 1e-12
    mi = float((j * torch.log(j / (px[:, None] * j.sum(0)[None]))).sum())
    assert abs(mutual_information(j) - mi) < 1e-12
    indep = px[:, None] * j.sum(0)[None]
    assert abs(mutual_information(indep)) < 1e-12
    with pytest.raises(ParameterError, match="sum to 1"):
        conditional_entropy(j * 2)


def test_rank_metrics_brute_force():
    gen = g(2)
    top = torch.stack([torch.randperm(30, generator=gen)[:10] for _ in range(200)])
    y = torch.randint(0, 30, (200,), generator=gen)
    for k in (1, 5, 10):
        hr = np.mean([int(y[i]) in top[i, :k].tolist() for i in range(200)])
        nd = np.mean([1 / math.log2(top[i].tolist().index(int(y[i])) + 2) if int(y[i]) in top[i, :k].tolist() else 0.0
                      for i in range(200)])
        assert abs(hit_rate_at_k(top, y, k) - hr) < 1e-6 and abs(ndcg_at_k(top, y, k) - nd) < 1e-6
    assert set(rank_metrics(top, y)) == {"HR@5", "NDCG@5", "HR@10", "NDCG@10"}
    with pytest.raises(ParameterError, match="k must be"):
        hit_rate_at_k(top, y, 11)


def test_frechet_distance_pca():
    x = torch.randn(3000, 10, generator=g(3), dtype=torch.float64)
    y = torch.randn(3000, 10, generator=g(4), dtype=torch.float64) * 1.5 + 0.3
    assert abs(frechet_distance_pca(x, y, k=10) - frechet_distance(x, y)) < 1e-6    # k = d: a rotation
    # y varies along 2 directions only: on its 2 components the distance is that of the projected data
    basis = torch.linalg.qr(torch.randn(10, 2, generator=g(5), dtype=torch.float64))[0]
    y2 = torch.randn(3000, 2, generator=g(6), dtype=torch.float64) @ basis.T * 3
    x2 = torch.randn(3000, 2, generator=g(7), dtype=torch.float64) @ basis.T * 3 + 0.1 * x
    fd2 = frechet_distance_pca(x2, y2, k=2)
    assert abs(fd2 - frechet_distance(x2 @ basis, y2 @ basis)) < 1e-6
    with pytest.raises(ParameterError, match="k must be"):
        frechet_distance_pca(x, y, k=11)
