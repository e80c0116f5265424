"""tailkit: a reproducible, plugin-based pipeline for long-tail and extreme classification.

Plugin authors import everything they need from here. The names resolve on first use (PEP 562):
``import tailkit`` alone does not import torch, so that commands which never touch a model
(``tailkit compare``, ``tailkit report``, ``--help``) start in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailkit import _moved
from tailkit.paths import cache_dir

# numba's compiled-kernel cache (the kernels' cache=True) goes under the user's cache directory,
# not into __pycache__ beside the sources: running a command must not write into the package.
# numba keys a cached kernel on its own module's source only, so the directory is named after
# the helpers every kernel inlines (fastmath.py): an edit there must not serve stale machine
# code. Set before anything in tailkit imports numba, which reads it once.
_HELPERS = hashlib.sha256(
    (Path(__file__).parent / "native" / "fastmath.py").read_bytes()
).hexdigest()[:12]
os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / f"numba-{_HELPERS}"))

# the old names of the modules that moved into storage/, pipeline/ and native/ (tailkit/_moved.py)
_moved.install()

if TYPE_CHECKING:
    from tailkit.components import (
        Dataset,
        Encoder,
        Featurizer,
        FullBatch,
        Loss,
        RawData,
        SampledBatch,
        Sampler,
        ScoreContext,
    )
    from tailkit.errors import (
        DataValidationError,
        InvalidParameterError,
        PluginError,
        TailkitError,
        UnknownComponentError,
    )
    from tailkit.evaluation.correction import (
        CorrectionColumns,
        CorrectsAtPrediction,
        OrderedCorrection,
        PredictionContext,
    )
    from tailkit.hookspecs import hookimpl
    from tailkit.validation import Interval, Options

__version__ = "0.1.0"

_HOMES = {
    "tailkit.components": (
        "Dataset",
        "Encoder",
        "Featurizer",
        "FullBatch",
        "Loss",
        "RawData",
        "SampledBatch",
        "Sampler",
        "ScoreContext",
    ),
    "tailkit.evaluation.correction": (
        "CorrectionColumns",
        "CorrectsAtPrediction",
        "OrderedCorrection",
        "PredictionContext",
    ),
    "tailkit.errors": (
        "DataValidationError",
        "InvalidParameterError",
        "PluginError",
        "TailkitError",
        "UnknownComponentError",
    ),
    "tailkit.hookspecs": ("hookimpl",),
    "tailkit.validation": ("Interval", "Options"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "CorrectionColumns",
    "CorrectsAtPrediction",
    "DataValidationError",
    "Dataset",
    "Encoder",
    "Featurizer",
    "FullBatch",
    "Interval",
    "InvalidParameterError",
    "Loss",
    "Options",
    "OrderedCorrection",
    "PluginError",
    "PredictionContext",
    "RawData",
    "SampledBatch",
    "Sampler",
    "ScoreContext",
    "TailkitError",
    "UnknownComponentError",
    "__version__",
    "hookimpl",
]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'tailkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
