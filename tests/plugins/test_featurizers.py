"""Built-in featurizers: identity, random Fourier features, PCA, TF-IDF + SVD and pixels."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from PIL import Image
from sklearn.decomposition import TruncatedSVD

from tailkit.components import Featurizer
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.featurizers import rff as rff_module
from tailkit.plugins.featurizers.geocells import GeoCells
from tailkit.plugins.featurizers.identity import Identity
from tailkit.plugins.featurizers.pca import PCA
from tailkit.plugins.featurizers.pixels import Pixels
from tailkit.plugins.featurizers.rff import RandomFourierFeatures
from tailkit.plugins.featurizers.tfidf import Tfidf
from tailkit.plugins.featurizers.tfidf_svd import TfidfSVD
from tailkit.registry import make_registry
from tailkit.testing import ContractError, check_featurizer
from tailkit.validation import option_signature, validate_options


def test_identity_is_float32_contiguous_and_copies_only_when_needed() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = Identity().fit(x)
    assert isinstance(f, Featurizer)
    assert f.transform(x) is x
    out = f.transform(np.asfortranarray(x.astype(np.float64)))
    assert out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, x)
    assert option_signature(Identity) == {}
    with pytest.raises(ValueError, match="2-D"):
        f.transform(np.zeros(3, np.float32))


def test_rff_shape_dtype_and_determinism() -> None:
    x = np.random.default_rng(0).standard_normal((50, 3))
    a = RandomFourierFeatures(dim=64, seed=7).fit(x).transform(x)
    b = RandomFourierFeatures(dim=64, seed=7).fit(x[:1]).transform(x)  # fit sees only D
    c = RandomFourierFeatures(dim=64, seed=8).fit(x).transform(x)
    assert a.shape == (50, 64) and a.dtype == np.float32 and a.flags.c_contiguous
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert np.all(np.abs(a) <= math.sqrt(2 / 64) + 1e-6)


def test_rff_chunking_does_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(1).standard_normal((1000, 5)).astype(np.float32)
    f = RandomFourierFeatures(dim=32, seed=0).fit(x)
    whole = f.transform(x)
    monkeypatch.setattr(rff_module, "_CHUNK_FLOATS", 7 * 32)  # 7 rows per chunk
    np.testing.assert_array_equal(f.transform(x), whole)


@pytest.mark.parametrize("bandwidth", [0.5, 2.0])
def test_rff_approximates_the_rbf_kernel(bandwidth: float) -> None:
    # z(x)·z(x') is a mean of `dim` i.i.d. terms cos(w·δ) + cos(w·s + 2b), each of variance
    # at most 1/2 + 1/2, so its error has standard deviation <= 1/sqrt(dim): allow 5 of them
    # per pair, and 1.5 for the mean absolute error over pairs.
    dim, pairs, in_dim = 4096, 300, 4
    rng = np.random.default_rng(3)
    x = rng.standard_normal((pairs, in_dim))
    # Spread the distances so the kernel values cover (0, 1), not just the tails.
    direction = rng.standard_normal((pairs, in_dim))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    dist = rng.uniform(0, 3 * bandwidth, size=(pairs, 1))
    x2 = x + dist * direction
    f = RandomFourierFeatures(dim=dim, bandwidth=bandwidth, seed=0).fit(x)
    z1, z2 = f.transform(x).astype(np.float64), f.transform(x2).astype(np.float64)
    approx = np.sum(z1 * z2, axis=1)
    exact = np.exp(-np.sum((x - x2) ** 2, axis=1) / (2 * bandwidth**2))
    err = np.abs(approx - exact)
    sigma = 1 / math.sqrt(dim)
    assert err.max() < 5 * sigma
    assert err.mean() < 1.5 * sigma
    # The diagonal: z(x)·z(x) ≈ 1.
    assert abs(np.mean(np.sum(z1 * z1, axis=1)) - 1) < 5 * sigma


def test_rff_options_and_misuse() -> None:
    assert set(option_signature(RandomFourierFeatures)) == {"dim", "bandwidth", "seed"}
    with pytest.raises(InvalidParameterError, match=r"features\.bandwidth"):
        validate_options("features", RandomFourierFeatures, {"bandwidth": 0})
    assert validate_options("features", RandomFourierFeatures, {"bandwidth": 2}) == {
        "bandwidth": 2.0
    }
    f = RandomFourierFeatures(dim=8)
    with pytest.raises(RuntimeError, match="before fit"):
        f.transform(np.zeros((2, 3)))
    f.fit(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        f.transform(np.zeros((2, 4)))


# --- declared input and output kinds ----------------------------------------------------------


def test_every_builtin_featurizer_declares_what_it_accepts_and_outputs() -> None:
    declared = {
        c.name: (c.factory.accepts, c.factory.output)
        for c in make_registry().components("featurizers")
        if c.plugin == "tailkit.featurizers"
    }
    assert declared == {
        "identity": (("dense",), "dense"),
        "rff": (("dense",), "dense"),
        "pca": (("dense",), "dense"),
        "tfidf-svd": (("sparse", "dense"), "dense"),
        "pixels": (("image",), "image"),
        "sparse-identity": (("sparse",), "sparse"),
        "tfidf": (("sparse",), "sparse"),
        "text-tfidf": (("text",), "sparse"),
        "geocells": (("dense",), "sparse"),
    }


@pytest.mark.parametrize(
    ("featurizer", "inputs", "match"),
    [
        (Pixels(), np.zeros((4, 3), np.float32), r"'pixels' accepts images.*float32 array of "),
        (Pixels(), np.zeros((4, 8, 8, 3), np.float32), r"'pixels'.*float32 array of shape"),
        (Pixels(), np.array([1, 2], dtype=object), r"'pixels'.*object array of shape \(2,\)"),
        (TfidfSVD(), np.zeros((4, 8, 8, 3), np.uint8), r"'tfidf-svd'.*uint8 array of shape"),
        (PCA(), sp.csr_matrix(np.eye(3)), r"'pca' accepts dense.*sparse csr matrix"),
        (PCA(), np.zeros((4, 8, 8, 3), np.uint8), r"'pca'.*\(4, 8, 8, 3\)"),
        (Tfidf(), np.zeros((4, 8), np.float32), r"'tfidf' accepts sparse.*float32 array of"),
        (GeoCells(), np.zeros((4, 5), np.float32), r"'geocells' accepts \(N, 3\).*\(4, 5\)"),
    ],
)
def test_the_wrong_input_kind_is_a_one_line_error(featurizer, inputs, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        featurizer.fit(inputs)
    assert "\n" not in str(info.value)


# --- tfidf-svd --------------------------------------------------------------------------------


def _tfidf(counts: np.ndarray, train: np.ndarray) -> np.ndarray:
    """scikit-learn's TfidfTransformer defaults written out: smooth idf, then L2 rows."""
    n = train.shape[0]
    df = np.count_nonzero(train, axis=0)
    idf = np.log((1 + n) / (1 + df)) + 1
    weighted = counts * idf
    norms = np.linalg.norm(weighted, axis=1, keepdims=True)
    return np.divide(weighted, norms, out=np.zeros_like(weighted), where=norms > 0)


