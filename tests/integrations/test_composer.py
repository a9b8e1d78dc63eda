"""unidist's microbatch setting translated to Composer's device_train_microbatch_size."""

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
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import unidist
from tests._waiting import wait_for
from unidist.errors import ConfigurationError
from unidist.integrations.composer import COMPOSER_REFUSAL, composer_microbatch_size
from unidist.testing import OOMBudget

pytestmark = pytest.mark.composer


def test_plain_translations(monkeypatch: pytest.MonkeyPatch) -> None:
    assert composer_microbatch_size(None) is None
    assert composer_microbatch_size(8) == 8
    assert composer_microbatch_size("auto", device="gpu") == "auto"
    assert composer_microbatch_size(unidist.SizePolicy(start=16)) == 16
    assert composer_microbatch_size(unidist.SizePolicy(), device="GPU") == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # Composer's default device
    assert composer_microbatch_size("auto") == "auto"


def test_auto_off_gpu_says_what_composer_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in (None, "cpu", "mps"):
        with pytest.raises(ConfigurationError) as info:
            composer_microbatch_size("auto", device=device)
        assert COMPOSER_REFUSAL in str(info.value)
        assert "HINT: pass an int" in str(info.value)
    from composer.devices import DeviceCPU

    with pytest.raises(ConfigurationError, match="the device is 'DeviceCPU'"):
        composer_microbatch_size("auto", device=DeviceCPU())
    with pytest.raises(ConfigurationError, match="Composer calls CUDA 'gpu'"):
        composer_microbatch_size("auto", device="cuda")


def test_untranslatable_settings() -> None:
    with pytest.raises(ConfigurationError, match="grow_after=3"):
        composer_microbatch_size(unidist.SizePolicy(start=4, grow_after=3))

    class Thirds(unidist.SizePolicy):
        def shrink(self, size: int, failures: int) -> int:
            return size // 3

    with pytest.raises(ConfigurationError, match=r"a custom shrink\(\)"):
        composer_microbatch_size(Thirds())
    with pytest.raises(ConfigurationError, match="has not run a step"):
        composer_microbatch_size(unidist.MicroBatcher(nn.Linear(2, 2)))
    with pytest.raises(ConfigurationError, match="not 'auto', a positive int"):
        composer_microbatch_size(0)


def composer_trainer(microbatch: object) -> object:
    from composer import Trainer
    from composer.models import ComposerClassifier

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,)))
    return Trainer(
        model=ComposerClassifier(nn.Sequential(nn.Linear(6, 3)), num_classes=3),
        train_dataloader=DataLoader(data, batch_size=8),
        max_duration="1ep",
        device="cpu",
        device_train_microbatch_size=microbatch,
        progress_bar=False,
        log_to_console=False,
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_composer_itself_refuses_auto_on_cpu_with_the_quoted_message() -> None:
    with pytest.raises(ValueError, match=COMPOSER_REFUSAL):
        composer_trainer("auto")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_size_found_by_a_microbatcher_trains_in_composer() -> None:
    model = nn.Sequential(nn.Linear(6, 3))
    mb = unidist.MicroBatcher(model)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    with OOMBudget(5).attach(model):
        mb.step((x, y), lambda b: nn.functional.cross_entropy(model(b[0]), b[1]))
    trainer = composer_trainer(composer_microbatch_size(mb))
    trainer.fit()  # type: ignore[attr-defined]
    assert trainer.state.device_train_microbatch_size == 4  # type: ignore[attr-defined]
    assert int(trainer.state.timestamp.batch) == 4  # type: ignore[attr-defined]


# -- resuming a Trainer exactly once -----------------------------------------------------------


def _reads(record: Path) -> list[dict[str, Any]]:
    lines = []
    for path in record.glob("reads-*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
    return lines


@pytest.mark.multiprocess
def test_a_trainer_stopped_on_two_ranks_resumes_on_one_and_trains_each_sample_once(
    tmp_path: Path,
) -> None:
    # Composer's autoresume would skip each rank's own batches of the epoch, which on another
    # number of ranks are other samples. With ResumableCallback the data position is global.
    script = str(Path(__file__).parents[1] / "scripts" / "composer_resume.py")
    record, checkpoint = tmp_path / "record", tmp_path / "ckpt"
    record.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    launch = [sys.executable, "-m", "unidist", "launch", "--log-dir", str(tmp_path / "logs")]
    first = subprocess.Popen(
        [*launch, "-n", "2", script, str(checkpoint), str(record), "0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(_reads(record)) >= 2 * 10, 180, "10 batches on two ranks")
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
    assert "done at batch 90" in second.stdout + second.stderr
    kept = [x for x in _reads(record) if x["resumed_from"] == saved or x["step"] <= saved]
    for epoch in range(3):
        counts = Counter(i for x in kept if x["epoch"] == epoch for i in x["ids"])
        assert sorted(counts) == list(range(240)), f"epoch {epoch} missed samples"
        assert set(counts.values()) == {1}, f"epoch {epoch} read samples twice"
    assert sorted({x["step"] for x in kept}) == list(range(1, 91))
