"""Built-in featurizers.

A featurizer declares what it takes and gives with two class attributes, which
:func:`tailkit.testing.check_featurizer` exercises and a stage can read to refuse a mismatch
before any work:

* ``accepts``: the RawData modalities it can fit and transform, a tuple of ``"dense"``,
  ``"sparse"``, ``"image"`` and ``"text"`` (``("dense",)`` when absent);
* ``output``: what ``transform`` returns, ``"dense"`` (an (N, D') float32 array), ``"sparse"``
  (an (N, D') float32 CSR matrix) or ``"image"`` (an (N, H, W, 3) uint8 array).

Handed an input kind it does not accept, a built-in raises a one-line ``ValueError``.
"""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_featurizers(register):
    from tailkit.plugins.featurizers.geocells import GeoCells
    from tailkit.plugins.featurizers.identity import Identity
    from tailkit.plugins.featurizers.pca import PCA
    from tailkit.plugins.featurizers.pixels import Pixels
    from tailkit.plugins.featurizers.rff import RandomFourierFeatures
    from tailkit.plugins.featurizers.sparse_identity import SparseIdentity
    from tailkit.plugins.featurizers.text_tfidf import TextTfidf
    from tailkit.plugins.featurizers.tfidf import Tfidf
    from tailkit.plugins.featurizers.tfidf_svd import TfidfSVD

    register("geocells", GeoCells)
    register("identity", Identity)
    register("pca", PCA)
    register("pixels", Pixels)
    register("rff", RandomFourierFeatures)
    register("sparse-identity", SparseIdentity)
    register("text-tfidf", TextTfidf)
    register("tfidf", Tfidf)
    register("tfidf-svd", TfidfSVD)
