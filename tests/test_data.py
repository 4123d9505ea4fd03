import pytest
import torch

from genlab.core import ParameterError
from genlab.data import (MissingPackageError, load_digits, load_mnist5k, load_movielens100k, load_text_corpus,
                         movielens_dir, package_dir, require_package, ring_centres, sample_gmm,
                         sample_moons, sample_ring, sample_toy)


def test_toy_samplers_shapes_and_statistics():
    g = torch.Generator().manual_seed(0)
    x = sample_ring(20000, g)
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


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_sample_ring_component_moments_and_labels(backend):
    "Eq. 1 of 01_data: component j has mean r (cos 2 pi j / k, sin 2 pi j / k) and per-coordinate std sigma."
    import math
    import numpy as np
    n, k, r, s = 60_000, 6, 3.0, 0.4
    gen = torch.Generator().manual_seed(0) if backend == "torch" else np.random.default_rng(0)
    x, j = sample_ring(n, gen, k=k, radius=r, std=s, labels=True)
    if backend == "torch":
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and j.dtype == torch.long
    else:
        assert isinstance(x, np.ndarray) and x.dtype == np.float64 and np.issubdtype(j.dtype, np.integer)
    x, j = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(j)
    assert x.shape == (n, 2) and j.shape == (n,) and set(j.tolist()) == set(range(k))
    freq = torch.bincount(j, minlength=k).double() / n
    assert (freq - 1 / k).abs().max() < 4.5 * math.sqrt((1 / k) * (1 - 1 / k) / n)
    for c in range(k):
        xc = x[j == c]
        mean = torch.tensor([r * math.cos(2 * math.pi * c / k), r * math.sin(2 * math.pi * c / k)], dtype=torch.float64)
        assert (xc.mean(0) - mean).abs().max() < 4.5 * s / math.sqrt(len(xc))
        assert (xc.std(0) / s - 1).abs().max() < 4.5 / math.sqrt(2 * len(xc))
        assert abs(float(torch.corrcoef(xc.T)[0, 1])) < 4.5 / math.sqrt(len(xc))     # isotropic
    assert torch.allclose(ring_centres(k, r), torch.stack([x[j == c].mean(0) for c in range(k)]), atol=0.02)


def test_sample_ring_reproducible_defaults_dtype_and_errors():
    import numpy as np
    a = sample_ring(200, torch.Generator().manual_seed(3), k=5)
    assert torch.equal(a, sample_ring(200, torch.Generator().manual_seed(3), k=5))
    assert not torch.equal(a, sample_ring(200, torch.Generator().manual_seed(4), k=5))
    assert np.array_equal(sample_ring(200, np.random.default_rng(3)), sample_ring(200, np.random.default_rng(3)))
    x = sample_ring(20_000, torch.Generator().manual_seed(0))                         # defaults: k 8, r 4, std 0.5
    assert x.shape == (20_000, 2) and abs(float(x.norm(dim=1).mean()) - 4.0) < 0.1
    x0, l0 = sample_ring(50, torch.Generator().manual_seed(1), labels=True)
    assert torch.equal(x0, sample_ring(50, torch.Generator().manual_seed(1)))          # labels=True: same draw
    assert sample_ring(10, dtype=torch.float64).dtype == torch.float64
    assert sample_toy("ring", 10, torch.Generator().manual_seed(0)).shape == (10, 2)
    # with k = 8 it is the classic 8-Gaussian draw (component index, then noise), value for value
    for r, s in ((4.0, 0.5), (2.0, 0.2)):
        g2 = torch.Generator().manual_seed(2)
        ang = torch.randint(0, 8, (300,), generator=g2).float() * (2 * math.pi / 8)
        ref = r * torch.stack([torch.cos(ang), torch.sin(ang)], dim=1) + s * torch.randn(300, 2, generator=g2)
        assert torch.allclose(sample_ring(300, torch.Generator().manual_seed(2), radius=r, std=s), ref, atol=1e-5)
    # the numpy draw is the one self_consuming's sample_ring made (component, then noise)
    g = np.random.default_rng(7)
    th = 2 * np.pi * np.arange(8) / 8
    ref = 2.0 * np.stack([np.cos(th), np.sin(th)], 1)[g.integers(8, size=100)] + 0.2 * g.standard_normal((100, 2))
    assert np.array_equal(sample_ring(100, np.random.default_rng(7), radius=2.0, std=0.2), ref)
    with pytest.raises(ParameterError, match="n must be"):
        sample_ring(0)
    with pytest.raises(ParameterError, match="k must be"):
        sample_ring(5, k=0)
    with pytest.raises(ParameterError, match="generator must be"):
        sample_ring(5, 42)


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


