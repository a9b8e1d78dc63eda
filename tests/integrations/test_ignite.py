"""Ignite Engine with automatic microbatching: a drop-in for create_supervised_trainer."""

from __future__ import annotations

import contextlib
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
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import unidist
from tests._waiting import wait_for
from unidist.errors import ConfigurationError
from unidist.testing import OOMBudget, run_distributed

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ignite

F64 = torch.float64


def make_model(dtype: torch.dtype = F64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, 1)).to(dtype)


def loader(rank: int, n: int = 40, batch: int = 8, dtype: torch.dtype = F64) -> DataLoader:
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(n, 5, generator=gen, dtype=dtype)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=batch)


def relative(model: nn.Module, reference: nn.Module) -> float:
    return max(
        ((a - b).abs().max() / b.abs().max()).item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )


def epoch_against_ignite(accumulate: int) -> dict[str, Any]:
    from ignite.engine import Events, create_supervised_trainer

    from unidist.integrations.ignite import create_microbatch_trainer

    world = unidist.get_world_size()
    wrap = DDP if world > 1 else (lambda m: m)
    model, reference = wrap(make_model()), wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    trainer = create_microbatch_trainer(
        model, opt, F.mse_loss, gradient_accumulation_steps=accumulate
    )
    ref_trainer = create_supervised_trainer(
        reference, ref_opt, F.mse_loss, gradient_accumulation_steps=accumulate
    )
    sizes: list[int] = []
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: sizes.append(e.state.microbatch_size)
    )
    data = loader(unidist.get_rank())
    inner = model.module if world > 1 else model
    with OOMBudget({world - 1: 3}, during="backward").attach(inner) as oom:
        trainer.run(data, max_epochs=1)
    ref_trainer.run(data, max_epochs=1)
    return {
        "sizes": sizes,
        "raised": oom.raised,
        "relative": relative(model, reference),
        "loss": trainer.state.output,
        "ref_loss": ref_trainer.state.output,
        "iterations": trainer.state.iteration,
    }


@pytest.mark.multiprocess
def test_an_epoch_over_two_ranks_with_oom_on_rank_1_matches_ignite() -> None:
    results = run_distributed(epoch_against_ignite, 1)
    assert results[0]["sizes"] == results[1]["sizes"] == [2] * 5
    assert results[0]["raised"] == 0
    assert results[1]["raised"] == 2
    for r in results:
        assert r["iterations"] == 5
        assert r["relative"] < 1e-6
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-9)


def test_gradient_accumulation_across_iterations_matches_ignite() -> None:
    result = epoch_against_ignite(2)
    assert result["sizes"] == [2] * 5
    assert result["relative"] < 1e-6


def test_output_transform_sees_the_whole_batch_and_amp_runs() -> None:
    from unidist.integrations.ignite import create_microbatch_trainer

    model = make_model(torch.float32)
    seen: list[tuple[int, int, int, float]] = []

    def output(x: Any, y: Any, y_pred: Any, loss: torch.Tensor) -> float:
        seen.append((len(x), len(y), len(y_pred), loss.item()))
        assert not y_pred.requires_grad
        return loss.item()

    trainer = create_microbatch_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        F.mse_loss,
        device="cpu",
        output_transform=output,
        amp_mode="amp",
        scaler=True,
        policy=unidist.SizePolicy(start=3),
    )
    assert isinstance(trainer.state.scaler, torch.amp.GradScaler)
    trainer.run(loader(0, n=16, dtype=torch.float32), max_epochs=1)
    assert [s[:3] for s in seen] == [(8, 8, 8), (8, 8, 8)]
    assert trainer.state.microbatch_size == 3
    assert all(torch.isfinite(torch.tensor(s[3])) for s in seen)


def test_bad_arguments() -> None:
    from unidist.integrations.ignite import microbatch_training_step

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match="amp_mode='apex'"):
        microbatch_training_step(model, opt, F.mse_loss, amp_mode="apex")
    with pytest.raises(ConfigurationError, match="gradient_accumulation_steps=0"):
        microbatch_training_step(model, opt, F.mse_loss, gradient_accumulation_steps=0)
    with pytest.raises(ConfigurationError, match="zero_grad=False"):
        microbatch_training_step(
            model,
            opt,
            F.mse_loss,
            gradient_accumulation_steps=2,
            microbatcher=unidist.MicroBatcher(model),
        )
    with pytest.raises(ConfigurationError, match="different GradScaler"):
        microbatch_training_step(
            model, opt, F.mse_loss, scaler=object(), microbatcher=unidist.MicroBatcher(model)
        )


# -- resuming an Engine exactly once -----------------------------------------------------------


def _reads(record: Path) -> list[dict[str, Any]]:
    lines = []
    for path in record.glob("reads-*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
    return lines


@pytest.mark.multiprocess
def test_an_engine_stopped_on_two_ranks_resumes_on_one_and_trains_each_sample_once(
    tmp_path: Path,
) -> None:
    # A rank leaves: the two-rank job is stopped mid-epoch (SIGTERM to its launcher: every rank
    # saves the same iteration), and the job restarts on one rank. Ignite's engine resumes at
    # the saved iteration and epoch; the loader yields exactly the rest of the epoch.
    script = str(Path(__file__).parents[1] / "scripts" / "ignite_resume.py")
    record, checkpoint = tmp_path / "record", tmp_path / "ckpt"
    record.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    launch = [sys.executable, "-m", "unidist", "launch", "--log-dir", str(tmp_path / "logs")]
    first = subprocess.Popen(
        [*launch, "-n", "2", script, str(checkpoint), str(record), "0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(_reads(record)) >= 2 * 10, 120, "10 iterations on two ranks")
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
        first.communicate(timeout=30)
    saved = json.loads((checkpoint / "latest.json").read_text())["step"]
    assert saved >= 10, err[-3000:]
    second = subprocess.run(
        [*launch, "-n", "1", script, str(checkpoint), str(record)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done at iteration 90" in second.stdout
    lines = _reads(record)
    kept = [x for x in lines if x["resumed_from"] == saved or x["step"] <= saved]
    for epoch in range(3):
        counts = Counter(i for x in kept if x["epoch"] == epoch for i in x["ids"])
        assert sorted(counts) == list(range(240)), f"epoch {epoch} missed samples"
        assert set(counts.values()) == {1}, f"epoch {epoch} read samples twice"
    assert sorted({x["step"] for x in kept}) == list(range(1, 91))
