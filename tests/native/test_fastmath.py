"""The kernels' vectorisable exp and log σ against float64 libm."""

from __future__ import annotations

import numpy as np

from tailkit.native.fastmath import exp_neg_f64_array, exp_nonpositive_array, log_sigmoid_array


def test_exp_polynomial_relative_error():
    t = -np.linspace(0.0, 39.9, 200_001)
    out = np.empty_like(t)
    exp_nonpositive_array(t, out)
    assert np.max(np.abs(out / np.exp(t) - 1.0)) < 2e-8
    exp_nonpositive_array(np.array([-45.0, -np.inf]), out[:2])
    assert (out[:2] < 5e-18).all()  # the floor: invisible next to the row's largest term, 1


def test_float64_exp_relative_error() -> None:
    """e^(−a) in float64 within 1e-15 relative of libm from 0 to the clamp (700), across the
    reduction's steps (a = k·ln 2 ± tiny), 0 past it (where libm's values go subnormal), and
    NaN for NaN."""
    a = np.concatenate(
        [np.linspace(0.0, 700.0, 400_001), np.arange(1, 1000) * np.log(2) + 1e-12, [0.0, 1e-300]]
    )
    a = a[a <= 700.0]
    out = np.empty_like(a)
    exp_neg_f64_array(a, out)
    assert np.max(np.abs(out / np.exp(-a) - 1.0)) < 1e-15
    exp_neg_f64_array(np.array([700.0, 700.5, np.inf, np.nan]), out[:4])
    assert out[0] > 0.0 and out[1] == out[2] == 0.0 and np.isnan(out[3])


def test_log_sigmoid_kernel_is_accurate() -> None:
    """Both sides, log σ(z) and log σ(−z), in float32 against float64 libm: within 2e-6
    relative (a few float32 ulps) up to the clamp at |z| = 40, and below 5e-18 absolute past
    it, where the small side is e^(−|z|) and the clamp holds it at e^(−40)."""
    z = np.concatenate(
        [np.linspace(-60, 60, 240001), [0.0, 1e-12, -1e-12, 40.0, -40.0, 1e3, -1e3]]
    ).astype(np.float32)
    out = np.empty((2, z.size), dtype=np.float32)
    log_sigmoid_array(z, out)
    zd = z.astype(np.float64)
    softplus = np.log1p(np.exp(-np.abs(zd)))
    inside = np.abs(zd) <= 40
    for got, zs in ((out[0], zd), (out[1], -zd)):
        ref = np.minimum(zs, 0.0) - softplus
        np.testing.assert_allclose(got[inside], ref[inside], rtol=2e-6, atol=0)
        np.testing.assert_allclose(got[~inside], ref[~inside], rtol=0, atol=5e-18)
