"""Progress bars: on only for an interactive terminal without --quiet, and always on stderr."""

from __future__ import annotations

import io
import sys

import pytest

from tailkit import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore():
    yield
    progress.configure(quiet=True)


@pytest.mark.parametrize(
    ("tty", "quiet", "on"), [(True, False, True), (True, True, False), (False, False, False)]
)
def test_bars_show_only_on_a_terminal_without_quiet(monkeypatch, tty, quiet, on):
    stream = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    assert progress.configure(quiet) is on and progress.enabled() is on
    assert list(progress.each(range(3), "featurize", unit="split")) == [0, 1, 2]
    written = stream.getvalue()
    assert ("featurize" in written) is on  # a bar was drawn, or nothing at all


def test_bars_never_touch_stdout(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", Terminal())
    progress.configure(quiet=False)
    for _ in progress.each(range(5), "fit-sampler"):
        pass
    assert capsys.readouterr().out == ""
