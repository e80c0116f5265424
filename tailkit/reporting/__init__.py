"""What the ``report`` stage builds from the metrics: study tables, figures, DVC experiments.

Kept apart from :mod:`tailkit.evaluation` on purpose: ``train`` and ``evaluate`` depend on that
package in dvc.yaml, so report-only code living there would re-train every experiment on a
change to a table's layout.
"""
