"""The Extreme Classification Repository's values are TF-IDF weights (docs/xc-features.md):
read as given (rows at unit L2 norm), never weighted again unless asked."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from tailkit.errors import DataValidationError
from tailkit.plugins.featurizers.sparse_identity import SparseIdentity
from tailkit.plugins.featurizers.tfidf import Tfidf
from tailkit.plugins.featurizers.tfidf_svd import TfidfSVD

# The first values of EURLex-4K's first test row, as the repository's file holds them.
EURLEX_ROW = {0: 0.101468, 1: 0.554374, 2: 0.235760, 3: 0.065255, 8: 0.152305, 14: 2.387193}


def _rows(rows: list[dict[int, float]], dim: int = 16) -> sp.csr_matrix:
    data, indices, indptr = [], [], [0]
    for row in rows:
        indices += list(row)
        data += list(row.values())
        indptr.append(len(indices))
    return sp.csr_matrix((np.array(data, np.float32), indices, indptr), shape=(len(rows), dim))


def test_sparse_identity_keeps_values_and_normalises_rows_like_the_peers():
    x = _rows([EURLEX_ROW, {}, {5: 3.0, 2: 4.0}])
    out = SparseIdentity().fit(x).transform(x)
    expected = normalize(x.astype(np.float64), norm="l2")
    assert out.dtype == np.float32 and out.has_sorted_indices
    np.testing.assert_allclose(out.toarray(), expected.toarray(), rtol=1e-6)
    assert out[1].nnz == 0  # an empty row stays empty
    np.testing.assert_allclose(out[2].toarray()[0, [2, 5]], [0.8, 0.6], rtol=1e-7)
    raw = SparseIdentity(normalize=False).fit(x).transform(x)
    assert np.array_equal(raw.toarray(), x.toarray())  # the values, bit for bit


def test_tfidf_refuses_weights_naming_the_row_and_value():
    x = _rows([{0: 2.0, 3: 1.0}, EURLEX_ROW])
    with pytest.raises(ValueError) as info:
        Tfidf().fit(x)
    message = str(info.value)
    assert message.startswith("featurizer 'tfidf' takes integer counts; row 1 holds 0.101468")
    assert "sparse-identity" in message and "counts: false" in message
    Tfidf(counts=False).fit(x)  # told: it weights them anyway
    Tfidf().fit(_rows([{0: 2.0, 3: 1.0}, {1: 7.0}]))  # counts pass


def test_tfidf_svd_without_weighting_is_the_svd_of_the_normalised_rows():
    x = sp.random(40, 12, density=0.4, random_state=1, format="csr", dtype=np.float32) * 5
    with pytest.raises(ValueError, match="takes integer counts"):
        TfidfSVD(dim=4).fit(x)
    f = TfidfSVD(dim=4, weighting="none").fit(x)
    from sklearn.decomposition import TruncatedSVD

    reference = TruncatedSVD(4, algorithm="randomized", random_state=0)
    expected = reference.fit_transform(normalize(x.astype(np.float64)))
    np.testing.assert_allclose(f.transform(x), expected, rtol=1e-4, atol=1e-5)


def test_featurize_refuses_tfidf_on_an_xc_archive_before_any_work(tmp_path, monkeypatch):
    import copy

    import yaml
    from test_studies import STUDIES, _small

    from tailkit.params import parse_params
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import download, featurize, subsample

    study = yaml.safe_load((STUDIES[0].parent / "eurlex-4k.yaml").read_text())
    small = _small(copy.deepcopy(study), tmp_path, monkeypatch)
    small["featurize"]["tfidf"] = {"name": "tfidf"}  # beside the study's bow and svd sets
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    params, layout, registry = parse_params(small, "study.yaml"), Layout(), make_registry()
    download.run(params, layout, registry)
    subsample.run(params, layout, registry)
    with pytest.raises(DataValidationError) as info:
        featurize.run(params, layout, registry, "tfidf")
    assert str(info.value).startswith(
        "study.yaml: featurize.tfidf: dataset 'eurlex-4k' holds TF-IDF weights, not counts"
    )
    assert not layout.feature_set("tfidf").exists()
    meta = featurize.run(params, layout, registry, "bow")
    assert meta["values"] == "weights" and meta["kind"] == "sparse"
