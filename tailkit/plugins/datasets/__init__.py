"""Built-in datasets."""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_datasets(register):
    from tailkit.plugins.datasets.geonames import GeoNames
    from tailkit.plugins.datasets.synthetic import HierarchicalGaussian

    register("geonames", GeoNames)
    register("synthetic", HierarchicalGaussian)
