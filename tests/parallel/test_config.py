"""Parallelism settings: degrees against the world size, typos, bad values, checks on the model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from unidist import ConfigurationError
from unidist.parallel import (
    DDPConfig,
    Degrees,
    FSDP2Config,
    FSDPConfig,
    ParallelismConfig,
    TPConfig,
)

MLP_PLAN = {"fc1": "colwise", "fc2": "rowwise"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.parametrize(
    ("world", "settings", "expected"),
    [
        (4, {}, (4, 1, 1)),
        (4, {"ddp": {"find_unused_parameters": True}}, (4, 1, 1)),
        (1, {"fsdp2": {}}, (1, 1, 1)),
        (4, {"fsdp2": {}}, (1, 4, 1)),
        (8, {"fsdp2": {"replicate_degree": 2}}, (2, 4, 1)),
        (8, {"fsdp2": {"replicate_degree": -1, "shard_degree": 2}}, (4, 2, 1)),
        (
            8,
            {
                "fsdp": {
                    "sharding_strategy": "hybrid_shard",
                    "replicate_degree": -1,
                    "shard_degree": 4,
                }
            },
            (2, 4, 1),
        ),
        (8, {"fsdp2": {}, "tp": {"degree": 2, "plan": MLP_PLAN}}, (1, 4, 2)),
        (8, {"fsdp2": {"shard_degree": 2}, "tp": {"degree": -1, "plan": MLP_PLAN}}, (1, 2, 4)),
        (4, {"tp": {"degree": -1, "plan": MLP_PLAN}}, (1, 1, 4)),
        (4, {"tp": {"degree": 4, "plan": MLP_PLAN}}, (1, 1, 4)),
        # Composer's key names
        (
            4,
            {
                "fsdp": {"data_parallel_shard_degree": 2},
                "tp": {"tensor_parallel_degree": 2, "layer_plan": MLP_PLAN},
            },
            (1, 2, 2),
        ),
    ],
)
def test_good_degrees(world: int, settings: dict[str, Any], expected: tuple[int, int, int]) -> None:
    config = ParallelismConfig.from_dict(settings)
    degrees = config.validate(world)
    assert degrees == Degrees(*expected)
    assert degrees.world_size == world


@pytest.mark.parametrize(
    ("world", "settings", "message"),
    [
        (
            4,
            {"fsdp2": {"shard_degree": 3}},
            "fsdp2.replicate_degree=1 * fsdp2.shard_degree=3 = 3, but the world size is 4",
        ),
        (
            8,
            {"fsdp2": {"replicate_degree": 2, "shard_degree": 2}},
            "fsdp2.replicate_degree=2 * fsdp2.shard_degree=2 = 4, but the world size is 8",
        ),
        (
            4,
            {"fsdp2": {"replicate_degree": 3}},
            "fsdp2.replicate_degree=3 = 3 does not divide the world size 4, so "
            "fsdp2.shard_degree=-1 cannot be inferred",
        ),
        (
            8,
            {"fsdp2": {}, "tp": {"degree": -1, "plan": MLP_PLAN}},
            "fsdp2.shard_degree and tp.degree are -1, but only one degree can be inferred",
        ),
        (
            4,
            {"fsdp": {"shard_degree": 2}, "tp": {"degree": 4, "plan": MLP_PLAN}},
            "fsdp.replicate_degree=1 * fsdp.shard_degree=2 * tp.degree=4 = 8, but the world "
            "size is 4",
        ),
        (
            6,
            {"fsdp2": {}, "tp": {"degree": 4, "plan": MLP_PLAN}},
            "tp.degree=4 = 4 does not divide the world size 6",
        ),
        (
            4,
            {"tp": {"degree": 2, "plan": MLP_PLAN}},
            "tp.degree=2 with world size 4: tensor parallelism alone needs tp.degree == world size",
        ),
        (
            4,
            {"tp": {"degree": 8, "plan": MLP_PLAN}},
            "tp.degree=8 needs 8 ranks, but the world size is 4",
        ),
    ],
)
def test_bad_degrees(world: int, settings: dict[str, Any], message: str) -> None:
    config = ParallelismConfig.from_dict(settings)
    with pytest.raises(ConfigurationError) as caught:
        config.validate(world)
    assert message in str(caught.value)
    assert "HINT:" in str(caught.value)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"fsdp_2": {}}, "unknown parallelism section 'fsdp_2' (did you mean 'fsdp2'?)"),
        ({"fsdp2": {"shard_degre": 2}}, "unknown fsdp2 setting 'shard_degre' (did you mean "),
        (
            {"fsdp": {"sharding_stratgy": "FULL_SHARD"}},
            "(did you mean 'sharding_strategy'?); FSDPConfig takes",
        ),
        ({"ddp": {"find_unused_params": True}}, "(did you mean 'find_unused_parameters'?)"),
        ({"tp": {"degre": 2, "plan": MLP_PLAN}}, "unknown tp setting 'degre' (did you mean"),
        ({"tp": {"plan": MLP_PLAN}}, "missing 1 required positional argument: 'degree'"),
        ({"tp": {"degree": 2, "plan": {}}}, "TPConfig.plan={} must be a non-empty mapping"),
        (
            {"tp": {"degree": 2, "plan": {"fc1": "colwize"}}},
            "TPConfig.plan['fc1']='colwize' is not a style (did you mean 'colwise'?)",
        ),
        (
            {"fsdp": {"sharding_strategy": "FULL_SHARDD"}},
            "FSDPConfig.sharding_strategy must be one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
            "HYBRID_SHARD, _HYBRID_SHARD_ZERO2, got 'FULL_SHARDD' (did you mean 'FULL_SHARD'?).",
        ),
        (
            {"fsdp": {"backward_prefetch": "pre"}},
            "must be one of BACKWARD_POST, BACKWARD_PRE, NONE, got 'pre'",
        ),
        ({"fsdp2": {"state_dict_type": "local"}}, "must be one of full, sharded, got 'local'"),
        ({"fsdp2": {"shard_degree": 0}}, "must be a positive integer, or -1"),
        ({"fsdp2": {"shard_degree": True}}, "FSDP2Config.shard_degree=True must be a positive"),
        ({"tp": {"degree": -2, "plan": MLP_PLAN}}, "TPConfig.degree=-2 must be a positive"),
        (
            {"fsdp": {"replicate_degree": 2}},
            "replicate_degree=2 replicates shards, but sharding_strategy='FULL_SHARD' does not",
        ),
        ({"fsdp": {"sharding_strategy": "HYBRID_SHARD"}}, "needs replicate_degree > 1 (or -1)"),
        ({"fsdp": {}, "fsdp2": {}}, "ParallelismConfig sets fsdp and fsdp2"),
        ({"ddp": {}, "tp": {"degree": 2, "plan": MLP_PLAN}}, "DDP cannot wrap a tensor-parallel"),
        ({"fsdp2": {"mixed_precision": "DEFAULT"}}, "HINT: write the dtypes"),
        ({"fsdp2": {"mixed_precision": {"param_dtype": "bf17"}}}, "'bf17' is not a dtype"),
        (
            {"fsdp": {"mixed_precision": {"param_dtpye": "bf16"}}},
            "key 'param_dtpye' is unknown (did you mean 'param_dtype'?)",
        ),
        ({"fsdp2": {"mixed_precision": {"buffer_dtype": "bf16"}}}, "is an FSDP v1 setting"),
        ({"fsdp2": {"reshard_after_forward": 1}}, "must be True, False or a group size > 1"),
        ({"ddp": {"bucket_cap_mb": 0}}, "bucket_cap_mb=0 must be a positive number"),
        (
            {"ddp": {"static_graph": "yes"}},
            "DDPConfig.static_graph must be True or False, got 'yes'.",
        ),
        ({"fsdp2": {"wrap": [1]}}, "entries must be module classes or class names"),
        ({"fsdp2": 2}, "parallelism section 'fsdp2' must be a mapping of settings"),
    ],
)
def test_bad_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ParallelismConfig.from_dict(settings)
    assert message in str(caught.value)


def test_typed_objects_are_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="must be a unidist FSDPConfig or None"):
        ParallelismConfig(fsdp=DDPConfig())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="sharding_strategy must be one of"):
        FSDPConfig(sharding_strategy="SHARD")
    config = ParallelismConfig(fsdp2=FSDP2Config(wrap=Block), tp=TPConfig(2, MLP_PLAN))
    assert config.fsdp2 is not None
    assert config.fsdp2.wrap == (Block,)
    assert config.strategy == "fsdp2"
    assert ParallelismConfig().strategy == "ddp"
    assert ParallelismConfig(tp=TPConfig(-1, MLP_PLAN)).strategy == "tp"
    assert FSDPConfig(sharding_strategy="shard_grad_op").sharding_strategy == "SHARD_GRAD_OP"


def test_validate_defaults_to_unidists_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert ParallelismConfig(fsdp2=FSDP2Config()).validate() == Degrees(1, 4, 1)


@pytest.mark.parametrize(
    ("settings", "world", "message"),
    [
        (
            {"fsdp2": {}, "tp": {"degree": 2, "plan": {"layers.*.fc3": "colwise"}}},
            4,
            "tp.plan names 'layers.*.fc3' (did you mean 'layers.1.fc2'?), but no module of the "
            "model matches it (parallelize_module would silently skip it)",
        ),
        (
            {"tp": {"degree": -1, "plan": {"layers.0.fc1": "colwise"}}},
            3,
            "tp.degree=3 does not divide layers.0.fc1.out_features=8, which colwise splits",
        ),
        (
            {"tp": {"degree": -1, "plan": {"head": "rowwise"}}},
            8,
            "tp.degree=8 does not divide head.in_features=4, which rowwise splits",
        ),
        (
            {"tp": {"degree": 2, "plan": {"layers.0.act": "colwise"}}},
            2,
            "colwise splits nn.Linear or nn.Embedding, but 'layers.0.act' is ReLU",
        ),
        (
            {"fsdp2": {"wrap": ["Blok"]}},
            2,
            "wrap names 'Blok' (did you mean 'Block'?), but the model has no module of that class",
        ),
        ({"fsdp": {"wrap": [nn.Conv2d]}}, 2, "wrap names 'Conv2d'"),
    ],
)
def test_checks_against_the_model(settings: dict[str, Any], world: int, message: str) -> None:
    config = ParallelismConfig.from_dict(settings)
    with pytest.raises(ConfigurationError) as caught:
        config.validate(world, Net())
    assert message in str(caught.value)


def test_ddp_needs_trainable_parameters() -> None:
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ConfigurationError, match="DDP needs a model with trainable parameters"):
        ParallelismConfig().validate(2, frozen)


def test_a_good_plan_with_wildcards_and_wrap_names_passes() -> None:
    config = ParallelismConfig.from_dict(
        {
            "fsdp2": {"wrap": ["Block"]},
            "tp": {"degree": 2, "plan": {"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise"}},
        }
    )
    assert config.validate(4, Net()) == Degrees(1, 2, 2)


def test_dict_forms_of_wrap_and_composers_none() -> None:
    config = ParallelismConfig.from_dict(
        {"fsdp": {"wrap": "Block", "data_parallel_replicate_degree": None}}
    )
    assert config.fsdp is not None
    assert config.fsdp.wrap == ("Block",)
    assert config.fsdp.replicate_degree == 1
    assert ParallelismConfig.from_dict({"fsdp2": {"wrap": ["Block", nn.Linear]}}).validate(
        2, Net()
    ) == Degrees(1, 2, 1)
