"""Built-in losses."""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_losses(register):
    from tailkit.plugins.losses.class_balanced import ClassBalancedLoss
    from tailkit.plugins.losses.decoupled import Decoupled, SampledDecoupled
    from tailkit.plugins.losses.distribution_balanced import DistributionBalanced
    from tailkit.plugins.losses.dro_lt import DROLT
    from tailkit.plugins.losses.elm import ELM
    from tailkit.plugins.losses.ldam import LDAM
    from tailkit.plugins.losses.logit_adjusted import BalancedSoftmax, LogitAdjusted
    from tailkit.plugins.losses.multilabel import MultilabelCE, NWayMClass
    from tailkit.plugins.losses.nce import NCE
    from tailkit.plugins.losses.negative_sampling import NegativeSampling
    from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
    from tailkit.plugins.losses.softmax import SoftmaxCE

    register("softmax", SoftmaxCE)
    register("sampled-softmax", SampledSoftmax)
    register("negative-sampling", NegativeSampling)
    register("nce", NCE)
    register("logit-adjusted", LogitAdjusted)
    register("balanced-softmax", BalancedSoftmax)
    register("decoupled", Decoupled)
    register("sampled-decoupled", SampledDecoupled)
    register("ldam", LDAM)
    register("cb-focal", ClassBalancedLoss)
    register("elm", ELM)
    register("dro-lt", DROLT)
    register("multilabel-ce", MultilabelCE)
    register("nway-mclass", NWayMClass)
    register("distribution-balanced", DistributionBalanced)