def _counts(seed: int, n: int = 60, d: int = 25) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rng.uniform(0.05, 2.0, size=d), size=(n, d)).astype(np.float64)
    counts[:, 3] = 0  # a word absent from every document
    counts[55] = 0  # an empty document (in the transformed rows only)
    return counts


def _same_up_to_sign(actual: np.ndarray, expected: np.ndarray, atol: float) -> None:
    signs = np.sign(np.sum(actual * expected, axis=0))
    assert np.all(signs != 0)
    np.testing.assert_allclose(actual, expected * signs, atol=atol, rtol=0)


def test_tfidf_svd_matches_an_explicit_tfidf_and_truncated_svd() -> None:
    counts = _counts(0)
    train = counts[:50]
    f = TfidfSVD(dim=6, seed=3).fit(sp.csr_matrix(train, dtype=np.float32))
    out = f.transform(sp.csr_matrix(counts, dtype=np.float32))
    assert out.shape == (60, 6) and out.dtype == np.float32
    # The same TruncatedSVD on the explicit TF-IDF matrix (dense) gives the same features.
    svd = TruncatedSVD(6, random_state=3).fit(_tfidf(train, train))
    np.testing.assert_allclose(out, svd.transform(_tfidf(counts, train)), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out[55], 0)
    # Dense counts are the same input.
    np.testing.assert_array_equal(TfidfSVD(dim=6, seed=3).fit(train).transform(counts), out)


def test_tfidf_svd_spans_the_top_singular_vectors() -> None:
    # dim + 10 oversamples >= D: the randomised range finder sees the whole row space, so the
    # components are the exact top right singular vectors (up to sign).
    counts = _counts(1)
    train = counts[:50]
    out = TfidfSVD(dim=20, seed=0).fit(sp.csr_matrix(train)).transform(sp.csr_matrix(counts))
    _, _, vt = np.linalg.svd(_tfidf(train, train), full_matrices=False)
    _same_up_to_sign(out.astype(np.float64), _tfidf(counts, train) @ vt[:20].T, atol=1e-5)


