"""A Composer Trainer that resumes exactly once: ``composer_resume.py CHECKPOINT RECORD [DELAY]``.

240 samples, a global batch of 8, 3 epochs, unidist's ``ResumableCallback``. Each batch appends
what this rank read (and where its start resumed) to RECORD/reads-*.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from composer import Trainer
from composer.models import ComposerModel
from torch.utils.data import TensorDataset

import unidist
from unidist.integrations.composer import ResumableCallback

warnings.filterwarnings("ignore")
checkpoint, record = sys.argv[1], Path(sys.argv[2])
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
unidist.initialize()
log = (record / f"reads-r{unidist.get_rank()}-p{os.getpid()}.jsonl").open("a", buffering=1)


class Model(ComposerModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, batch: Any) -> torch.Tensor:
        ids, x = batch
        if self.training:
            line = {"epoch": int(trainer.state.timestamp.epoch), "ids": ids.tolist()}
            line["step"] = int(trainer.state.timestamp.batch) + 1
            line["resumed_from"] = callback.state.resumed_from or 0 if callback.state else 0
            log.write(json.dumps(line) + "\n")
            time.sleep(delay)
        return self.layer(x)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return outputs.square().mean()


gen = torch.Generator().manual_seed(0)
data = TensorDataset(torch.arange(240), torch.randn(240, 4, generator=gen))
loader = unidist.auto_dataloader(data, global_batch_size=8, num_workers=0)
model = Model()
callback = ResumableCallback(checkpoint, job="composer", save_every=7)
trainer = Trainer(
    model=model,
    train_dataloader=loader,
    max_duration="3ep",
    optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
    callbacks=[callback],
    device="cpu",
    progress_bar=False,
    log_to_console=False,
    loggers=[],
)
trainer.fit()
print(f"rank {unidist.get_rank()} done at batch {int(trainer.state.timestamp.batch)}", flush=True)
