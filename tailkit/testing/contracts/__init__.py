"""Contract checks a plugin author can run on their own components, on tiny CPU inputs.

Each ``check_*`` builds the component from ``factory(**options)`` (options validated first, as
``params.yaml`` values are) and raises :class:`ContractError` (an ``AssertionError``) naming the
component and the broken promise. In a plugin's own test suite::

    from tailkit.testing import check_loss, check_options, check_sampler
    from my_plugin import FocalLoss, TreeSampler

    def test_focal_loss_contract():
        check_options(FocalLoss)
        check_loss(FocalLoss, gamma=2.0)
        check_sampler(TreeSampler, shared=False)

Every check also accepts a registered :class:`tailkit.registry.Component` in place of the
factory (messages then use its registered name); :func:`parametrize_components` turns a
registry's components of one kind into pytest parameters.

One module per kind of component (``options``, ``losses``, ``samplers``, ``featurizers``,
``models``, ``datasets``); what they share, and the registry helpers, live in ``common``.
"""

from tailkit.testing.contracts.common import (
    ContractError,
    check_description,
    components,
    parametrize_components,
)
from tailkit.testing.contracts.datasets import check_dataset
from tailkit.testing.contracts.featurizers import check_featurizer
from tailkit.testing.contracts.losses import check_loss
from tailkit.testing.contracts.losses import class_counts as class_counts
from tailkit.testing.contracts.models import check_model
from tailkit.testing.contracts.options import check_options
from tailkit.testing.contracts.samplers import check_sampler

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
