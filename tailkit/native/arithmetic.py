"""Portable arithmetic: the same bits from every x86-64 CPU with AVX2 and FMA.

Each numerical library on the pipeline's path picks its kernels by the CPU it runs on, and
kernels of other vector widths or blockings sum in other orders: MKL's GEMMs (its code branch),
ATen's vectorised element-wise and reduction kernels (its CPU capability), oneDNN's
convolutions, numba's compiled loops (LLVM's target CPU), the OpenBLAS behind numpy and scipy
(scikit-learn's PCA and SVD; its core type picks the blocking) and numpy's own SIMD loops (its
AVX-512 ``exp``/``log`` are other polynomials). A model trained on an Intel CPU with AVX-512 then
differs in its last bits from one trained on an AMD CPU with AVX2, and every number after it moves.

:func:`pinned_environment` sets each library's switch to the AVX2-and-FMA level (the
x86-64-v3 micro-architecture level, which every x86-64 server CPU since 2015 has), so any such
CPU runs the same kernels. The libraries read their switches once, when they load, so the
``tailkit`` command's restart (:mod:`tailkit.native.restart`) starts with them. What needs no
switch: glibc's libm picks its FMA variants on every AVX2-and-FMA CPU alike, and the numba
kernels' 512-bit opt-in (:mod:`tailkit.native.vector_width`) asks for registers the pinned
target does not have.

``TAILKIT_ISA=native`` leaves every library to its own choice (faster where vectors are wider);
so does a CPU without AVX2 and FMA, or one that is not x86-64. :func:`arithmetic_record` says
which held in a process, and the stage fingerprints and every trained model's provenance carry
it, so a native result never passes for a portable one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

OPT_OUT = "TAILKIT_ISA"
MODES = ("portable", "native")
#: The level every pinned library targets (LLVM's and the psABI's name for it).
TARGET = "x86-64-v3"
#: What the target needs of the CPU (``/proc/cpuinfo`` flag names).
REQUIRED_FLAGS = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"})
#: LLVM's features of x86-64-v3, spelled out: numba uses the host's features (AVX-512 included)
#: unless it is given a list, whatever CPU name it is given.
LLVM_FEATURES = ",".join(
    "+" + f
    for f in [
        "64bit",
        "avx",
        "avx2",
        "bmi",
        "bmi2",
        "cmov",
        "crc32",
        "cx8",
        "cx16",
        "f16c",
        "fma",
        "fxsr",
        "lzcnt",
        "mmx",
        "movbe",
        "popcnt",
        "sahf",
        "sse",
        "sse2",
        "sse3",
        "ssse3",
        "sse4.1",
        "sse4.2",
        "xsave",
    ]
)


@functools.cache
def _numpy_avx512_groups() -> str:
    """numpy's names for its dispatched AVX-512 targets: it refuses (with a warning) a name
    that is not among its own, and version 2.4 renamed them to the x86-64 levels."""
    try:
        major, minor = (int(p) for p in importlib.metadata.version("numpy").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""
    if (major, minor) >= (2, 4):
        return "X86_V4 AVX512_ICL AVX512_SPR"
    return "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"


def pins() -> dict[str, str]:
    """Each library's switch and the AVX2-level value that pins it."""
    out = {
        "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: one code branch
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NUMBA_CPU_NAME": TARGET,
        "NUMBA_CPU_FEATURES": LLVM_FEATURES,
        "OPENBLAS_CORETYPE": "Haswell",  # OpenBLAS's name for its AVX2-and-FMA kernels
    }
    groups = _numpy_avx512_groups()
    if groups:
        out["NPY_DISABLE_CPU_FEATURES"] = groups
    return out


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), or the platform's
    processor string elsewhere."""
    return _cpuinfo_field("model name") or platform.processor() or "unknown"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``); empty where there is no such file."""
    return frozenset(_cpuinfo_field("flags").split())


def _cpuinfo_field(name: str) -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def requested_mode(environ: dict[str, str] | os._Environ[str]) -> str:
    """``portable`` unless ``TAILKIT_ISA`` says ``native``; any other value is refused."""
    mode = environ.get(OPT_OUT, "").strip().lower() or "portable"
    if mode not in MODES:
        raise ValueError(
            f"{OPT_OUT}: got {environ.get(OPT_OUT)!r}; expected one of {', '.join(MODES)}"
        )
    return mode


def can_pin(flags: frozenset[str] | None = None) -> bool:
    """Whether this machine runs the pinned kernels: x86-64 with every required flag."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return (cpu_flags() if flags is None else flags) >= REQUIRED_FLAGS


def pinned_environment(
    environ: dict[str, str] | os._Environ[str], flags: frozenset[str] | None = None
) -> dict[str, str] | None:
    """``environ`` with every library pinned; None where it already is, native arithmetic is
    asked for, or this CPU cannot run the pinned kernels. A user's own value of a switch is
    replaced: portable means every switch at the one value."""
    if requested_mode(environ) == "native" or not can_pin(flags):
        return None
    wanted = pins()
    if all(environ.get(k) == v for k, v in wanted.items()):
        return None
    return {**environ, **wanted}


def arithmetic_record() -> dict[str, str]:
    """The mode of this process's arithmetic (portable only where every pin is in effect) and
    what its bits depend on: the target, or the CPU itself. The stage fingerprints hold it, so
    switching the mode, or a native run on another CPU, re-runs every stage."""
    if all(os.environ.get(k) == v for k, v in pins().items()):
        return {"mode": "portable", "target": TARGET}
    return {"mode": "native", "cpu": cpu_model()}


def provenance_record(device: str) -> dict[str, Any]:
    """:func:`arithmetic_record` with the architecture, the device and the numerical
    libraries' versions: what a model's provenance records, and what ``tailkit verify`` reads
    to name the likely cause when a rerun's numbers differ."""
    return {
        **arithmetic_record(),
        "machine": platform.machine(),
        "device": device,
        "libraries": library_versions(),
    }


def library_versions() -> dict[str, str]:
    """The installed versions of the libraries whose kernels make the numbers."""
    out = {}
    for name in ("torch", "numpy", "numba", "scipy", "scikit-learn"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out
