"""Unit tests of the logic the comparison notebook defines (nbs/19_flows_compared.ipynb exports nothing: its helper cell,
marked `# flows_compared: helpers`, is executed here and checked against independent oracles)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from genlab.core import ParameterError

ROOT = Path(__file__).resolve().parent.parent
NB = ROOT / "nbs" / "19_flows_compared.ipynb"


@pytest.fixture(scope="module")
def h():
    cells = ["".join(c["source"]) for c in json.loads(NB.read_text())["cells"] if c["cell_type"] == "code"]
    src = [c for c in cells if c.startswith("# flows_compared: helpers")]
    assert len(src) == 1, "the notebook must have exactly one helper cell"
    ns = {}
    exec("import math, numpy as np, torch\nfrom genlab.core import ParameterError, check_range, stream_seed\n"
         "from genlab.metrics import entropy, frechet_distance\nfrom genlab.stats import estimate\n" + src[0], ns)
    return ns


def test_no_default_exp_and_marker():
    cells = json.loads(NB.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells)
    import re
    assert not re.search(r"^#\| (default_exp|export)", text, re.M)
    assert "<!-- genlab: comparison notebook -->" in "".join(cells[0]["source"])


def test_cdc_split(h):
    assert h["cdc_split"](6) == (2, 2, 2) and h["cdc_split"](60, 3) == (20, 20, 20) and h["cdc_split"](8, 4) == (2,) * 4
    for bad in (7, 2):
        with pytest.raises(ParameterError, match="nfe"):
            h["cdc_split"](bad)


def test_scfm_budget_inside_the_shared_one(h):
    assert h["scfm_main_steps"](1500, 300) + 2 * 300 == 1500
    with pytest.raises(ParameterError, match="pretrain"):
        h["scfm_main_steps"](100, 50)


def test_budget_parity(h):
    rows = {"a": {"samples": 192_000}, "b": {"samples": 192_000}, "stein": {"samples": None}}
    assert h["budget_parity"](rows) == 1.0
    rows["c"] = {"samples": 384_000}
    assert h["budget_parity"](rows) == 2.0
    with pytest.raises(ValueError):
        h["budget_parity"]({"stein": {"samples": None}})


def test_transport_cost_against_a_loop(h):
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(7, 5, generator=g).double(), torch.randn(7, 5, generator=g).double()
    oracle = sum(float((x1[i, j] - x0[i, j]) ** 2) for i in range(7) for j in range(5)) / 35
    assert abs(h["transport_cost"](x0, x1) - oracle) < 1e-10
    with pytest.raises(ParameterError):
        h["transport_cost"](x0, x1[:3])


def test_label_coverage_closed_forms(h):
    assert abs(h["label_coverage"](np.arange(10).repeat(3)) - 1.0) < 1e-12         # uniform: all 10 classes
    assert abs(h["label_coverage"](np.zeros(5, int)) - 0.1) < 1e-12                # one class
    lab = np.array([0] * 50 + [1] * 50)                                             # two equal classes: exp(ln 2) / 10
    assert abs(h["label_coverage"](lab) - 0.2) < 1e-12
    from scipy.stats import entropy
    lab = np.random.default_rng(0).integers(0, 10, 200)
    assert abs(h["label_coverage"](lab) - np.exp(entropy(np.bincount(lab, minlength=10) / 200)) / 10) < 1e-12


def test_judge_fd_against_scipy_oracle(h):
    from scipy.linalg import sqrtm
    from sklearn.decomposition import PCA
    g = torch.Generator().manual_seed(1)
    X = torch.rand(300, 16, generator=g) * 2 - 1
    y = torch.arange(300) % 3
    ref = torch.rand(200, 16, generator=g) * 2 - 1
    x = (torch.rand(150, 16, generator=g) * 2 - 1) * 0.5
    J = h["Judge"](X, y, ref, pca_dim=5)
    pca = PCA(5, random_state=0).fit(X.double().numpy())
    a, b = pca.transform(x.double().numpy()), pca.transform(ref.double().numpy())
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    oracle = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(s1 + s2 - 2 * np.real(sqrtm(s1 @ s2)))
    assert abs(J.fd(x) - oracle) < 1e-8
    assert abs(J.fd(ref)) < 1e-8                                    # the reference against itself
    assert J.fd(x * 3) == pytest.approx(J.fd((x * 3).clamp(-1, 1)))        # samples are clipped to [-1, 1] first
    sc = J.scores(X)
    assert 0.1 <= sc["coverage"] <= 1.0 and 1 / 3 <= sc["confidence"] <= 1.0


def test_interval_and_consistency(h):
    from scipy import stats
    v = [1.0, 1.2, 0.9, 1.1]
    m, lo, hi = h["interval"](v)
    half = stats.t.ppf(0.975, 3) * np.std(v, ddof=1) / 2
    assert m == pytest.approx(np.mean(v)) and lo == pytest.approx(m - half) and hi == pytest.approx(m + half)
    assert h["interval"]([2.5]) == (2.5, 2.5, 2.5)
    assert h["consistent"](v, [1.05]) and not h["consistent"](v, [3.0])
    assert h["consistent"]([1.0, 1.1, 1.2], [1.15, 1.3, 1.25]) and not h["consistent"]([1.0, 1.01, 0.99], [2.0, 2.01, 1.99])
