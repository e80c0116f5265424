"""What the machine causes (a read-only folder, a full disk, a size that cannot be allocated)
and sizes past torch's int64 limits are one line, never a traceback."""

from __future__ import annotations

import copy
import errno

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY_PARAMS
from safetensors import SafetensorError

from tailkit.cli import cli
from tailkit.errors import InvalidParameterError
from tailkit.params import parse_params
from tailkit.storage import tensorfile


def _write_params(tmp_path) -> str:
    import yaml

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(TINY_PARAMS))
    return str(path)


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (OSError(errno.EROFS, "Read-only file system", "data/raw"), "data/raw: Read-only"),
        (PermissionError(errno.EACCES, "Permission denied", "data/split"), "data/split: Perm"),
        (OSError(errno.ENOSPC, "No space left on device", "data/models/x"), "previous output"),
        (MemoryError("Unable to allocate 7.11 PiB for an array"), "lower the sizes"),
    ],
)
def test_the_machines_refusals_are_one_line(tmp_path, monkeypatch, raised, said):
    from tailkit.stages import subsample

    def refuse(*args, **kwargs):
        raise raised

    monkeypatch.setattr(subsample, "run", refuse)
    result = CliRunner().invoke(cli, ["subsample", "--params", _write_params(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and said in lines[0]


def test_an_oserror_of_ours_keeps_its_traceback(tmp_path, monkeypatch):
    from tailkit.stages import subsample

    def bug(*args, **kwargs):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(subsample, "run", bug)
    result = CliRunner().invoke(cli, ["subsample", "--params", _write_params(tmp_path)])
    assert isinstance(result.exception, OSError)


def test_a_full_disk_while_saving_tensors_is_an_oserror_naming_the_file(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
            '"No space left on device" })'
        )

    monkeypatch.setattr(tensorfile, "save_file", full)
    target = tmp_path / "model.safetensors"
    with pytest.raises(OSError) as info:
        tensorfile.save(target, {"w": torch.ones(2)})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)


@pytest.mark.parametrize("key", ["negatives", "batch_size"])
def test_sizes_past_int64_limits_are_refused_in_params(key):
    raw = copy.deepcopy(TINY_PARAMS)
    raw["experiments"]["sampled"][key] = 10**20
    with pytest.raises(InvalidParameterError, match=rf"experiments.sampled.{key}"):
        parse_params(raw)