def test_tfidf_svd_caps_dim_and_checks_width() -> None:
    counts = _counts(2)
    f = TfidfSVD(dim=500).fit(counts[:50])
    assert f.transform(counts).shape == (60, 25)  # min(N, D) = 25
    with pytest.raises(ValueError, match="fitted on 25 columns; got 24"):
        f.transform(counts[:, :24])
    with pytest.raises(RuntimeError, match="before fit"):
        TfidfSVD().transform(counts)


# --- pca --------------------------------------------------------------------------------------


@pytest.mark.parametrize("whiten", [False, True])
def test_pca_matches_the_svd_of_the_centred_training_rows(whiten: bool) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((80, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1]) + 7.0
    x = (x @ np.linalg.qr(rng.standard_normal((6, 6)))[0]).astype(np.float32)
    train = x[:60].astype(np.float64)
    out = PCA(dim=3, whiten=whiten).fit(x[:60]).transform(x)
    assert out.shape == (80, 3) and out.dtype == np.float32
    mean = train.mean(axis=0)
    _, s, vt = np.linalg.svd(train - mean, full_matrices=False)
    expected = (x.astype(np.float64) - mean) @ vt[:3].T
    if whiten:
        expected /= s[:3] / np.sqrt(len(train) - 1)  # unit variance on the training rows
    _same_up_to_sign(out.astype(np.float64), expected, atol=2e-5 * np.abs(expected).max())


def test_pca_caps_dim_and_is_deterministic() -> None:
    x = np.random.default_rng(5).standard_normal((30, 4))
    a = PCA(dim=64).fit(x).transform(x)
    assert a.shape == (30, 4)
    np.testing.assert_array_equal(PCA(dim=64).fit(x).transform(x), a)
    with pytest.raises(ValueError, match="fitted on 4 columns; got 3"):
        PCA(dim=2).fit(x).transform(x[:, :3])


# --- pixels -----------------------------------------------------------------------------------


def test_pixels_keeps_decoded_images_byte_for_byte() -> None:
    x = np.random.default_rng(6).integers(0, 256, size=(5, 7, 9, 3), dtype=np.uint8)
    f = Pixels(size=4).fit(x)
    assert f.transform(x) is x  # no copy, no resize: the pixels as they are
    strided = np.asfortranarray(x)
    out = f.transform(strided)
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, x)


def _png(path: Path, pixels: np.ndarray) -> str:
    Image.fromarray(pixels).save(path)
    return str(path)


def test_pixels_crops_the_centre_of_an_image_whose_short_side_is_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    wide = rng.integers(0, 256, size=(6, 14, 3), dtype=np.uint8)  # h = size: crop only
    odd = rng.integers(0, 256, size=(11, 6, 3), dtype=np.uint8)  # (11 - 6) / 2 rounds to 2
    square = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    paths = np.array(
        [_png(tmp_path / f"{i}.png", a) for i, a in enumerate([wide, odd, square])], dtype=object
    )
    out = Pixels(size=6).fit(paths).transform(paths)
    assert out.shape == (3, 6, 6, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[0], wide[:, 4:10])
    np.testing.assert_array_equal(out[1], odd[2:8, :])
    np.testing.assert_array_equal(out[2], square)


def test_pixels_resizes_the_short_side_then_crops(tmp_path: Path) -> None:
    # 20 × 48 (h × w) of four vertical bands, each 12 columns wide; at size 10 the short side
    # is scaled by 1/2 (to 10 × 24) and the central 10 columns are 7..16 of the resized image:
    # columns 7..11 lie in band 1 (resized columns 6..11), 12..16 in band 2 — away from the
    # band edges the bilinear filter (support 2 source pixels at this scale) sees one colour.
    colours = np.array([[255, 0, 0], [0, 200, 0], [0, 0, 150], [90, 90, 90]], dtype=np.uint8)
    image = np.repeat(colours, 12, axis=0)[None].repeat(20, axis=0)
    path = _png(tmp_path / "bands.png", image)
    out = Pixels(size=10).transform(np.array([path], dtype=object))[0]
    assert out.shape == (10, 10, 3)
    np.testing.assert_array_equal(out[:, :4], np.broadcast_to(colours[1], (10, 4, 3)))
    np.testing.assert_array_equal(out[:, 6:], np.broadcast_to(colours[2], (10, 4, 3)))
    # And exactly what Pillow's bilinear resize to (24, 10) gives, cut at columns 7..16.
    reference = np.asarray(Image.fromarray(image).resize((24, 10), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(out, reference[:, 7:17])


def test_pixels_converts_grey_and_alpha_to_rgb(tmp_path: Path) -> None:
    grey = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    rgba = np.dstack([np.full((4, 4, 3), 40, np.uint8), np.full((4, 4), 7, np.uint8)])
    paths = np.array(
        [_png(tmp_path / "grey.png", grey), _png(tmp_path / "rgba.png", rgba)], dtype=object
    )
    out = Pixels(size=4).transform(paths)
    np.testing.assert_array_equal(out[0], np.repeat(grey[:, :, None], 3, axis=2))
    np.testing.assert_array_equal(out[1], 40)


def test_pixels_names_an_undecodable_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataValidationError, match=r"broken\.jpg: cannot decode image"):
        Pixels().transform(np.array([str(bad)], dtype=object))


class FloatPixels(Pixels):
    """Converts images to float, breaking its declared image output."""

    def transform(self, inputs):
        return super().transform(inputs).astype(np.float32)


class OverclaimingPixels(Pixels):
    """Declares an input kind it cannot take."""

    accepts = ("image", "sparse")


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (
            FloatPixels,
            r"on uint8 \(40, 8, 8, 3\) images: transform returned dtype float32, not uint8",
        ),
        (OverclaimingPixels, r"on sparse \(40, 50\) CSR counts: fit/transform raised ValueError"),
    ],
)
def test_the_featurizer_contract_checks_every_declared_kind(factory, match: str) -> None:
    with pytest.raises(ContractError, match=match) as info:
        check_featurizer(factory)
    assert factory.__qualname__ in str(info.value)