# ---------------------------------------------------------------------------------------------- a user's own MNIST
import gzip
import io
import struct
import zipfile

import math

import numpy as np

from genlab.data import MNIST_FILES, ML100K_GENRES, load_mnist, mnist_raw_dir, read_idx


def _idx_bytes(arr, code=0x08, dtype=">u1"):
    arr = np.ascontiguousarray(arr)
    return (struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
            + arr.astype(dtype).tobytes())


def _fake_mnist(folder, n_train=7, n_test=3, gz=False, seed=0, names=None):
    "A small MNIST in IDX files under `folder`; returns the arrays written."
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        imgs = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labs = rng.integers(0, 10, size=n, dtype=np.uint8)
        arrays[split] = (imgs, labs)
        for name, arr in zip((names or MNIST_FILES)[split], (imgs, labs)):
            data = _idx_bytes(arr)
            (folder / (name + (".gz" if gz else ""))).write_bytes(gzip.compress(data) if gz else data)
    return arrays


def test_read_idx_matches_mlxtend_and_handles_types_and_gzip(tmp_path):
    from mlxtend.data import loadlocal_mnist            # an independent IDX reader
    arrays = _fake_mnist(tmp_path)
    imgs = read_idx(tmp_path / "train-images-idx3-ubyte")
    labs = read_idx(tmp_path / "train-labels-idx1-ubyte")
    ref_x, ref_y = loadlocal_mnist(str(tmp_path / "train-images-idx3-ubyte"), str(tmp_path / "train-labels-idx1-ubyte"))
    assert imgs.shape == (7, 28, 28) and imgs.dtype == np.uint8
    assert np.array_equal(imgs.reshape(7, -1), ref_x) and np.array_equal(labs, ref_y)
    assert np.array_equal(imgs, arrays["train"][0])
    x = np.random.default_rng(1).normal(size=(3, 4, 5))
    (tmp_path / "f8.idx.gz").write_bytes(gzip.compress(_idx_bytes(x, 0x0E, ">f8")))
    assert np.array_equal(read_idx(tmp_path / "f8.idx.gz"), x)
    k = np.arange(-6, 6).reshape(3, 4)
    (tmp_path / "i4.idx").write_bytes(_idx_bytes(k, 0x0C, ">i4"))
    assert np.array_equal(read_idx(tmp_path / "i4.idx"), k)


def test_read_idx_names_the_file_when_malformed(tmp_path):
    good = _idx_bytes(np.zeros((2, 28, 28), np.uint8))
    cases = {"magic": b"\x08\x03" + good[2:], "type": good[:2] + b"\x07" + good[3:], "empty": b"",
             "truncated": good[:-5], "header": good[:6], "longer": good + b"\x00", "gzip": b"\x1f\x8bnot gzip"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=f"IDX file malformed: .*{name}"):
            read_idx(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="IDX file missing"):
        read_idx(tmp_path / "nope")


