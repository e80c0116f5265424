"""Built-in encoders Φ."""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_models(register):
    from tailkit.plugins.models.linear import Linear
    from tailkit.plugins.models.mlp import MLP
    from tailkit.plugins.models.resnet import ResNet32
    from tailkit.plugins.models.sparse import SparseLinear, SparseMLP

    register("linear", Linear)
    register("mlp", MLP)
    register("resnet32", ResNet32)
    register("sparse-linear", SparseLinear)
    register("sparse-mlp", SparseMLP)
