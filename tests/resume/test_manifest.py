"""Every malformed record of a checkpoint folder is a CheckpointError naming the file and the
field: deep nesting, huge integers, wrong types, a FIFO, a missing file, anything at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn
from torch.utils.data import TensorDataset

import unidist
from unidist.errors import CheckpointError
from unidist.resume import _folder as files, _manifest as records

STEP = files.step_name(3)


def _state(folder: Path, *, model: bool = True) -> unidist.ResumableState:
    import torch

    data = TensorDataset(torch.arange(12))
    loader = unidist.auto_dataloader(data, global_batch_size=2, num_workers=0)
    return unidist.ResumableState(
        folder,
        job="j",
        model=nn.Linear(2, 1) if model else None,
        loader=loader,
        stop_signals=(),
    )


def _checkpoint(folder: Path, *, model: bool = True) -> None:
    state = _state(folder, model=model)
    state.restore()
    for _ in range(3):
        state.step()
    state.save()
    state.close()


def _restore(folder: Path, *, model: bool = True) -> bool:
    state = _state(folder, model=model)
    try:
        return state.restore()
    finally:
        state.close()


@pytest.fixture(scope="module")
def saved() -> Iterator[dict[str, Path]]:
    """Two pristine checkpoints (with and without a model), copied by each test that breaks one."""
    top = Path(tempfile.mkdtemp(prefix="unidist-records-"))
    made = {"model": top / "model", "loader": top / "loader"}
    _checkpoint(made["model"])
    _checkpoint(made["loader"], model=False)
    yield made
    shutil.rmtree(top)


def _copy(source: Path, where: Path) -> Path:
    shutil.copytree(source, where)
    (where / ".lock").unlink(missing_ok=True)
    return where


def _write(path: Path, data: bytes | str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as stream:
        stream.write(data.encode() if isinstance(data, str) else data)


def test_the_records_as_saved_restore(saved: dict[str, Path], tmp_path: Path) -> None:
    assert _restore(_copy(saved["model"], tmp_path / "m"))
    assert _restore(_copy(saved["loader"], tmp_path / "l"), model=False)


def test_deep_nesting_is_a_checkpoint_error(saved: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(saved["model"], tmp_path / "c")
    _write(folder / files.LATEST, "[" * 200_000)
    with pytest.raises(CheckpointError, match=r"latest.json cannot be read \(its JSON is nested"):
        _restore(folder)


def test_a_huge_step_is_a_checkpoint_error_naming_the_field(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    folder = _copy(saved["model"], tmp_path / "c")
    pointer = json.loads((folder / files.LATEST).read_text())
    _write(folder / files.LATEST, json.dumps({**pointer, "step": 10**30}))
    with pytest.raises(CheckpointError, match=r'latest.json: field "step" is 1000000000000000'):
        _restore(folder)


def test_a_fifo_in_place_of_a_record_is_refused_without_blocking(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    folder = _copy(saved["model"], tmp_path / "c")
    (folder / files.LATEST).unlink()
    os.mkfifo(folder / files.LATEST, 0o600)  # opening it to read would wait for a writer
    with pytest.raises(CheckpointError, match=r"latest.json is a symbolic link or a special file"):
        _restore(folder)


@pytest.mark.parametrize("name", [files.PROGRESS, ".metadata"])
def test_a_missing_file_is_a_checkpoint_error(
    saved: dict[str, Path], tmp_path: Path, name: str
) -> None:
    folder = _copy(saved["model"], tmp_path / "c")
    (folder / STEP / name).unlink()
    with pytest.raises(CheckpointError, match=f"{STEP}.*(missing|cannot be read|does not fit)"):
        _restore(folder)


def test_a_record_larger_than_unidist_writes_is_refused(
    saved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy(saved["model"], tmp_path / "c")
    monkeypatch.setattr(records, "MAX_BYTES", 64)
    with pytest.raises(CheckpointError, match=r"latest.json holds \d+ bytes, more than the 64"):
        _restore(folder)


# -- anything at all ---------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
RELAXED = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _each_example(saved: Path, edit: Any) -> None:
    """Copy the checkpoint, break it with ``edit(folder)``; the restore either works or raises
    CheckpointError, never anything else."""
    with tempfile.TemporaryDirectory() as top:
        folder = _copy(saved, Path(top) / "c")
        edit(folder)
        with contextlib.suppress(CheckpointError):
            _restore(folder, model=(saved.name == "model"))


@RELAXED
@given(field=st.sampled_from(["job", "step", "folder", "format", "other"]), value=JSON)
def test_any_pointer_field_is_read_or_refused(
    saved: dict[str, Path], field: str, value: Any
) -> None:
    def edit(folder: Path) -> None:
        pointer = json.loads((folder / files.LATEST).read_text())
        _write(folder / files.LATEST, json.dumps({**pointer, field: value}))

    _each_example(saved["model"], edit)


@RELAXED
@given(
    field=st.sampled_from(["job", "step", "epoch", "world_size", "loader", "extra", "format"]),
    value=JSON,
)
def test_any_progress_field_is_read_or_refused(
    saved: dict[str, Path], field: str, value: Any
) -> None:
    def edit(folder: Path) -> None:
        path = folder / STEP / files.PROGRESS
        progress = json.loads(path.read_text())
        _write(path, json.dumps({**progress, field: value}))

    _each_example(saved["model"], edit)


@RELAXED
@given(field=st.sampled_from(["python", "numpy", "torch", "cuda", "format"]), value=JSON)
def test_any_random_state_field_is_read_or_refused(
    saved: dict[str, Path], field: str, value: Any
) -> None:
    def edit(folder: Path) -> None:
        path = folder / STEP / files.rng_name(0)
        rng = json.loads(path.read_text())
        _write(path, json.dumps({**rng, field: value}))

    _each_example(saved["loader"], edit)


@RELAXED
@given(data=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_as_the_pointer_are_read_or_refused(saved: dict[str, Path], data: bytes) -> None:
    _each_example(saved["model"], lambda folder: _write(folder / files.LATEST, data))
