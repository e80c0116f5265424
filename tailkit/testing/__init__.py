"""Test helpers for tailkit components: contract checks any plugin author can run.

See :mod:`tailkit.testing.contracts` for what each check asserts and how to use it.
"""

from tailkit.testing.contracts import (
    ContractError,
    check_dataset,
    check_description,
    check_featurizer,
    check_loss,
    check_model,
    check_options,
    check_sampler,
    components,
    parametrize_components,
)

__all__ = [
    "ContractError",
    "check_dataset",
    "check_description",
    "check_featurizer",
    "check_loss",
    "check_model",
    "check_options",
    "check_sampler",
    "components",
    "parametrize_components",
]
