"""The modules that moved (out of the package root into storage/, pipeline/ and native/; the
output layer and its optimisers and kernels into output/; the drivers of one run into
pipeline/), kept importable under their old names for one release, with a DeprecationWarning,
so that a plugin written against them keeps working: ``import tailkit.atomic`` gives the very module
``tailkit.storage.atomic`` (one module object, one state).

A finder on ``sys.meta_path`` answers only for these names; everything else falls through to
the normal import system. :mod:`tailkit.pipeline.codehash` resolves an old name through
:data:`MOVED` too, so a plugin's code fingerprint still holds the file it imports.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED = {
    f"tailkit.{old}": f"tailkit.{new}"
    for old, new in {
        "allocator": "native.allocator",
        "openmp": "native.openmp",
        "kernel_cache": "native.kernel_cache",
        "vector_width": "native.vector_width",
        "fastmath": "native.fastmath",
        "grouping": "native.grouping",
        "runtime": "native.device",
        "atomic": "storage.atomic",
        "checksum": "storage.checksum",
        "download": "storage.download",
        "parquet": "storage.parquet",
        "tensorfile": "storage.tensorfile",
        "cache": "storage.feature_cache",
        "splits": "storage.splits",
        "label_table": "storage.label_table",
        "metrics_file": "storage.metrics_file",
        "file_hash": "storage.file_hash",
        "linked_outputs": "storage.linked_outputs",
        "params_yaml": "storage.params_yaml",
        "experiment": "pipeline.experiment",
        "subsampling": "pipeline.subsampling",
        "featurizing": "pipeline.featurizing",
        "artifacts": "pipeline.artifacts",
        "trained": "pipeline.trained",
        "predicting": "pipeline.predict_new_rows",
        "codehash": "pipeline.codehash",
        "parallel_repro": "pipeline.parallel_repro",
        "stage_address": "pipeline.stage_address",
        "finite": "training.finite",
        "plugins.samplers.tree_fit": "plugins.samplers.tree.fit",
        "plugins.samplers.pca": "plugins.samplers.tree.pca",
        "training.output_layer": "output.output_layer",
        "training.optim": "output.optim",
        "training.sparse_rows": "output.sparse_rows",
        "training.schedules": "output.schedules",
        "training.cosine_kernels": "output.cosine_kernels",
        "training.row_gradient_kernels": "output.row_gradient_kernels",
        "training.hit_kernels": "output.hit_kernels",
        "training.unique_kernels": "output.unique_kernels",
        "distributed.layer": "output.shards",
        "distributed.plan": "training.plan",
        "distributed.predict": "evaluation.predict_sharded",
        "distributed.topk": "evaluation.topk_merge",
        "evaluation.run": "pipeline.evaluate_run",
        "training.run": "pipeline.train_run",
        "training.second_stage": "pipeline.second_stage",
        "training.saved_run": "pipeline.saved_run",
        "training.run_plan": "pipeline.run_plan",
        "training.learner": "pipeline.learner_run",
        "pipeline.finite": "training.finite",
    }.items()
}


#: Names that moved out of a module that stays, by old module: name -> new module.
MOVED_NAMES = {
    "tailkit.components": {
        **dict.fromkeys(
            (
                "PredictionContext",
                "CorrectionColumns",
                "TableColumns",
                "label_chunks",
                "inverse_order",
                "CorrectsAtPrediction",
            ),
            "tailkit.evaluation.correction",
        ),
        **dict.fromkeys(
            (
                "declared_traits",
                "DEFAULT_PROPENSITY",
                "dataset_propensity",
                "featurizer_accepts",
                "featurizer_output",
                "batch_modes",
                "model_input_kind",
                "is_learner",
            ),
            "tailkit.registry",
        ),
    },
    "tailkit.sparse": {"check_rows": "tailkit.csr"},
}


def moved_attribute(module: str, name: str) -> object:
    """The object ``module.name`` now lives in, with a DeprecationWarning; AttributeError for
    a name that never moved (a module's ``__getattr__`` calls this)."""
    new = MOVED_NAMES.get(module, {}).get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} moved to {new}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(new), name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