# ---------------------------------------------------------------- non-finite features


def _project_with(tmp_path: Path, inputs: np.ndarray, featurize: dict):
    """Splits written by the real subsample stage for ``inputs`` (labels cycling over three
    classes), and what the featurize stage needs to run on them."""
    import copy

    from conftest import TINY_PARAMS, StandInRegistry

    from tailkit.components import RawData
    from tailkit.params import parse_params
    from tailkit.paths import Layout
    from tailkit.stages import subsample

    labels = np.arange(inputs.shape[0]) % 3
    registry = StandInRegistry(RawData(inputs, labels, ["a", "b", "c"]))
    raw = copy.deepcopy(TINY_PARAMS)
    raw["featurize"] = featurize
    raw["experiments"] = {
        name: {**spec, "features": next(iter(featurize))}
        for name, spec in raw["experiments"].items()
        if name == "softmax"
    }
    params, layout = parse_params(raw), Layout(tmp_path)
    subsample.run(params, layout, registry)
    return params, layout, registry


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_are_refused_naming_the_row_and_column(tmp_path: Path, bad) -> None:
    """Issue 19 item 2: a NaN in a user's dense features once reached evaluation's ECE as a
    traceback; featurize refuses it before fitting, naming the dataset row and the column."""
    from tailkit.stages import featurize

    inputs = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    inputs[123, 2] = bad
    params, layout, registry = _project_with(tmp_path, inputs, {"id": {"name": "identity"}})
    with pytest.raises(DataValidationError) as info:
        featurize.run(params, layout, registry, "id")
    message = str(info.value)
    assert message.startswith("dataset 'synthetic': row 123 (in the ") and "\n" not in message
    assert f"split) has {bad} in column 2; features must be finite" in message
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["split"]  # nothing partial


class _Poisoned(Featurizer):
    """Turns a finite input into a NaN feature: row 7 of whatever it transforms."""

    def fit(self, x) -> None:
        pass

    def transform(self, x):
        out = np.asarray(x, dtype=np.float64).copy()
        if out.shape[0] > 7:
            out[7, 1] = np.nan
        return out


def test_a_featurizer_producing_nan_is_named_with_split_row_and_column() -> None:
    from tailkit.errors import PluginError
    from tailkit.pipeline.featurizing import as_output, first_non_finite

    good = np.arange(40.0).reshape(20, 2)
    assert as_output(good, "dense", "f").dtype == np.float32
    with pytest.raises(PluginError) as info:
        as_output(_Poisoned().transform(good), "dense", "poisoned", " (val split)")
    assert (
        str(info.value) == "featurizer 'poisoned' output (val split): row 7: value nan in column 1"
    )
    # a float64 value past float32's range becomes inf in the cache: caught too
    with pytest.raises(PluginError, match=r"row 0: value inf in column 0$"):
        as_output(np.array([[1e300, 0.0]]), "dense", "f")
    # the block scan finds the first bad row in row-major order across blocks, and with rows
    big = np.zeros((40_000, 3), np.float32)
    big[[39_000, 20_000], [0, 2]] = np.nan
    assert first_non_finite(big) == (20_000, 2)
    assert first_non_finite(big, np.array([39_000, 5, 20_000])) == (0, 0)
    assert first_non_finite(big[:100]) is None
