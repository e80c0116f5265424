"""Write-then-rename helpers (tailkit.storage.atomic): concurrent publishes, SIGTERM, stale temporaries."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tailkit.errors import TailkitError
from tailkit.storage.atomic import (
    TERMINATED_EXIT,
    atomic_dir,
    atomic_path,
    remove_stale_temporaries,
)

posix_only = pytest.mark.skipif(os.name == "nt", reason="fork, SIGTERM and pids as on POSIX")


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _publish_repeatedly(target: Path, writer: int, rounds: int, files: int) -> None:
    for _ in range(rounds):
        with atomic_dir(target) as tmp:
            for i in range(files):
                (tmp / f"{i}.txt").write_text(str(writer))


@posix_only
def test_concurrent_publishes_of_one_directory_both_succeed(tmp_path: Path):
    """Two processes replacing the same (large) directory at once: rmtree-then-rename used to
    raise FileNotFoundError (both deleting the old files) or ENOTEMPTY in one of them."""
    target = tmp_path / "out"
    _publish_repeatedly(target, writer=9, rounds=1, files=1500)  # an old result to replace
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_publish_repeatedly, args=(target, w, 15, 300)) for w in (0, 1)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    written = {p.read_text() for p in target.iterdir()}
    assert len(list(target.iterdir())) == 300 and len(written) == 1  # one writer's whole result
    assert _temporaries(tmp_path) == []


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_a_temporary_removed_from_outside_is_a_one_line_error(tmp_path: Path, kind: str):
    context = atomic_dir if kind == "dir" else atomic_path
    with (
        pytest.raises(TailkitError, match="removed by another process") as info,
        context(tmp_path / "out") as tmp,
    ):
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


_KILLED_CHILD = """
import sys, time
from pathlib import Path
from tailkit.storage.atomic import atomic_dir, atomic_path

target = Path(sys.argv[1])
if sys.argv[2] == "dir":
    with atomic_dir(target) as tmp:
        (tmp / "part.bin").write_bytes(b"x" * 1000)
        print(tmp, flush=True)
        time.sleep(60)
else:
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"x" * 1000)
        print(tmp, flush=True)
        time.sleep(60)
"""


@posix_only
@pytest.mark.parametrize("kind", ["dir", "file"])
def test_sigterm_inside_an_atomic_context_removes_the_temporary(tmp_path: Path, kind: str):
    target = tmp_path / "features"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_KILLED_CHILD), str(target), kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        tmp = Path(child.stdout.readline().strip())  # the child is inside the context now
        assert tmp.exists()
        child.send_signal(signal.SIGTERM)
        code = child.wait(20)
    finally:
        child.kill()
        child.stdout.close()
    assert list(tmp_path.iterdir()) == []  # no temporary, and no half-written target
    assert code == TERMINATED_EXIT  # 128 + 15, as a shell reports SIGTERM


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process (until the kernel reuses it, much later)
    return child.pid


@posix_only
@pytest.mark.parametrize("kind", ["dir", "file"])
def test_stale_temporaries_of_dead_processes_are_removed_at_the_next_start(
    tmp_path: Path, kind: str
):
    dead, live = _dead_pid(), os.getpid()
    stale = tmp_path / f".features.{dead}.k3x9q2aa.tmp"
    stale.mkdir()
    (stale / "part-0.parquet").write_bytes(b"x" * 1000)
    stale_file = tmp_path / f".features.{dead}.b7c1d0e2.tmp"
    stale_file.write_bytes(b"x")
    running = tmp_path / f".features.{live}.a1b2c3d4.tmp"  # a concurrent run's, in use
    running.mkdir()
    old_style = tmp_path / ".features.zz81ab0c.tmp"  # no pid: nothing says its writer is gone
    old_style.mkdir()
    other = tmp_path / f".labels.{dead}.q1w2e3r4.tmp"  # another target's: not ours to judge
    other.mkdir()

    context = atomic_dir if kind == "dir" else atomic_path
    with context(tmp_path / "features") as tmp:
        assert tmp.name.startswith(f".features.{live}.")
        assert not stale.exists() and not stale_file.exists()
        assert running.is_dir() and old_style.is_dir() and other.is_dir()
    assert sorted(_temporaries(tmp_path)) == sorted([running.name, old_style.name, other.name])


@posix_only
def test_stale_sweep_runs_once_per_target_and_process(tmp_path: Path):
    target = tmp_path / "model"
    assert remove_stale_temporaries(target) == []
    stale = tmp_path / f".model.{_dead_pid()}.abcdefgh.tmp"
    stale.mkdir()
    # A dead process cannot start a temporary after this process's first look: no second scan.
    assert remove_stale_temporaries(target) == [] and stale.exists()
    assert remove_stale_temporaries(tmp_path / "other") == []


@posix_only
def test_sigterm_handler_is_restored_and_foreign_handlers_are_kept(tmp_path: Path):
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with atomic_dir(tmp_path / "a"), atomic_path(tmp_path / "b"):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

        def handler(signum: int, frame: object) -> None:  # an application's own
            pass

        signal.signal(signal.SIGTERM, handler)
        with atomic_dir(tmp_path / "a"):
            assert signal.getsignal(signal.SIGTERM) is handler
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
