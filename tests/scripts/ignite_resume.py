"""An Ignite Engine that resumes exactly once: ``ignite_resume.py CHECKPOINT RECORD [DELAY]``.

240 samples, a global batch of 8, 3 epochs, ``attach_resumable`` with a ResumableState. Each
iteration appends what this rank read (and where its start resumed) to RECORD/reads-*.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from ignite.engine import Engine
from torch.utils.data import TensorDataset

import unidist
from unidist.integrations.ignite import attach_resumable

checkpoint, record = sys.argv[1], Path(sys.argv[2])
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
unidist.initialize()
gen = torch.Generator().manual_seed(0)
data = TensorDataset(torch.arange(240), torch.randn(240, 4, generator=gen))
loader = unidist.auto_dataloader(data, global_batch_size=8, num_workers=0)
torch.manual_seed(0)
model = unidist.auto_model(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
state = unidist.ResumableState(
    checkpoint, job="ignite", model=model, optimizer=optimizer, loader=loader, save_every=7
)
log = (record / f"reads-r{unidist.get_rank()}-p{os.getpid()}.jsonl").open("a", buffering=1)


def update(engine: Engine, batch: list[torch.Tensor]) -> float:
    ids, x = batch
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    line = {"epoch": engine.state.epoch - 1, "step": engine.state.iteration, "ids": ids.tolist()}
    line["resumed_from"] = state.resumed_from or 0
    log.write(json.dumps(line) + "\n")
    time.sleep(delay)
    return loss.item()


trainer = Engine(update)
attach_resumable(trainer, state)
trainer.run(loader, max_epochs=3)
print(f"rank {unidist.get_rank()} done at iteration {trainer.state.iteration}", flush=True)
