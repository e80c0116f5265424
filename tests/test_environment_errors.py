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


def test_safetensors_current_disk_full_text_is_enospc(tmp_path, monkeypatch):
    """safetensors 0.8 says "(os error 28)": once read as EIO, a traceback instead of a line."""

    def full(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(tensorfile, "save_file", full)
    with pytest.raises(OSError) as info:
        tensorfile.save(tmp_path / "model.safetensors", {"w": torch.ones(2)})
    assert info.value.errno == errno.ENOSPC


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): the full-disk case untested")
    yield disk
    subprocess.run(["umount", str(disk)], check=False)


def test_a_really_full_disk_while_saving_a_model_is_one_line_and_keeps_the_old(tiny_disk):
    from tailkit.storage.atomic import atomic_dir

    model = tiny_disk / "model"
    with atomic_dir(model) as tmp:
        tensorfile.save(tmp / "model.safetensors", {"w": torch.ones(4)})
    before = (model / "model.safetensors").read_bytes()
    with pytest.raises(OSError) as info, atomic_dir(model) as tmp:
        tensorfile.save(tmp / "model.safetensors", {"w": torch.ones(1 << 16)})  # 256 KiB
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(model)  # the output, not its temporary
    assert (model / "model.safetensors").read_bytes() == before
    assert [p.name for p in tiny_disk.iterdir()] == ["model"]  # no temporary left


@pytest.mark.slow
def test_a_failed_evaluate_write_leaves_every_previous_output_whole(tiny_project, tmp_path):
    """A full disk after the per-class table is written: neither it nor the row outcomes nor
    the metrics change (they were once replaced one by one, so a folder could mix two models)."""
    import shutil

    from tailkit.evaluation import outcomes
    from tailkit.params import load_params
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import evaluate

    project = tmp_path / "project"
    shutil.copytree(tiny_project, project, symlinks=True)
    layout = Layout(project)
    kept = [
        layout.per_class("softmax"),
        layout.outcomes("softmax"),
        layout.metrics("softmax"),
        layout.metrics_detail("softmax"),
        layout.class_plot("softmax"),
    ]
    # marked, so that a file evaluate replaced (with the same model's same bytes) would show
    for path in kept:
        path.write_bytes(b"the previous evaluation's " + path.name.encode())
    before = {p: p.read_bytes() for p in kept}
    written = []

    def full(table, where, **options):  # pyarrow's disk-full error names no file
        written.append(where)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28]")

    params = load_params(project / "params.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(outcomes, "write_table", full)  # the row outcomes, after the table
        with pytest.raises(OSError) as info:
            evaluate.run(params, layout, make_registry(), "softmax")
    assert written and info.value.errno == errno.ENOSPC
    assert info.value.filename == str(layout.per_class("softmax").parent)
    assert {p: p.read_bytes() for p in kept} == before
    assert not [p for p in layout.per_class("softmax").parent.parent.iterdir() if ".tmp" in p.name]


def test_a_full_disk_while_checkpointing_names_the_file_and_leaves_no_half_folder(tiny_disk):
    from tailkit.training.checkpoint import Checkpointer

    ckpt = Checkpointer(tiny_disk / "ckpt", "key")
    ckpt.save({"step": 5}, {"layer.weight": torch.ones(16, 4)})  # 256 bytes of rows: fits
    with pytest.raises(OSError) as info:
        ckpt.save({"step": 10}, {"layer.weight": torch.ones(1 << 14, 4)})  # 256 KiB: does not
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename.endswith("rows-000000000010/rows-000000000000.pt")
    assert sorted(p.name for p in (tiny_disk / "ckpt").iterdir()) == [
        "rows-000000000005",
        "state.pt",
    ]
    state = ckpt.load()
    assert state is not None and state["step"] == 5
    assert torch.equal(state["rows"]["layer.weight"], torch.ones(16, 4))


def test_a_dataset_of_a_quadrillion_rows_is_refused_in_params():
    """num_examples: 10**15 asked numpy for 7.11 PiB; the synthetic dataset's constraint
    refuses it in one line naming the option, before anything is allocated."""
    from tailkit.registry import make_registry

    spec = {"name": "synthetic", "num_classes": 10, "num_examples": 10**15, "dim": 4}
    with pytest.raises(InvalidParameterError) as info:
        make_registry().build("datasets", spec, "dataset")
    said = str(info.value)
    assert "\n" not in said and said.startswith("dataset.num_examples: got 1000000000000000")
