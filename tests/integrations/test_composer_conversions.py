"""unidist devices and parallelism settings as Composer ``Device`` and ``ParallelismConfig``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from unidist import ConfigurationError, DeviceUnavailableError
from unidist.parallel import FSDP2Config, FSDPConfig, ParallelismConfig, TPConfig

pytestmark = pytest.mark.composer

PLAN = {"fc1": "colwise", "fc2": "rowwise"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


@pytest.fixture
def world_of_four(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")


def test_cpu_device() -> None:
    from composer.devices import DeviceCPU

    from unidist.integrations.composer import to_composer_device

    assert isinstance(to_composer_device("cpu"), DeviceCPU)
    assert isinstance(to_composer_device(torch.device("cpu")), DeviceCPU)


def test_gpu_device_uses_the_local_ranks_index(monkeypatch: pytest.MonkeyPatch) -> None:
    from composer.devices import DeviceGPU

    from unidist.integrations.composer import to_composer_device

    current: list[int] = [0]
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: current.__setitem__(0, int(getattr(d, "index", d)))
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    for name, value in {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "4",
    }.items():
        monkeypatch.setenv(name, value)
    # DeviceGPU sets process-wide TF32 flags: put them back afterwards.
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        device = to_composer_device("gpu", allow_tf32=False)
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    assert isinstance(device, DeviceGPU)
    assert device._device == torch.device("cuda", 1)


def test_mps_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from composer.devices import DeviceMPS

    from unidist.integrations.composer import to_composer_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    assert isinstance(to_composer_device("mps"), DeviceMPS)


def test_missing_runtimes_are_reported_by_unidist(monkeypatch: pytest.MonkeyPatch) -> None:
    from unidist.integrations.composer import to_composer_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    with pytest.raises(DeviceUnavailableError, match="device 'gpu' is not available"):
        to_composer_device("gpu")
    with pytest.raises(DeviceUnavailableError, match="torch_neuronx and torch_xla"):
        to_composer_device("neuron")
    with pytest.raises(ConfigurationError, match="Composer has no Device class for 'xpu'"):
        to_composer_device(torch.device("xpu"))


def test_ddp_is_left_to_composer() -> None:
    assert ParallelismConfig().to_composer() is None
    with pytest.raises(ConfigurationError, match=r"takes none of find_unused_parameters=True"):
        ParallelismConfig.from_dict({"ddp": {"find_unused_parameters": True}}).to_composer()


def test_fsdp_v1(world_of_four: None) -> None:
    from composer.utils import FSDPConfig as ComposerFSDP, ParallelismConfig as ComposerParallelism

    config = ParallelismConfig(
        fsdp=FSDPConfig(
            shard_degree=2,
            replicate_degree=-1,
            sharding_strategy="hybrid_shard",
            mixed_precision={"param_dtype": "bf16", "reduce_dtype": "fp32"},
            backward_prefetch="backward_pre",
            sync_module_states=True,
        )
    )
    composer = config.to_composer()
    assert isinstance(composer, ComposerParallelism)
    assert composer.fsdp2 is None
    assert composer.tp is None
    fsdp = composer.fsdp
    assert isinstance(fsdp, ComposerFSDP)
    assert (fsdp.data_parallel_shard_degree, fsdp.data_parallel_replicate_degree) == (2, -1)
    assert fsdp.sharding_strategy == "HYBRID_SHARD"
    assert fsdp.mixed_precision == {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    assert fsdp.backward_prefetch == "BACKWARD_PRE"
    assert fsdp.sync_module_states is True
    assert fsdp.state_dict_type == "full"


def test_fsdp_v1_replicate_one_is_composers_none(world_of_four: None) -> None:
    fsdp = ParallelismConfig(fsdp=FSDPConfig()).to_composer().fsdp
    assert fsdp.data_parallel_replicate_degree is None
    assert fsdp.mixed_precision == "FULL"


def test_fsdp2_with_tp(world_of_four: None) -> None:
    from composer.utils import FSDP2Config as ComposerFSDP2, TPConfig as ComposerTP
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    config = ParallelismConfig(fsdp2=FSDP2Config(reshard_after_forward=False), tp=TPConfig(2, PLAN))
    model = Block()
    with pytest.warns(UserWarning, match="FSDP2 Config/APIs are experimental"):  # Composer's
        composer = config.to_composer(model)
    assert len(model._forward_pre_hooks) == 1  # corrects gloo's averaging once sharded
    assert isinstance(composer.fsdp2, ComposerFSDP2)
    assert composer.fsdp2.reshard_after_forward is False
    assert composer.fsdp2.state_dict_type == "sharded"
    assert isinstance(composer.tp, ComposerTP)
    assert composer.tp.tensor_parallel_degree == 2
    assert isinstance(composer.tp.layer_plan["fc1"], ColwiseParallel)
    assert isinstance(composer.tp.layer_plan["fc2"], RowwiseParallel)


def test_wrap_reaches_composer_through_fsdp_wrap_fn(world_of_four: None) -> None:
    from composer.models import ComposerClassifier

    inner = nn.Sequential(Block(), Block())
    model = ComposerClassifier(inner, num_classes=4)
    config = ParallelismConfig(fsdp=FSDPConfig(wrap=("Block",)))
    with pytest.raises(ConfigurationError, match=r"needs the model. HINT: config.to_composer"):
        config.to_composer()
    config.to_composer(model)
    for target in (model, inner):  # Composer reads it on the ComposerModel's children
        assert target.fsdp_wrap_fn(inner[0]) is True
        assert target.fsdp_wrap_fn(inner[0].fc1) is False


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tp": {"degree": 4, "plan": PLAN}}, "tensor parallelism only together with FSDP"),
        ({"fsdp2": {"replicate_degree": 2}}, "builds a 1-D mesh for FSDP2"),
        ({"fsdp2": {"shard_degree": 3}}, "but the world size is 4"),
    ],
)
def test_what_composer_cannot_carry(
    settings: dict[str, Any], message: str, world_of_four: None
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ParallelismConfig.from_dict(settings).to_composer()


def test_an_existing_wrap_fn_is_not_replaced(world_of_four: None) -> None:
    model = nn.Sequential(Block())
    model.fsdp_wrap_fn = lambda module: False  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match="already defines fsdp_wrap_fn"):
        ParallelismConfig(fsdp=FSDPConfig(wrap=(Block,))).to_composer(model)


def composer_fit(settings: dict[str, Any] | None) -> dict[str, list[float]]:
    """Rank body: one SGD step of Composer's Trainer; the full parameters afterwards."""
    from composer import Trainer
    from composer.models import ComposerClassifier
    from composer.utils import dist
    from torch.distributed.tensor import DTensor
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = ComposerClassifier(nn.Sequential(Block(), nn.ReLU(), nn.Linear(4, 3)), num_classes=3)
    config = ParallelismConfig.from_dict(settings).to_composer(model) if settings else None
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(16, 4, generator=generator), torch.randint(0, 3, (16,), generator=generator)
    )
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=8, sampler=dist.get_sampler(data)),
        max_duration="1ba",
        device="cpu",
        parallelism_config=config,
        optimizers=torch.optim.SGD(model.parameters(), lr=1.0),
        progress_bar=False,
        log_to_console=False,
        loggers=[],
    )
    trainer.fit()
    return {
        name.replace("module.", ""): (p.full_tensor() if isinstance(p, DTensor) else p)
        .detach()
        .flatten()
        .tolist()
        for name, p in trainer.state.model.named_parameters()
    }


@pytest.mark.multiprocess
def test_composers_trainer_with_fsdp2_matches_its_ddp_on_the_cpu() -> None:
    from unidist.testing import run_distributed

    ddp = run_distributed(composer_fit, None, world_size=2, adapter="composer", timeout=180)
    fsdp2 = run_distributed(
        composer_fit, {"fsdp2": {"wrap": ["Block"]}}, world_size=2, adapter="composer", timeout=180
    )
    assert fsdp2[0].keys() == ddp[0].keys()
    for name, values in ddp[0].items():
        assert fsdp2[0][name] == pytest.approx(values, abs=1e-5), name
        assert fsdp2[1][name] == pytest.approx(values, abs=1e-5), name


def test_fsdp2_for_composer_on_the_cpu_needs_the_model(
    world_of_four: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with (
        pytest.warns(UserWarning, match="experimental"),
        pytest.raises(ConfigurationError, match=r"pytorch#162338.*to_composer\(model\)"),
    ):
        ParallelismConfig(fsdp2=FSDP2Config()).to_composer()
