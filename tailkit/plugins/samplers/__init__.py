"""Built-in negative samplers."""

from tailkit.hookspecs import hookimpl


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
