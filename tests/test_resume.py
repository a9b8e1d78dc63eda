"""ResumableState: save, stop, resume on another number of ranks; refuse what it cannot trust."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import unidist
from unidist.errors import CheckpointError, ConfigurationError
from unidist.testing import DistributedTestError, run_distributed

ROOT = Path(__file__).resolve().parent.parent
LENGTH = 48
GLOBAL_BATCH = 4


@pytest.fixture(autouse=True)
def _signals_put_back() -> Any:
    """A state restored outside ``epochs()`` keeps its SIGTERM handler until closed."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _parts(folder: str, *, job: str = "job-a", world: int = 1, **kw: Any) -> dict[str, Any]:
    """A model, optimizer, loader and state over a dataset of LENGTH (index, x, y) samples."""
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.arange(LENGTH), torch.randn(LENGTH, 3, generator=gen))
    loader = unidist.auto_dataloader(data, global_batch_size=GLOBAL_BATCH, num_workers=0)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = unidist.ResumableState(
        folder, job=job, model=model, optimizer=optimizer, loader=loader, **kw
    )
    return {"state": state, "model": model, "optimizer": optimizer, "loader": loader}


def _train(parts: dict[str, Any], epochs: int, stop_after: int | None = None) -> list[list[int]]:
    """Train; returns (epoch, step, index...) rows of what this rank read."""
    state, model, optimizer = parts["state"], parts["model"], parts["optimizer"]
    rows: list[list[int]] = []
    for epoch in state.epochs(epochs):
        for ids, x in parts["loader"]:
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows.append([epoch, state.steps + 1, *ids.tolist()])
            state.step()
            if stop_after is not None and state.steps == stop_after:
                return rows  # a crash: nothing after the last save counts
    return rows


def _weights(model: nn.Module) -> list[float]:
    return [
        v for p in unidist.unwrap_model(model).parameters() for v in p.detach().flatten().tolist()
    ]


def _committed(rows: list[list[int]], upto: int) -> list[list[int]]:
    return [row for row in rows if row[1] <= upto]


def _each_once(rows: list[list[int]], epochs: int) -> None:
    for epoch in range(epochs):
        read = Counter(i for row in rows if row[0] == epoch for i in row[2:])
        assert sorted(read) == list(range(LENGTH)), (epoch, sorted(read))
        assert set(read.values()) == {1}, (epoch, [i for i, n in read.items() if n > 1])


# -- one process -------------------------------------------------------------------------------


def test_a_crash_resumes_from_the_last_save_and_reads_the_rest_once(tmp_path: Path) -> None:
    reference = _parts(str(tmp_path / "ref"))
    _train(reference, 2)
    first = _parts(str(tmp_path / "run"), save_every=5)
    rows = _committed(_train(first, 2, stop_after=18), 15)  # saved at 15; 16-18 are lost
    second = _parts(str(tmp_path / "run"), save_every=5)
    assert second["state"].restore()
    assert second["state"].resumed_from == 15
    assert (second["state"].epoch, second["state"].steps) == (1, 15)  # 12 steps per epoch
    rows += _train(second, 2)
    _each_once(rows, 2)
    assert _weights(second["model"]) == _weights(reference["model"])  # same world: bit for bit
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        ".lock",  # the run lock (empty: nobody holds it)
        "latest.json",
        "step-000000015",
        "step-000000020",  # keep=2: 5 and 10 were removed
    ]


def test_a_finished_run_resumes_to_nothing_left(tmp_path: Path) -> None:
    _train(_parts(str(tmp_path), save_every=24), 2)
    again = _parts(str(tmp_path))
    assert _train(again, 2) == []
    assert again["state"].steps == 24


def test_random_states_and_extras_come_back(tmp_path: Path) -> None:
    import random

    import numpy as np

    parts = _parts(str(tmp_path))
    parts["state"].restore()
    parts["state"].extra["best"] = 0.5
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    parts["state"].save()
    expected = (torch.rand(3).tolist(), random.random(), np.random.rand())
    again = _parts(str(tmp_path))
    again["state"].restore()
    assert again["state"].extra == {"best": 0.5}
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == expected