@pytest.mark.parametrize("layout", ["torchvision", "raw", "flat", "gzip", "dotted"])
def test_load_mnist_reads_a_users_copy(tmp_path, layout, monkeypatch):
    monkeypatch.delenv("GENLAB_MNIST", raising=False)
    sub = {"torchvision": "MNIST/raw", "raw": "raw", "flat": "", "gzip": "MNIST/raw", "dotted": ""}[layout]
    names = {s: tuple(n.replace("-idx", ".idx") for n in f) for s, f in MNIST_FILES.items()} if layout == "dotted" else None
    arrays = _fake_mnist(tmp_path / sub if sub else tmp_path, gz=layout == "gzip", names=names)
    X, y = load_mnist(root=tmp_path)
    assert X.shape == (7, 28, 28) and X.dtype == torch.float32 and y.dtype == torch.long
    assert torch.equal(X, torch.from_numpy(arrays["train"][0]).float() / 255)
    assert torch.equal(y, torch.from_numpy(arrays["train"][1]).long())
    Xt, yt = load_mnist(root=str(tmp_path), split="test")
    assert Xt.shape == (3, 28, 28) and torch.equal(yt, torch.from_numpy(arrays["test"][1]).long())
    Xa, ya = load_mnist(root=tmp_path, split="all")
    assert torch.equal(Xa, torch.cat([X, Xt])) and torch.equal(ya, torch.cat([y, yt]))


def test_load_mnist_env_var_and_shipped_default(tmp_path, monkeypatch):
    _fake_mnist(tmp_path / "mine" / "MNIST" / "raw", n_train=4)
    _fake_mnist(tmp_path / "other" / "MNIST" / "raw", n_train=5)
    monkeypatch.setenv("GENLAB_MNIST", str(tmp_path / "mine"))
    assert load_mnist()[0].shape == (4, 28, 28)
    assert load_mnist(root=tmp_path / "other")[0].shape == (5, 28, 28)      # root= wins over the variable
    monkeypatch.setenv("GENLAB_MNIST", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match=r"does not exist: .*gone.*\$GENLAB_MNIST"):
        load_mnist()
    monkeypatch.delenv("GENLAB_MNIST")
    X, y = load_mnist()                                                      # the shipped MNIST-5k
    assert X.shape == (5000, 28, 28) and torch.bincount(y).tolist() == [500] * 10
    with pytest.raises(ParameterError, match="split='test' needs the full MNIST.*GENLAB_MNIST"):
        load_mnist(split="test")
    with pytest.raises(ParameterError, match="split must be one of"):
        load_mnist(root=tmp_path / "mine", split="validation")


