"""Built-in datasets."""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_datasets(register):
    from tailkit.plugins.datasets.cifar import Cifar10, Cifar100
    from tailkit.plugins.datasets.digits import Digits
    from tailkit.plugins.datasets.geonames import GeoNames
    from tailkit.plugins.datasets.icd10 import ICD10CM
    from tailkit.plugins.datasets.image_lists import ImageNetLT, INaturalist2018, PlacesLT
    from tailkit.plugins.datasets.synthetic import HierarchicalGaussian
    from tailkit.plugins.datasets.synthetic_xc import SyntheticXC
    from tailkit.plugins.datasets.table import Table
    from tailkit.plugins.datasets.xc import DATASETS as XC_DATASETS

    register("cifar10", Cifar10)
    register("cifar100", Cifar100)
    register("digits", Digits)
    register("geonames", GeoNames)
    register("icd10-cm", ICD10CM)  # real long-tailed text from the simple-icd-10-cm package
    register("imagenet-lt", ImageNetLT)
    register("places-lt", PlacesLT)
    register("inaturalist2018", INaturalist2018)
    register("synthetic", HierarchicalGaussian)
    register("synthetic-xc", SyntheticXC)
    register("table", Table)  # a user's own Parquet, CSV, TSV or JSON-lines file
    # The Extreme Classification Repository: the generic `xc` and the named datasets.
    for name, factory in XC_DATASETS.items():
        register(name, factory)
