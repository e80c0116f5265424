"""Vectorisable exp, log1p and softplus for the compiled kernels (numba, CPU).

Why hand-written: numba calls libm for ``np.exp`` and ``np.log1p``, one element at a time, so a
loop over a (B, C) array with a transcendental per entry runs at libm's scalar speed; written in
plain arithmetic (a polynomial and a scaling), LLVM packs 4 float64 or 8 float32 lanes. The
kernels of prediction (evaluation/chunk_kernels.py), the label tree (plugins/samplers/
tree/*_kernels.py) and the full-softmax and one-vs-all losses (plugins/losses/*_kernels.py)
inline these.

numba's on-disk cache is keyed on each kernel module's own source, so a kernel would not notice
an edit here that it inlined. ``tailkit/__init__.py`` therefore names the cache directory after
a digest of this file: an edit here sends every kernel to a fresh directory.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)

#: e^t for t < −40 is below 4.3e-18: a float64 sum of at most 2^31 such terms, relative to a
#: largest term of 1, moves nothing a float32 can hold.
EXP_FLOOR = -40.0

_F32 = np.float32
_ZERO, _ONE, _TWO, _HALF = _F32(0.0), _F32(1.0), _F32(2.0), _F32(0.5)
_LOG2E = _F32(1.4426950408889634)
#: Above this a, e^(−a) and log(1 + e^(−a)) are below 4.3e-18: the clamp changes no float32 sum.
CLAMP_F32 = _F32(40.0)
# e^u on |u| ≤ ln2 / 2: Taylor to u^7 (relative error 5e-9, under float32's 6e-8)
_E2, _E3, _E4, _E5, _E6, _E7 = (_F32(1.0 / math.factorial(i)) for i in range(2, 8))
# ln 2 = _LN2_HI + _LN2_LO, the high part with 9 significant bits: n·_LN2_HI is exact for n < 2^15
_LN2_HI, _LN2_LO = _F32(0.693359375), _F32(0.6931471805599453 - 0.693359375)
# log(1 + e)/e on [0, 1]: least squares at 4,000 Chebyshev nodes, degree 8 (1.9e-7 relative in
# float32 Horner); the leading coefficients approach the series' 1, −1/2, 1/3
_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8 = (
    _F32(c)
    for c in (
        0.999999970540657,
        -0.499995015167878,
        0.33319271342510437,
        -0.24844369892523396,
        0.19111431080749114,
        -0.1367476970581227,
        0.07836166802132702,
        -0.029588507394128286,
        0.0052534577972598,
    )
)
_R0, _R1 = _F32(24.0 / 17.0), _F32(8.0 / 17.0)
#: Above this a, e^(−a) (< 1e-304) is taken as 0: libm's values there go subnormal, and a
#: subnormal operand or result costs a microcode assist on Intel cores.
CLAMP_F64 = 700.0
# ln 2 in two parts for float64 (fdlibm's): n·_LN2_HI_F64 is exact for |n| < 2^11
_LN2_HI_F64, _LN2_LO_F64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
# e^u on |u| ≤ ln2 / 2 by its Taylor polynomial to u^13: the remainder is below 1e-17 relative
_E64 = tuple(1.0 / math.factorial(i) for i in range(14))

#: Multiply-adds may fuse; nothing is reordered or approximated.
EXACT_ENOUGH = {"contract"}


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def exp_nonpositive(t):
    """e^t for a float64 t ≤ 0: (e^(t/64))^64 with a degree-10 Taylor polynomial, relative
    error below 2e-8; t below :data:`EXP_FLOOR` gives e^−40."""
    u = max(t, EXP_FLOOR) * 0.015625
    p = 1.0 / 3628800.0
    p = p * u + 1.0 / 362880.0
    p = p * u + 1.0 / 40320.0
    p = p * u + 1.0 / 5040.0
    p = p * u + 1.0 / 720.0
    p = p * u + 1.0 / 120.0
    p = p * u + 1.0 / 24.0
    p = p * u + 1.0 / 6.0
    p = p * u + 0.5
    p = p * u + 1.0
    e = p * u + 1.0
    e = e * e
    e = e * e
    e = e * e
    e = e * e
    e = e * e
    return e * e


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 ``bits`` (an LLVM bitcast, which vectorises)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def exp_neg_f32(a):
    """e^(−a) for a float32 a ≥ 0 (clamped at :data:`CLAMP_F32`), relative error below 3e-7.

    e^(−a) = 2^(−n)·e^u with n = round(a·log2 e) and u = n·ln 2 − a, |u| ≤ 0.35, formed in two
    parts (Cody–Waite: n·ln2_hi is exact) so that rounding a·log2 e costs no accuracy; e^u by
    its Taylor polynomial, 2^(−n) straight from its exponent bits.
    """
    c = min(a, CLAMP_F32)
    n = np.int32(c * _LOG2E + _HALF)
    fn = np.float32(n)
    u = (fn * _LN2_HI - c) + fn * _LN2_LO
    p = _E7 * u + _E6
    p = p * u + _E5
    p = p * u + _E4
    p = p * u + _E3
    p = p * u + _E2
    p = p * u + _ONE
    p = p * u + _ONE
    return p * _float32_from_bits(np.int32((127 - n) << 23))


@intrinsic
def _float64_from_bits(typingctx, bits):
    """The float64 whose IEEE bits are the int64 ``bits`` (an LLVM bitcast, which vectorises)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def exp_neg_f64(a):
    """e^(−a) for a float64 a ≥ 0, relative error below 1e-15, and 0 past :data:`CLAMP_F64`
    (NaN stays NaN): :func:`exp_neg_f32`'s reduction in float64, where libm's exp is a call
    per element."""
    c = CLAMP_F64 if a > CLAMP_F64 else a  # noqa: FURB136 (min() would turn NaN into the clamp)
    n = np.int64(c * 1.4426950408889634 + 0.5)
    fn = np.float64(n)
    u = (fn * _LN2_HI_F64 - c) + fn * _LN2_LO_F64
    p = _E64[13] * u + _E64[12]
    p = p * u + _E64[11]
    p = p * u + _E64[10]
    p = p * u + _E64[9]
    p = p * u + _E64[8]
    p = p * u + _E64[7]
    p = p * u + _E64[6]
    p = p * u + _E64[5]
    p = p * u + _E64[4]
    p = p * u + _E64[3]
    p = p * u + _E64[2]
    p = p * u + 1.0
    p = p * u + 1.0
    value = p * _float64_from_bits(np.int64((1023 - n) << 52))
    return 0.0 if a > CLAMP_F64 else value


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def log1p_unit_f32(e):
    """log(1 + e) for a float32 e in [0, 1], as e·q(e) with q a degree-8 polynomial fitted at
    Chebyshev nodes: relative error below 2.5e-7 (a few float32 ulps), and no division (a
    256-bit divide costs as much as the whole polynomial on the AVX2 machines)."""
    q = _L8 * e + _L7
    q = q * e + _L6
    q = q * e + _L5
    q = q * e + _L4
    q = q * e + _L3
    q = q * e + _L2
    q = q * e + _L1
    q = q * e + _L0
    return e * q


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def reciprocal_unit_f32(d):
    """1/d for a float32 d in [1, 2] without a divide: the linear minimax start 24/17 − 8/17·d
    (relative error ≤ 1/17), then three Newton steps r ← r(2 − d·r), each squaring the error
    (1/17 → 3.5e-3 → 1.2e-5 → float32 rounding)."""
    r = _R0 - _R1 * d
    r = r * (_TWO - d * r)
    r = r * (_TWO - d * r)
    return r * (_TWO - d * r)


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def softplus_neg_f32(a):
    """log(1 + e^(−a)) for a float32 a ≥ 0, relative error ~3e-7, in vectorisable float32."""
    return log1p_unit_f32(exp_neg_f32(a))


@numba.njit(cache=True, error_model="numpy", fastmath=EXACT_ENOUGH)
def exp_neg_f64_array(a, out):
    """:func:`exp_neg_f64` over a float64 array, for tests."""
    for i in range(a.shape[0]):
        out[i] = exp_neg_f64(a[i])


@numba.njit(cache=True, error_model="numpy", fastmath=EXACT_ENOUGH)
def exp_nonpositive_array(t, out):
    """:func:`exp_nonpositive` over a float64 array, for tests."""
    for i in range(t.shape[0]):
        out[i] = exp_nonpositive(t[i])


@numba.njit(cache=True, error_model="numpy", fastmath=EXACT_ENOUGH)
def log_sigmoid_array(z, out):
    """(log σ(z), log σ(−z)) over a float32 array → ``out`` (2, n), as the kernels form them:
    min(±z, 0) − log(1 + e^(−|z|)), both sides exact in form (no cancellation). The tests
    check it; the tree's kernel layout takes a pass-through node's constant from it."""
    for i in range(z.shape[0]):
        sp = softplus_neg_f32(abs(z[i]))
        out[0, i] = min(z[i], _ZERO) - sp
        out[1, i] = min(-z[i], _ZERO) - sp
