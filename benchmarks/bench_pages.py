"""Size and opening time of the HTML pages, at the default's size and at 10^6 labels.

    python benchmarks/bench_pages.py [--labels 1000000] [--rows 71507] [--repeats 3]

- **Comparison page** (``tailkit compare A B --html``) on generated data of the shape of
  ``examples/studies/million-labels.yaml``: 10^6 labels, 71,507 single-label test rows of a
  Zipf label distribution, top-5 rankings, every label named (the worst case for the page's
  size: a synthetic study's names are its ids and are left out). Targets: at most 25 MB, and
  interactive (its script has built the tables and plots) within 2 s of opening in headless
  Chromium.
- **Study page** (``reports/index.html``): the committed default's, and its opening time; its
  size does not grow with the labels (per-bin figures, one row per experiment).

Each line: ``page: kind=… labels=… rows=… bytes=… build_s=… open_s=…`` (medians over
``--repeats``; opening time from navigation to the page's ready mark, in a fresh tab).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser import chromium

from tailkit.reporting.compare import compare
from tailkit.reporting.html.comparison import comparison_page
from tailkit.testing.comparisons import generated_comparison


def open_seconds(path: Path, repeats: int) -> float:
    from playwright.sync_api import sync_playwright

    binary = chromium()
    if binary is None:
        raise SystemExit("no Chromium: apt-get install chromium, or set TAILKIT_CHROMIUM")
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        for _ in range(repeats):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e, seen=errors: seen.append(str(e)))
            started = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("body[data-ready=true]", timeout=60_000)
            times.append(time.perf_counter() - started)
            if errors:
                raise SystemExit(f"{path}: {errors[0]}")
            page.close()
        browser.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=71_507)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    started = time.perf_counter()
    made = generated_comparison(args.labels, args.rows, seed=0)
    result = compare(*made.sides, outcomes=made.outcomes)
    built = time.perf_counter()
    page = comparison_page(result, made.outcomes)
    build_s = time.perf_counter() - built
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "compare.html"
        out.write_text(page)
        size = out.stat().st_size
        opened = open_seconds(out, args.repeats)
    print(
        f"page: kind=compare labels={args.labels} rows={args.rows} bytes={size} "
        f"build_s={build_s:.2f} open_s={opened:.2f} (data and tests {built - started:.1f} s; "
        f"targets: bytes <= 25e6, open_s <= 2)"
    )
    study = ROOT / "reports" / "index.html"
    if study.is_file():
        print(
            f"page: kind=study labels=3875 rows=23479 bytes={study.stat().st_size} build_s=– "
            f"open_s={open_seconds(study, args.repeats):.2f}"
        )


if __name__ == "__main__":
    main()
