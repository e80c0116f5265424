"""Built-in featurizers."""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_featurizers(register):
    from tailkit.plugins.featurizers.identity import Identity
    from tailkit.plugins.featurizers.rff import RandomFourierFeatures

    register("identity", Identity)
    register("rff", RandomFourierFeatures)
