import pytest
import torch

from genlab.core import ParameterError
from genlab.data import (MissingPackageError, load_digits, load_mnist5k, load_movielens100k, load_text_corpus,
                         movielens_dir, package_dir, require_package, sample_8gaussians, sample_gmm, sample_moons,
                         sample_toy)


def test_toy_samplers_shapes_and_statistics():
    g = torch.Generator().manual_seed(0)
    x = sample_8gaussians(20000, g)
    assert x.shape == (20000, 2)
    assert abs(x.norm(dim=1).mean() - 4.0) < 0.1
    m = sample_moons(1000, g)
    assert m.shape == (1000, 2) and torch.isfinite(m).all()
    xs, c = sample_gmm(30000, torch.tensor([[0.0, 0.0], [10.0, 0.0]]), 1.0, torch.tensor([0.25, 0.75]), g, return_labels=True)
    assert abs(c.float().mean() - 0.75) < 0.02
    with pytest.raises(ParameterError, match="unknown toy"):
        sample_toy("spiral", 5)
    with pytest.raises(ParameterError, match="n must be"):
        sample_moons(0)


def test_real_data_loaders():
    X, y = load_mnist5k()
    assert X.shape == (5000, 28, 28) and X.dtype == torch.float32 and torch.bincount(y).tolist() == [500] * 10
    Xd, yd = load_digits()
    assert Xd.shape == (1797, 8, 8)
    ml = load_movielens100k()
    assert len(ml["ratings"]) == 100000 and ml["ratings"].rating.between(1, 5).all()
    docs = load_text_corpus("lee")
    assert len(docs) == 300 and all(isinstance(d, str) and d for d in docs)


def test_missing_package_names_the_install_command():
    with pytest.raises(MissingPackageError, match="pip install --no-deps not-here"):
        package_dir("not_here_pkg", "not-here", no_deps=True)
    with pytest.raises(MissingPackageError, match="pip install nope"):
        require_package("nope_module_xyz", "nope")


def test_movielens_missing_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="ml-100k.inter"):
        load_movielens100k(tmp_path)
    src = movielens_dir()
    for name in ("ml-100k.item", "ml-100k.user"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    (tmp_path / "ml-100k.inter").write_text("user_id:token\titem_id:token\n1\t2\n")
    with pytest.raises(ValueError, match="malformed.*rating"):
        load_movielens100k(tmp_path)


def test_pca_codec_round_trip_and_whitening():
    from sklearn.decomposition import PCA
    from genlab.data import PCACodec
    X = torch.randn(200, 6, generator=torch.Generator().manual_seed(0)) @ torch.randn(6, 6, generator=torch.Generator().manual_seed(1))
    full = PCACodec(X, 6)
    assert torch.allclose(full.decode(full.encode(X)), X, atol=1e-4)          # all components: exact
    Z = PCACodec(X, 3).encode(X)
    assert torch.allclose(Z.std(0, unbiased=True), torch.ones(3), atol=1e-4)  # whitened codes
    ref = PCA(3).fit(X.double().numpy())
    assert abs(PCACodec(X, 3).explained_variance - ref.explained_variance_ratio_.sum()) < 1e-9
    with pytest.raises(ParameterError, match="k must be"):
        PCACodec(X, 0)