def test_another_jobs_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    _parts(str(tmp_path), job="job-a")["state"].save()
    with pytest.raises(CheckpointError, match="written by job 'job-a', and this is job 'job-b'"):
        _parts(str(tmp_path), job="job-b")["state"].restore()


def test_a_model_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    _parts(str(tmp_path))["state"].save()
    state = unidist.ResumableState(tmp_path, job="job-a", model=nn.Linear(5, 2))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        state.restore()


def test_a_damaged_pointer_is_an_error_that_shows_it(tmp_path: Path) -> None:
    _parts(str(tmp_path))["state"].save()
    (tmp_path / "latest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"latest.json cannot be read"):
        _parts(str(tmp_path))["state"].restore()
    (tmp_path / "latest.json").write_text('{"hello": 1}')
    with pytest.raises(CheckpointError, match="not a unidist checkpoint file"):
        _parts(str(tmp_path))["state"].restore()


def test_a_missing_checkpoint_folder_is_an_error(tmp_path: Path) -> None:
    import shutil

    where = _parts(str(tmp_path))["state"].save()
    shutil.rmtree(where)
    with pytest.raises(CheckpointError, match="is missing from the checkpoint folder"):
        _parts(str(tmp_path))["state"].restore()


def test_a_save_that_crashed_leaves_the_previous_checkpoint_in_force(tmp_path: Path) -> None:
    parts = _parts(str(tmp_path))
    _train(parts, 1, stop_after=3)
    parts["state"].save()
    partial = tmp_path / "step-000000002"  # as if a save had died before progress.json
    partial.mkdir(mode=0o700)
    (partial / "rng-r0.json").write_text("{}")
    again = _parts(str(tmp_path))
    assert again["state"].restore()
    assert again["state"].steps == 3
    assert again["state"].save() == tmp_path / "step-000000003"  # in force: kept as it is
    _train(again, 1, stop_after=4)
    again["state"].save()
    assert not partial.exists()  # removed with the next save


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_folder_someone_else_could_write_is_refused(tmp_path: Path) -> None:
    where = _parts(str(tmp_path))["state"].save()
    os.chmod(tmp_path, 0o777)
    with pytest.raises(CheckpointError, match=r"writable by other users \(mode 0777\)"):
        _parts(str(tmp_path))["state"].restore()
    os.chmod(tmp_path, 0o700)
    os.chown(where / ".metadata", 65534, 65534)
    with pytest.raises(CheckpointError, match="belongs to user id 65534"):
        _parts(str(tmp_path))["state"].restore()
    os.chown(where / ".metadata", 0, 0)
    real = where.with_name("elsewhere")
    where.rename(real)
    where.symlink_to(real)
    with pytest.raises(CheckpointError, match="symbolic link"):
        _parts(str(tmp_path))["state"].restore()


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs the name of the training run"):
        unidist.ResumableState(tmp_path, job="")
    with pytest.raises(ConfigurationError, match="pass model= too"):
        unidist.ResumableState(tmp_path, job="j", optimizer=torch.optim.SGD([torch.ones(1)], 1))
    loader = torch.utils.data.DataLoader(range(4))
    with pytest.raises(ConfigurationError, match=r"use unidist\.auto_dataloader"):
        unidist.ResumableState(tmp_path, job="j", loader=loader)
    state = unidist.ResumableState(tmp_path, job="j")
    state.extra["when"] = object()
    with pytest.raises(ConfigurationError, match="cannot be"):
        state.save()


def test_signal_handlers_are_put_back(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    state = unidist.ResumableState(tmp_path, job="j")
    with state:
        state.restore()
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


STOPPING = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_resume import _parts, _train
parts = _parts({folder!r}, save_every=100)
rows = []
for epoch in parts["state"].epochs(2):
    for ids, x in parts["loader"]:
        rows.append([epoch, parts["state"].steps + 1, *ids.tolist()])
        with open({log!r}, "a") as f:
            f.write(repr(rows[-1]) + "\\n")
        if parts["state"].steps == 6 and not parts["state"].resumed_from:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's stop, mid-epoch
        parts["state"].step()
"""


def test_sigterm_saves_at_the_step_and_ends_the_process_by_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "reads.txt"
    code = STOPPING.format(tests=str(ROOT / "tests"), folder=str(tmp_path / "ck"), log=str(log))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert first.returncode == -signal.SIGTERM, first.stderr.decode()[-3000:]
    assert json.loads((tmp_path / "ck" / "latest.json").read_text())["step"] == 7
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    rows = [eval(line) for line in log.read_text().splitlines()]  # our own repr of lists of ints
    _each_once(rows, 2)


SAVING = """
import sys
sys.path.insert(0, {tests!r})
from test_resume import _parts, _train
parts = _parts({folder!r}, save_every=3)
_train(parts, 1)
again = _parts({folder!r})
again["state"].restore()
assert again["state"].steps == 12
"""


def test_one_process_saves_and_restores_without_torchs_checkpoint_warnings(tmp_path: Path) -> None:
    # torch 2.7's writer calls tensor.storage() (pytorch#148498): "TypedStorage is deprecated"
    # once per process, at its first save (so: a fresh process); and torch 2.7 and 2.14 warn
    # "assuming the intent is to save (load) in a single process" at each save and load of a
    # one-process run, which unidist supports as such.
    code = SAVING.format(tests=str(ROOT / "tests"), folder=str(tmp_path / "ck"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "ck" / "latest.json").read_text())["step"] == 12
    assert "Warning" not in done.stderr, done.stderr


# -- two processes -----------------------------------------------------------------------------


def _save_on_two(folder: str, steps: int) -> list[float]:
    parts = _parts(folder, world=2)
    rows = _train(parts, 2, stop_after=steps)
    parts["state"].save()
    return [*rows, _weights(parts["model"])]  # type: ignore[list-item]


def _resume_on_one(folder: str) -> dict[str, Any]:
    parts = _parts(folder)
    parts["state"].restore()
    at = (parts["state"].epoch, parts["state"].steps)
    loaded = _weights(parts["model"])
    rows = _train(parts, 2)
    return {"at": at, "loaded": loaded, "rows": rows}


@pytest.mark.multiprocess
def test_two_ranks_save_mid_epoch_and_one_resumes_every_sample_once(tmp_path: Path) -> None:
    saved = run_distributed(_save_on_two, str(tmp_path), 7, timeout=120)
    weights = [r.pop() for r in saved]
    assert weights[0] == weights[1]
    resumed = _resume_on_one(str(tmp_path))
    assert resumed["at"] == (0, 7)
    assert resumed["loaded"] == weights[0]  # the model as the two ranks left it, exactly
    _each_once(saved[0] + saved[1] + resumed["rows"], 2)


def _resume_on_two(folder: str) -> list[list[int]]:
    parts = _parts(folder, world=2)
    return _train(parts, 2)


@pytest.mark.multiprocess
def test_one_rank_saves_and_two_resume_every_sample_once(tmp_path: Path) -> None:
    parts = _parts(str(tmp_path))
    rows = _train(parts, 2, stop_after=5)
    parts["state"].save()
    resumed = run_distributed(_resume_on_two, str(tmp_path), timeout=120)
    _each_once(rows + resumed[0] + resumed[1], 2)


def _stop_on_one_rank(folder: str) -> int:
    parts = _parts(folder, world=2, stop_timeout=1.0)
    for _ in parts["state"].epochs(2):
        for _batch in parts["loader"]:
            if parts["state"].steps == 2 and unidist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            parts["state"].step()
    return parts["state"].steps


@pytest.mark.multiprocess
def test_a_signal_on_one_rank_makes_every_rank_save_at_the_same_step(tmp_path: Path) -> None:
    with pytest.raises(DistributedTestError) as failed:
        run_distributed(_stop_on_one_rank, str(tmp_path), timeout=120)
    assert "exited with code -15" in failed.value.failures[1]  # ended by its SIGTERM
    # Rank 1 was signalled during step 3; the vote that carries it is read at the next vote
    # (step 4 when the steps are slow, later when they are fast: the ranks vote about twice a
    # second) or at the end of the epoch (step 12), whichever comes first; both ranks save
    # that step. Rank 0 got no signal of its own: it says why it stops.
    step = json.loads((tmp_path / "latest.json").read_text())["step"]
    assert 4 <= step <= 12
    assert f"saved step {step} " in failed.value.failures[0]
    assert "no stop signal reached this rank within 1 s" in failed.value.failures[0]


def _one_rank_has_a_checkpoint(root: str) -> None:
    folder = Path(root, f"rank{unidist.get_rank()}")
    parts = _parts(str(folder), world=2)
    parts["state"].restore()


@pytest.mark.multiprocess
def test_folders_that_are_not_shared_are_refused(tmp_path: Path) -> None:
    with _parts(str(tmp_path / "rank0"))["state"] as state:  # let go before the ranks start
        state.save()
    with pytest.raises(DistributedTestError) as failed:
        run_distributed(_one_rank_has_a_checkpoint, str(tmp_path), timeout=120)
    assert "the ranks found different checkpoints" in failed.value.failures[0]
    assert "every node shares" in failed.value.failures[1]


# -- any Stateful -------------------------------------------------------------------------------


def _with_schedule(folder: str, **kw: Any) -> dict[str, Any]:
    """_parts plus an LR schedule and a GradScaler, saved as stateful objects."""
    parts = _parts(folder, **kw)
    scheduler = torch.optim.lr_scheduler.StepLR(parts["optimizer"], step_size=4, gamma=0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3)
    parts["state"] = unidist.ResumableState(
        folder,
        job="job-a",
        model=parts["model"],
        optimizer=parts["optimizer"],
        stateful={"scheduler": scheduler, "scaler": scaler},
        loader=parts["loader"],
        **kw,
    )
    return {**parts, "scheduler": scheduler, "scaler": scaler}


def _train_scaled(parts: dict[str, Any], epochs: int, stop_after: int | None = None) -> None:
    state, model, optimizer = parts["state"], parts["model"], parts["optimizer"]
    for _ in state.epochs(epochs):
        for _ids, x in parts["loader"]:
            optimizer.zero_grad()
            parts["scaler"].scale(model(x).square().mean()).backward()
            parts["scaler"].step(optimizer)
            parts["scaler"].update()
            parts["scheduler"].step()
            state.step()
            if stop_after is not None and state.steps == stop_after:
                return


def test_an_lr_schedule_and_a_grad_scaler_resume_on_the_same_curve(tmp_path: Path) -> None:
    reference = _with_schedule(str(tmp_path / "ref"))
    _train_scaled(reference, 2)
    first = _with_schedule(str(tmp_path / "run"), save_every=5)
    _train_scaled(first, 2, stop_after=18)  # a crash: steps 16-18 are lost
    second = _with_schedule(str(tmp_path / "run"), save_every=5)
    assert second["state"].restore()
    assert second["scheduler"].last_epoch == 15  # the schedule came back with the step
    assert second["scaler"].state_dict() != torch.amp.GradScaler("cpu").state_dict()
    _train_scaled(second, 2)
    assert _weights(second["model"]) == _weights(reference["model"])  # bit for bit
    assert second["scheduler"].get_last_lr() == reference["scheduler"].get_last_lr()
    assert second["scaler"].state_dict() == reference["scaler"].state_dict()


def test_stateful_objects_are_checked_and_a_missing_one_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"stateful\['lr'\] is a int"):
        unidist.ResumableState(tmp_path, job="j", stateful={"lr": 3})
    with pytest.raises(ConfigurationError, match="names are letters"):
        unidist.ResumableState(tmp_path, job="j", stateful={"a.b": torch.nn.Linear(1, 1)})
    parts = _parts(str(tmp_path))
    parts["state"].save()
    parts["state"].close()
    scheduler = torch.optim.lr_scheduler.StepLR(parts["optimizer"], step_size=4)
    later = unidist.ResumableState(
        tmp_path, job="job-a", model=parts["model"], stateful={"scheduler": scheduler}
    )
    with pytest.raises(CheckpointError, match=r"does not fit .*'scheduler'"):
        later.restore()


# -- preemption ---------------------------------------------------------------------------------

GRACE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_resume import _parts
parts = _parts({folder!r}, save_every=3, grace={grace!r})
for epoch in parts["state"].epochs(2):
    for ids, x in parts["loader"]:
        if parts["state"].steps == 6:
            os.kill(os.getpid(), signal.{signal})  # the platform's stop, with little time left
        parts["state"].step()
"""


@pytest.mark.parametrize(
    ("grace", "kept"),
    [(1e-6, "kept step 6"), (600.0, "saved step 7")],
)
def test_a_stop_saves_only_when_the_save_fits_in_the_grace(
    tmp_path: Path, grace: float, kept: str
) -> None:
    # A save takes milliseconds here (timed on the saves of steps 3 and 6): a grace of a
    # microsecond leaves no time, and the checkpoint of step 6 stays in force.
    code = GRACE.format(
        tests=str(ROOT / "tests"), folder=str(tmp_path / "ck"), grace=grace, signal="SIGUSR1"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == -signal.SIGUSR1, err[-3000:]  # SIGUSR1 is a stop signal here
    assert f"{kept} and stopping: SIGUSR1" in err, err[-3000:]
    step = json.loads((tmp_path / "ck" / "latest.json").read_text())["step"]
    assert step == int(kept.split()[-1])
    if grace < 1:
        assert "no time to save step 7 before the grace runs out" in err


def test_sigusr1_is_a_stop_signal_only_where_nobody_handles_it(tmp_path: Path) -> None:
    from unidist.resume._stopping import default_stop_signals

    before = signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # as in a script (not pytest's)
    try:
        assert default_stop_signals() == (signal.SIGTERM, signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, lambda *_: None)
        assert default_stop_signals() == (signal.SIGTERM,)  # the script's own: left alone
    finally:
        signal.signal(signal.SIGUSR1, before)


def _usr1_on_one_rank(folder: str) -> int:
    parts = _parts(folder, world=2, stop_timeout=1.0)
    for _ in parts["state"].epochs(2):
        for _batch in parts["loader"]:
            if parts["state"].steps == 2 and unidist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGUSR1)
            parts["state"].step()
    return parts["state"].steps


@pytest.mark.multiprocess
def test_sigusr1_on_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    with pytest.raises(DistributedTestError) as failed:
        run_distributed(_usr1_on_one_rank, str(tmp_path), timeout=120)
    assert "exited with code -10" in failed.value.failures[1]  # ended by its SIGUSR1
    step = json.loads((tmp_path / "latest.json").read_text())["step"]
    assert f"saved step {step} " in failed.value.failures[0]
    assert "got SIGUSR1" in failed.value.failures[0]


# -- async saves --------------------------------------------------------------------------------


def test_async_saves_resume_bit_for_bit(tmp_path: Path) -> None:
    reference = _parts(str(tmp_path / "ref"))
    _train(reference, 2)
    first = _parts(str(tmp_path / "run"), save_every=5, async_save=True)
    rows = _committed(_train(first, 2, stop_after=18), 15)
    first["state"].close()  # the last async save is written and counts
    second = _parts(str(tmp_path / "run"), save_every=5, async_save=True)
    assert second["state"].restore()
    assert second["state"].resumed_from == 15
    rows += _train(second, 2)
    _each_once(rows, 2)
    assert _weights(second["model"]) == _weights(reference["model"])


def _async_on_two(folder: str, steps: int) -> list[float]:
    parts = _parts(folder, world=2, save_every=3, async_save=True)
    _train(parts, 2, stop_after=steps)
    parts["state"].close()
    return _weights(parts["model"])


@pytest.mark.multiprocess
def test_two_ranks_save_in_the_background_and_one_resumes(tmp_path: Path) -> None:
    weights = run_distributed(_async_on_two, str(tmp_path), 9, timeout=120)
    assert weights[0] == weights[1]
    resumed = _resume_on_one(str(tmp_path))
    assert resumed["at"] == (0, 9)
    assert resumed["loaded"] == weights[0]
