"""Exact-once evaluation inside Composer's Trainer.eval(), over 2 gloo processes.

Composer stops every rank as soon as one rank runs out of batches, so uneven shards (what
``mode="eval"`` gives elsewhere) would lose samples there: N=7 on 2 ranks evaluated 6.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from unidist.testing import run_distributed

pytestmark = [pytest.mark.composer, pytest.mark.multiprocess]

LENGTH = 7


def _evaluate(batch_size: int, mode: str) -> dict[str, Any]:
    """Rank body: Trainer.eval() over ids 0..6 with a metric that counts and sums them."""
    from composer import Trainer
    from composer.models import ComposerModel
    from torch.utils.data import DataLoader, TensorDataset
    from torchmetrics import Metric

    import unidist

    class Seen(Metric):
        """Counts the evaluated ids, their sum and their sum of squares (duplicates show)."""

        def __init__(self) -> None:
            super().__init__()
            for name in ("count", "total", "squares"):
                self.add_state(name, default=torch.tensor(0), dist_reduce_fx="sum")

        def update(self, ids: torch.Tensor, _: Any) -> None:
            self.count += ids.numel()
            self.total += ids.sum()
            self.squares += (ids * ids).sum()

        def compute(self) -> torch.Tensor:
            return torch.stack([self.count, self.total, self.squares])  # type: ignore[list-item]

    class Model(ComposerModel):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(1, 1)
            self.seen = Seen()

        def forward(self, batch: Any) -> torch.Tensor:
            return self.net(batch[0].float().unsqueeze(1))

        def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
            return outputs.sum()

        def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
            return {} if is_train else {"Seen": self.seen}

        def update_metric(self, batch: Any, outputs: Any, metric: Metric) -> None:
            metric.update(batch[0], outputs)

    ids = torch.arange(LENGTH)
    data = TensorDataset(ids)
    sampler = unidist.DistributedSampler(data, mode=mode, shuffle=False)  # type: ignore[arg-type]
    trainer = Trainer(
        model=Model(),
        eval_dataloader=DataLoader(data, batch_size=batch_size, sampler=sampler),
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        loggers=[],
    )
    trainer.eval()
    count, total, squares = trainer.state.eval_metrics["eval"]["Seen"].compute().tolist()
    result = {"count": count, "total": total, "squares": squares, "len": len(sampler)}
    result["outside"] = len(unidist.DistributedSampler(data, mode=mode))  # not in Composer
    trainer.close()
    return result


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_every_sample_is_evaluated_exactly_once_in_composers_trainer(batch_size: int) -> None:
    results = run_distributed(_evaluate, batch_size, "eval", adapter="composer", timeout=180)
    expected = {"count": LENGTH, "total": sum(range(LENGTH)), "squares": 91}
    for result in results:
        assert {k: result[k] for k in expected} == expected
    # Outside Composer's eval loop the shards stay exact: 4 and 3 samples, no padding.
    assert [r["outside"] for r in results] == [4, 3]