def test_load_mnist_errors_name_the_path_and_what_was_expected(tmp_path, monkeypatch):
    monkeypatch.delenv("GENLAB_MNIST", raising=False)
    with pytest.raises(FileNotFoundError, match="MNIST folder does not exist: .*nowhere.*train-images-idx3-ubyte"):
        load_mnist(root=tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty lacks the raw IDX files: expected train-images-idx3-ubyte, "
                                                r"train-labels-idx1-ubyte .*MNIST/raw"):
        load_mnist(root=tmp_path / "empty")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_mnist(root=tmp_path / "afile")
    # only the training files: split="train" works, "test" names the missing t10k files
    d = tmp_path / "trainonly"
    _fake_mnist(d)
    for n in MNIST_FILES["test"]:
        (d / n).unlink()
    assert load_mnist(root=d)[0].shape[0] == 7
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
        load_mnist(root=d, split="test")
    assert mnist_raw_dir(d, ("train",)) == d
    # well-formed IDX files with the wrong content
    bad = tmp_path / "bad"
    _fake_mnist(bad)
    (bad / "train-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(6, np.uint8)))
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte: expected 7 uint8 labels"):
        load_mnist(root=bad)
    (bad / "train-labels-idx1-ubyte").write_bytes(_idx_bytes(np.full(7, 12, np.uint8)))
    with pytest.raises(ValueError, match="labels must be digits 0-9, found 12"):
        load_mnist(root=bad)
    (bad / "train-images-idx3-ubyte").write_bytes(_idx_bytes(np.zeros((7, 784), np.uint8)))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte: expected uint8 images \(n, rows, cols\)"):
        load_mnist(root=bad)


# ---------------------------------------------------------------------------------------------- a user's own MovieLens
def _grouplens(items_genres, ratings, users):
    "The text of GroupLens ml-100k files for a few items (title, date, genres), ratings and users."
    item_lines = []
    for i, (title, date, genres) in enumerate(items_genres, start=1):
        flags = "|".join("1" if g in genres else "0" for g in ML100K_GENRES)
        item_lines.append(f"{i}|{title}|{date}||http://example/{i}|{flags}")
    return {"u.data": "".join("\t".join(map(str, r)) + "\n" for r in ratings),
            "u.item": "\n".join(item_lines) + "\n",
            "u.user": "".join("|".join(map(str, u)) + "\n" for u in users),
            "u.genre": "".join(f"{g}|{i}\n" for i, g in enumerate(ML100K_GENRES)) + "\n"}


FAKE_ITEMS = [("Toy Story (1995)", "01-Jan-1995", ["Animation", "Children's", "Comedy"]),
              ("Seven (Se7en) (1995)", "01-Jan-1995", ["Crime", "Thriller"]),
              ("Mystery Film", "", ["unknown"])]
FAKE_RATINGS = [(1, 1, 5, 874965758), (1, 2, 3, 876893171), (2, 3, 4, 888550871), (2, 1, 1, 888551000)]
FAKE_USERS = [(1, 24, "M", "technician", "85711"), (2, 53, "F", "other", "94043")]


def _write_folder(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="latin-1")


def _check_fake(ml):
    r = ml["ratings"]
    assert list(r.columns) == ["user_id", "item_id", "rating", "timestamp"]
    assert [tuple(x) for x in r.itertuples(index=False)] == FAKE_RATINGS and str(r.rating.dtype).startswith("int")
    it = ml["items"]
    assert it["movie_title"].tolist() == ["Toy Story", "Seven (Se7en)", "Mystery Film"]
    assert it["release_year"].tolist() == ["1995", "1995", ""]
    assert it["class"].tolist() == ["Animation Children's Comedy", "Crime Thriller", "unknown"]
    assert it["item_id"].tolist() == ["1", "2", "3"]
    assert ml["users"]["occupation"].tolist() == ["technician", "other"] and ml["users"]["zip_code"].tolist()[0] == "85711"


def test_movielens_reads_grouplens_folder_and_zip(tmp_path, monkeypatch):
    monkeypatch.delenv("GENLAB_MOVIELENS", raising=False)
    files = _grouplens(FAKE_ITEMS, FAKE_RATINGS, FAKE_USERS)
    _write_folder(tmp_path / "unz" / "ml-100k", files)
    _check_fake(load_movielens100k(tmp_path / "unz" / "ml-100k"))          # the ml-100k folder
    _check_fake(load_movielens100k(tmp_path / "unz"))                       # the folder it was unzipped into
    for prefix in ("ml-100k/", ""):
        z = tmp_path / f"ml-100k{len(prefix)}.zip"
        with zipfile.ZipFile(z, "w") as zf:
            if prefix:
                zf.writestr(prefix, "")
            for name, text in files.items():
                zf.writestr(prefix + name, text.encode("latin-1"))
        ml = load_movielens100k(str(z))
        _check_fake(ml)
        assert ml["source"] == str(z)
    monkeypatch.setenv("GENLAB_MOVIELENS", str(tmp_path / "ml-100k0.zip"))   # the zip with no folder prefix
    ml = load_movielens100k()
    _check_fake(ml)
    assert ml["source"].endswith("ml-100k0.zip")
    monkeypatch.setenv("GENLAB_MOVIELENS", str(tmp_path / "missing.zip"))
    with pytest.raises(FileNotFoundError, match=r"does not exist: .*missing.zip \[given by \$GENLAB_MOVIELENS\]"):
        load_movielens100k()


def test_movielens_genres_follow_u_genre(tmp_path):
    "Without u.genre the standard 19 names apply; with one, its order decides which flag is which genre."
    files = _grouplens(FAKE_ITEMS, FAKE_RATINGS, FAKE_USERS)
    del files["u.genre"]
    _write_folder(tmp_path / "a", files)
    _check_fake(load_movielens100k(tmp_path / "a"))
    files = _grouplens(FAKE_ITEMS, FAKE_RATINGS, FAKE_USERS)
    files["u.genre"] = "".join(f"{g.upper()}|{i}\n" for i, g in enumerate(ML100K_GENRES))
    _write_folder(tmp_path / "b", files)
    assert load_movielens100k(tmp_path / "b")["items"]["class"].tolist()[1] == "CRIME THRILLER"


def test_movielens_malformed_grouplens_names_file_and_expectation(tmp_path):
    base = _grouplens(FAKE_ITEMS, FAKE_RATINGS, FAKE_USERS)
    cases = [("u.data", "1\t2\t3\n", ValueError, r"u.data: expected 4 tab-separated columns, found 3"),
             ("u.data", "1\t2\tfive\t4\n", ValueError, r"u.data: \['user_id', 'item_id', 'rating', 'timestamp'\] must be integers"),
             ("u.item", base["u.item"].replace("|0|", "|x|", 1), ValueError, r"u.item: the last 19 columns must be 0/1"),
             ("u.item", "1|Toy Story|01-Jan-1995\n", ValueError, r"u.item: expected 24 '\|'-separated columns, found 3"),
             ("u.user", None, FileNotFoundError, r"MovieLens file missing: .*u.user")]
    for i, (name, text, exc, pattern) in enumerate(cases):
        files = dict(base)
        if text is None:
            del files[name]
        else:
            files[name] = text
        _write_folder(tmp_path / str(i), files)
        with pytest.raises(exc, match=pattern):
            load_movielens100k(tmp_path / str(i))
    (tmp_path / "notzip.zip").write_text("hello")
    with pytest.raises(ValueError, match="notzip.zip is not a zip archive; expected .*u.data"):
        load_movielens100k(tmp_path / "notzip.zip")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("ml-1m/ratings.dat", "1::2::3::4\n")
    with pytest.raises(FileNotFoundError, match=r"other.zip holds no u.data.*ml-1m/ratings.dat"):
        load_movielens100k(tmp_path / "other.zip")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has neither ml-100k.inter nor u.data"):
        load_movielens100k(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="MovieLens path does not exist"):
        load_movielens100k(tmp_path / "nowhere")


def test_movielens_real_data_round_trips_through_the_grouplens_zip(tmp_path):
    "The wheel's MovieLens-100k written as GroupLens' ml-100k.zip reads back to the same tables."
    ml = load_movielens100k()
    it = ml["items"]
    items = [(f"{t} ({y})" if y.isdigit() else t, f"01-Jan-{y}" if y.isdigit() else "", str(c).split())
             for t, y, c in zip(it.movie_title, it.release_year, it["class"])]
    assert it.item_id.tolist() == [str(i) for i in range(1, len(it) + 1)]
    users = ml["users"][["user_id", "age", "gender", "occupation", "zip_code"]].itertuples(index=False)
    files = _grouplens(items, ml["ratings"].itertuples(index=False), users)
    with zipfile.ZipFile(tmp_path / "ml-100k.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr("ml-100k/" + name, text.encode("latin-1", errors="replace"))
    back = load_movielens100k(tmp_path / "ml-100k.zip")
    assert back["ratings"].equals(ml["ratings"])
    assert back["items"]["class"].tolist() == it["class"].tolist()
    assert back["items"]["release_year"].tolist() == [y if y.isdigit() else "" for y in it["release_year"]]
    same = (back["items"]["movie_title"] == it["movie_title"]).mean()
    assert same > 0.99, same
    assert back["users"]["user_id"].tolist() == ml["users"]["user_id"].tolist()
