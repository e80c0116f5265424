"""tailkit: a reproducible, plugin-based pipeline for long-tail and extreme classification.

Plugin authors import everything they need from here.
"""

from tailkit.components import (
    Dataset,
    Encoder,
    Featurizer,
    Loss,
    LossInput,
    PredictionContext,
    RawData,
    Sampler,
)
from tailkit.errors import (
    DataValidationError,
    InvalidParameterError,
    PluginError,
    TailkitError,
    UnknownComponentError,
)
from tailkit.hookspecs import hookimpl
from tailkit.validation import Interval, Options

__version__ = "0.1.0"

__all__ = [
    "DataValidationError",
    "Dataset",
    "Encoder",
    "Featurizer",
    "Interval",
    "InvalidParameterError",
    "Loss",
    "LossInput",
    "Options",
    "PluginError",
    "PredictionContext",
    "RawData",
    "Sampler",
    "TailkitError",
    "UnknownComponentError",
    "__version__",
    "hookimpl",
]
