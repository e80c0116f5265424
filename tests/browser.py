"""A real browser for the page tests: Debian's Chromium driven by Playwright.

``open_page(path)`` opens an HTML file from disk in headless Chromium, waits until the page's
script marks it ready, and records what a person would not want: console errors and warnings,
uncaught exceptions, and every request the page makes (a self-contained page makes none but
its own file). A test skips, saying how to get one, only where no browser can be started.
"""

from __future__ import annotations

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
