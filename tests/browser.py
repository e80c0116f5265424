"""A real browser for the page tests: Debian's Chromium driven by Playwright.

``open_page(path)`` opens an HTML file from disk in headless Chromium, waits until the page's
script marks it ready, and records what a person would not want: console errors and warnings,
uncaught exceptions, and every request the page makes (a self-contained page makes none but
its own file). A test skips, saying how to get one, only where no browser can be started.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
#: Screenshots of the pages, kept after the run (gitignored).
ARTIFACTS = ROOT / "test-artifacts"
INSTALL = (
    "no Chromium to test the HTML pages in: `apt-get install chromium` (Debian's package, "
    "what .ci/run installs) or set TAILKIT_CHROMIUM to a Chromium or Chrome binary"
)


def chromium() -> str | None:
    found = os.environ.get("TAILKIT_CHROMIUM")
    if found:
        return found
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@dataclass
class Visit:
    page: Any  # playwright.sync_api.Page
    url: str
    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def outside_requests(self) -> list[str]:
        return [r for r in self.requests if r != self.url]

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        out = ARTIFACTS / name
        self.page.screenshot(path=str(out), full_page=True)
        return out


@contextmanager
def open_page(path: Path, width: int = 1280, height: int = 900) -> Iterator[Visit]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (it comes with `pip install -e .[dev]`)")
    binary = chromium()
    if binary is None:
        pytest.skip(INSTALL)
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        except Exception as exc:  # noqa: BLE001 - any failure to start is a missing browser
            pytest.skip(f"{INSTALL} ({binary} did not start: {str(exc).splitlines()[0]})")
        page = browser.new_page(viewport={"width": width, "height": height})
        visit = Visit(page, path.resolve().as_uri())
        page.on(
            "console",
            lambda m: (
                visit.problems.append(f"{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: visit.problems.append(f"exception: {e}"))
        page.on("request", lambda r: visit.requests.append(r.url))
        try:
            page.goto(visit.url)
            page.wait_for_selector("body[data-ready=true]", timeout=20_000)
            yield visit
        finally:
            browser.close()


def _number(text: str) -> float:
    return float(text.split("±")[0].replace("≈", "").strip())


def _summary_rows(project: Path) -> list[str]:
    """The experiments of summary.md's table, in its order."""
    lines = (project / "reports" / "summary.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| experiment"))
    table = itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])
    return [line.split("|")[1].strip().removesuffix(" †") for line in table]


def check_study_page(project: Path, header: str = "accuracy", key: str = "accuracy") -> None:
    """Open ``project``'s reports/index.html and check what a reader sees against
    summary.md's rows and metrics/*.json's ``test.<key>`` (the ``header`` column); sort by it;
    open a row's settings; a screenshot to test-artifacts/<project name>-study.png."""
    experiments = _summary_rows(project)
    with open_page(project / "reports" / "index.html") as visit:
        assert visit.problems == [] and visit.outside_requests() == []
        p = visit.page
        headers = p.locator("#experiments-table th").all_inner_texts()
        column = headers.index(header)
        rows = p.locator("#experiments-table tbody tr")
        assert rows.count() == len(experiments)
        keys = [
            p.locator("#experiments-table th").nth(j).get_attribute("data-key")
            for j in range(len(headers))
        ]
        names = []
        for i in range(rows.count()):  # every test metric of every row, as the files hold it
            cells = rows.nth(i).locator("td").all_inner_texts()
            names.append(cells[0].removesuffix(" †"))
            detail = json.loads((project / "metrics" / "detail" / f"{names[-1]}.json").read_text())
            for text, dotted in zip(cells, keys, strict=True):
                if dotted and dotted.startswith("test."):
                    value = detail["test"].get(dotted.removeprefix("test."))
                    expected = "–" if value is None else round(100 * value, 2)
                    assert (text if text == "–" else _number(text)) == expected, (names[-1], dotted)
        assert names == experiments  # summary.md's rows, in its order
        p.locator(f"#experiments-table th[data-key='test.{key}']").click()
        order = [
            _number(t)
            for t in p.locator(
                f"#experiments-table tbody tr td:nth-child({column + 1})"
            ).all_inner_texts()
        ]
        assert order == sorted(order, reverse=True)
        assert p.locator("#experiments-table th[aria-sort=descending]").inner_text() == header
        rows.first.click()  # its settings and code open under it
        assert "model.name" in p.locator("#experiments-table tr.details").inner_text()
        assert p.locator("#curves svg").count() == 4 and p.locator("#bins polygon").count() > 0
        visit.screenshot(f"{project.name}-study.png")


def check_compare_page(path: Path, labels: int) -> None:
    """Open a ``tailkit compare --html`` page: no console error or request, ``labels`` labels
    in its table, and the first label's drill-down showing its test rows under both runs."""
    with open_page(path) as visit:
        assert visit.problems == [] and visit.outside_requests() == []
        p = visit.page
        count = p.locator("#label-table .vcount").inner_text()
        assert count == f"{labels:,} of {labels:,} labels", count
        p.locator("#label-table th[data-key=test]").click()  # the label with most test rows
        p.locator("#label-table tbody tr").first.click()
        assert p.locator("#drill-rows tbody tr").count() > 0
        assert (
            p.locator("#drill-rows .hit").count() > 0 or "0 of" in p.locator("#drill").inner_text()
        )
        visit.screenshot(f"{path.stem}.png")
