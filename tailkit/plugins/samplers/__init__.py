"""Built-in negative samplers."""

import os
from pathlib import Path

from tailkit.hookspecs import hookimpl

# numba's compiled-kernel cache (the tree's kernels) goes under the user's cache directory, not
# into __pycache__ beside the sources: running a command must not write into the package.
os.environ.setdefault(
    "NUMBA_CACHE_DIR",
    str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tailkit" / "numba"),
)


@hookimpl
def register_samplers(register):
    from tailkit.plugins.samplers.in_batch import InBatchSampler
    from tailkit.plugins.samplers.model_based import ModelBasedSampler
    from tailkit.plugins.samplers.tree import TreeSampler
    from tailkit.plugins.samplers.uniform import UniformSampler
    from tailkit.plugins.samplers.unigram import UnigramSampler

    register("uniform", UniformSampler)
    register("unigram", UnigramSampler)
    register("in-batch", InBatchSampler)
    register("tree", TreeSampler, aliases=("adversarial",))
    register("model-based", ModelBasedSampler)
