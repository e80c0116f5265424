"""Stage ``seeds``: ``metrics/seeds.json``, every experiment's metrics as mean ± std over its
training seeds (``base.seed`` and ``base.extra_seeds``) with the per-seed values
(:mod:`tailkit.reporting.seeds`), from ``metrics/detail/``. With one seed per experiment the
std is null and the values are the experiment's own."""

from __future__ import annotations

from typing import Any

from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.reporting.runs import workspace_runs
from tailkit.reporting.seeds import seed_aggregate
from tailkit.storage.atomic import write_json
from tailkit.storage.metrics_file import null_non_finite


def run(params: Params, layout: Layout) -> dict[str, Any]:
    aggregate = seed_aggregate(workspace_runs(params, layout, with_time=False))
    write_json(layout.seeds_metrics, null_non_finite(aggregate))
    return aggregate
