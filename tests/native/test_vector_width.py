"""512-bit vectors on request: the marked function gets the attribute, wide code where the CPU
has AVX-512, and the values of its unmarked twin bit for bit."""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
import pytest

from tailkit.native.fastmath import EXACT_ENOUGH, softplus_neg_f32
from tailkit.native.vector_width import PREFER_512, prefer_512_bit_vectors


@numba.njit(inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def _log_sigmoid(x, w, out):
    for j in range(x.shape[0]):
        z = x[j] * w[j] + w[j]
        out[j] = min(z, np.float32(0.0)) - softplus_neg_f32(abs(z))


def _body(x, w, out):
    _log_sigmoid(x, w, out)


def _wide_body(x, w, out):
    prefer_512_bit_vectors()
    _log_sigmoid(x, w, out)


def _parallel_body(x, w, out):
    # the documented use: the call inside a prange body, whose outlined function it marks
    for block in numba.prange((x.shape[0] + 255) // 256):
        prefer_512_bit_vectors()
        lo = block * 256
        hi = min(lo + 256, x.shape[0])
        _log_sigmoid(x[lo:hi], w[lo:hi], out[lo:hi])


def _compiled(fn):
    # not cached: inspection needs the compiled module, and the test its own copy
    return numba.njit(error_model="numpy", fastmath=EXACT_ENOUGH)(fn)


def _wide_ok() -> bool:
    return "+avx512f" in llvm.get_host_cpu_features().flatten()


def _assert_same_bits(wide, narrow, size: int, seed: int) -> None:
    """``wide`` computes what the unmarked ``narrow`` computes, bit for bit."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(size) * 30).astype(np.float32)
    w = rng.standard_normal(size).astype(np.float32)
    got, want = np.empty_like(x), np.empty_like(x)
    wide(x, w, got)
    narrow(x, w, want)
    np.testing.assert_array_equal(got, want)


def test_marked_function_is_wide_and_computes_the_same_bits() -> None:
    narrow, wide = _compiled(_body), _compiled(_wide_body)
    _assert_same_bits(wide, narrow, 4099, seed=0)
    (ir,) = wide.inspect_llvm().values()
    assert PREFER_512 in ir
    (plain_ir,) = narrow.inspect_llvm().values()
    assert PREFER_512 not in plain_ir
    if not _wide_ok():
        pytest.skip("no AVX-512 on this CPU: the attribute is there, the code stays 256-bit")
    (asm,) = wide.inspect_asm().values()
    assert "zmm" in asm


def test_a_marked_prange_body_is_wide_and_computes_the_same_bits() -> None:
    wide = numba.njit(parallel=True, error_model="numpy", fastmath=EXACT_ENOUGH)(_parallel_body)
    _assert_same_bits(wide, _compiled(_body), 5000, seed=1)
    # the prange body is a function of its own (the parfor's gufunc), linked into the
    # dispatcher's library: that is where the attribute must land
    library = wide.overloads[wide.signatures[0]].library
    assert PREFER_512 in library.get_llvm_str()
    if not _wide_ok():
        pytest.skip("no AVX-512 on this CPU")
    assert "zmm" in library.get_asm_str()
