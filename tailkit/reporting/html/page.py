"""One self-contained HTML file: the page's data as inline JSON, our scripts and styles inline.

The scripts are tailkit's own (``assets/``: SVG and canvas charts, sortable and virtualised
tables), not a vendored plotting library: the pages need lines with bands, grouped bars, one
scatter and two tables, which take a few hundred lines, where a general library would add
megabytes to every page. A Content-Security-Policy that allows no source but the page itself
makes the browser refuse any request a future edit might add.

Large numeric columns travel as base64 of little-endian typed arrays (:func:`packed`), which
the page decodes into typed arrays without parsing a number at a time: a million-label page
stays a few megabytes and opens in well under a second. The output is a function of the data
alone (no timestamp, keys in insertion order), so a re-run writes the same bytes.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

ASSETS = Path(__file__).with_name("assets")
#: The scripts every page loads, in order, then the page's own (``<kind>.js``).
COMMON_SCRIPTS = ("charts.js", "tables.js")
POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
DTYPES: dict[str, str] = {"i32": "<i4", "f32": "<f4", "f64": "<f8"}


def packed(values: Any, dtype: str) -> dict[str, str]:
    """A numeric column as ``{"$array": dtype, "b64": …}`` (``i32``, ``f32``, ``f64``; NaN for a
    missing float), which the page's ``TK.data()`` turns into a typed array."""
    array = np.ascontiguousarray(np.asarray(values).astype(DTYPES[dtype]))
    return {"$array": dtype, "b64": base64.b64encode(array.tobytes()).decode("ascii")}


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays as JSON numbers and lists, NaN and ±inf as null
    (JSON has none)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _script_json(data: dict[str, Any]) -> str:
    text = json.dumps(plain(data), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # inside <script>, "</" could close the element early
    return text.replace("</", "<\\/")


def render(kind: str, title: str, data: dict[str, Any]) -> str:
    """The page of ``kind`` (``study`` or ``compare``: its script is ``assets/<kind>.js``)."""
    style = (ASSETS / "page.css").read_text()
    scripts = "\n".join((ASSETS / name).read_text() for name in (*COMMON_SCRIPTS, f"{kind}.js"))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{style}</style>\n</head>\n"
        f'<body data-kind="{kind}">\n<main id="page"><p class="loading">Loading…</p></main>\n'
        f'<script type="application/json" id="tailkit-data">{_script_json(data)}</script>\n'
        f"<script>\n{scripts}</script>\n</body>\n</html>\n"
    )
