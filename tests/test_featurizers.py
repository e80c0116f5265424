"""Built-in featurizers: identity and random Fourier features."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailkit.components import Featurizer
from tailkit.errors import InvalidParameterError
from tailkit.plugins.featurizers import rff as rff_module
from tailkit.plugins.featurizers.identity import Identity
from tailkit.plugins.featurizers.rff import RandomFourierFeatures
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
