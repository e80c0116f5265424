"""The Bamler–Mandt adversarial sampler: a probabilistic binary tree over the labels, fitted on
whitened PCA features of the inputs, that draws hard negatives in O(k log C) and corrects
prediction by + log p_n(y|x).

``sampler.py`` (the registered ``tree`` sampler), ``fit.py`` (the tree's fit and its split
rules), ``pca.py`` (the whitened projection it conditions on), ``draw_kernels.py`` (ancestral
sampling and path log-probabilities, compiled) and ``correction_kernels.py`` (every label's
log p_n for a block of rows, by subtree, compiled).
"""

from tailkit.plugins.samplers.tree.sampler import TreeSampler

__all__ = ["TreeSampler"]
