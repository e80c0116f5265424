"""Write-then-rename helpers: a crash never leaves a partial file a later stage would trust.

A temporary lives next to its target as ``.<name>.<pid>.<token>.tmp`` and is renamed over the
target only on success. Signals and concurrent runs are handled too (a killed featurize used to
leave hundreds of MB under ``data/`` for ever; two downloads crashed each other):

* while a temporary exists, SIGTERM (what ``kill``, DVC and job schedulers send) raises
  ``SystemExit(143)`` instead of killing outright, so the ``finally`` that removes it runs;
  SIGINT already raises KeyboardInterrupt. A second SIGTERM kills at once;
* at its first start in a process for a given target, :func:`atomic_path` / :func:`atomic_dir`
  remove the target's temporaries whose pid is no process any more (SIGKILL, a power cut). A
  live pid's temporary is kept: it belongs to a concurrent run (this assumes the writers of a
  folder share one pid namespace: one machine, no containers with their own pids). Temporaries
  named before pids were (``.<name>.<token>.tmp``) are left alone: nothing tells whether their
  writer still runs. Not on Windows, where probing a pid with ``os.kill`` would end it;
* publishing a directory first renames the old one aside, so two processes publishing the same
  directory at once both succeed (the last one wins) instead of one deleting what the other is
  renaming.

:func:`output_lock` serialises whole runs that write the same output (``tailkit download``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tailkit.errors import TailkitError

# Exit status of a process that SIGTERM ended, as shells report it (128 + signal number).
TERMINATED_EXIT = 128 + 15
# How often a directory publish retries when other processes keep publishing in between.
_PUBLISH_ATTEMPTS = 100

_swept: set[tuple[str, str]] = set()  # (folder, name): stale temporaries already removed
_sigterm_depth = 0  # open atomic contexts in the main thread
_sigterm_previous: Any = None


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _cleanup_on_sigterm():
        remove_stale_temporaries(path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
        except OSError as exc:  # a read-only folder: name the output, not the temporary
            raise _naming_output(exc, path) from exc
        os.close(fd)
        tmp_path = Path(tmp)
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from the team
        try:
            yield tmp_path
            _replace(tmp_path, path)
        except OSError as exc:
            raise _naming_output(exc, path) from exc
        finally:
            tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory; it replaces ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _cleanup_on_sigterm():
        remove_stale_temporaries(path)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
        except OSError as exc:
            raise _naming_output(exc, path) from exc
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 likewise
        try:
            yield tmp
            _publish_dir(tmp, path)
        except OSError as exc:
            raise _naming_output(exc, path) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | Path, data: Any) -> None:
    """Atomically write pretty, key-sorted JSON (stable diffs under git)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


@contextmanager
def output_lock(path: str | Path, on_wait: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Hold an inter-process lock on the output ``path`` for the body; yield the lock file.

    The lock file is ``.<name>.lock`` beside ``path``, never inside it, so it is no part of a
    DVC output. A second process blocks until the first is done; ``on_wait(lock_file)`` runs
    once before it blocks (to say so, or to note what the output looked like then). The kernel
    releases the lock when its holder dies, however it dies.
    """
    from filelock import FileLock, Timeout  # only the stages that lock pay for the import

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_file = path.parent / f".{path.name}.lock"
    lock = FileLock(lock_file)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        if on_wait is not None:
            on_wait(lock_file)
        lock.acquire()
    try:
        yield lock_file
    finally:
        lock.release()


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove ``path``'s temporaries left by processes that no longer exist; return them.

    Runs once per target and process: a dead process cannot start new temporaries, so later
    calls (a checkpoint saved every few steps) would only list the folder again.
    """
    path = Path(path)
    key = (os.fspath(path.parent.absolute()), path.name)
    if key in _swept or os.name == "nt":  # Windows: os.kill(pid, 0) would terminate the pid
        return []
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.\w+\.tmp")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        stale = Path(entry.path)
        _remove(stale)
        removed.append(stale)
    _swept.add(key)
    return removed


def _naming_output(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` where it names a temporary of ours or no file (pyarrow's disk-full
    error names none): the user knows the output, not ``.per_class.parquet.1667.x3z.tmp``."""
    named = exc.filename
    if exc.errno is None or (named is not None and _temp_prefix(path) not in str(named)):
        return exc
    # OSError(errno, …) is the errno's own subclass (PermissionError for EACCES)
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def _umask() -> int:
    """The process's umask: outputs get the modes any other file the user writes gets (a
    temporary file's own 0600/0700 would keep metrics and reports from a shared project's
    other members). Read once: setting it back at once is the only way to read it."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


_UMASK: int | None = None


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process; when unsure, say yes (its temporary is kept)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # EPERM: alive, another user's
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _publish_dir(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``, replacing whatever is there, safe against a concurrent publish.

    Deleting the old directory in place (rmtree, then rename) races with a second process doing
    the same: one's rmtree trips over files the other just removed (FileNotFoundError), or the
    rename finds a new non-empty directory. Renaming the old one aside is atomic; a process that
    loses the race to put its own directory in place moves the winner's aside and tries again.
    """
    for attempt in range(_PUBLISH_ATTEMPTS):
        aside: Path | None
        aside = path.with_name(f"{_temp_prefix(path)}{secrets.token_hex(4)}.tmp")
        try:
            os.rename(path, aside)
        except FileNotFoundError:  # nothing there, or another process moved it first
            aside = None
        try:
            _replace(tmp, path)
        except OSError as exc:
            # ENOTEMPTY/EEXIST: another process put its directory there since our rename.
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt + 1 == _PUBLISH_ATTEMPTS:
                raise
            continue
        finally:
            if aside is not None:
                _remove(aside)
        return


def _replace(tmp: Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except FileNotFoundError as exc:
        # Only something outside this process removes a live temporary (or the folder): say
        # so in one line rather than with a traceback that points at tailkit.
        raise TailkitError(
            f"{tmp}: removed by another process before it could replace {path}; run again"
        ) from exc


def _raise_terminated(signum: int, frame: object) -> None:
    # One-shot: a second SIGTERM (the sender losing patience) kills without cleaning up.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(TERMINATED_EXIT)


@contextmanager
def _cleanup_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the body runs, so the ``finally`` clauses that remove
    temporaries run; only in the main thread (the only one signal handlers run in) and only
    when SIGTERM has its default action (an application's own handler is left alone)."""
    global _sigterm_depth, _sigterm_previous
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _sigterm_depth == 0:
        previous = signal.getsignal(signal.SIGTERM)
        _sigterm_previous = previous
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_terminated)
    _sigterm_depth += 1
    try:
        yield
    finally:
        _sigterm_depth -= 1
        if _sigterm_depth == 0 and signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, _sigterm_previous)
