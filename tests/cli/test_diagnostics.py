"""``unidist probe``: a safe device/runtime report whose JSON follows a fixed schema."""

from __future__ import annotations

import io
import json
import types
from typing import Any

import pytest
import torch

import unidist
from tests.test_cli import run_cli
from unidist.cli.diagnostics import format_probe, show_probe

OPT_STR = (str, type(None))
OPT_INT = (int, type(None))


class EachValue:
    """Schema of a mapping with free keys whose values all follow ``schema``."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema


ADAPTER = {"installed": bool, "version": OPT_STR, "origin": str, "install": OPT_STR}
DEVICE_KIND = {"available": bool, "missing": OPT_STR, "backend": str}
CUDA_DEVICE = {
    "index": int,
    "name": str,
    "capability": str,
    "memory_gib": (int, float),
    "multiprocessors": int,
}
SCHEMA = {
    "unidist": str,
    "python": str,
    "platform": str,
    "launcher": str,
    "topology": {
        "rank": int,
        "world_size": int,
        "local_rank": int,
        "local_world_size": int,
        "node_rank": int,
        "num_nodes": int,
        "launcher": str,
    },
    "environment_notes": [str],
    "master": {"addr": OPT_STR, "port": OPT_INT},
    "adapter": {"name": OPT_STR, "reason": str},
    "adapters": EachValue(ADAPTER),
    "torch": {
        "version": str,
        "git": OPT_STR,
        "debug": bool,
        "cuda_built": bool,
        "cuda_version": OPT_STR,
        "hip_version": OPT_STR,
        "cudnn_version": OPT_INT,
        "distributed": bool,
    },
    "cuda": {
        "available": bool,
        "problem": OPT_STR,
        "device_count": int,
        "driver": {"version": OPT_STR, "cuda": OPT_STR},
        "devices": [CUDA_DEVICE],
    },
    "mps": {"built": bool, "available": bool},
    "devices": dict.fromkeys(("cpu", "cuda", "mps", "xla", "neuron", "hpu", "xpu"), DEVICE_KIND),
    "backends": [str],
    "unusable_backends": EachValue(str),
    "pick": {
        "device": str,
        "kind": str,
        "backend": OPT_STR,
        "backend_if_distributed": str,
        "reason": str,
    },
    "initialized": bool,
}


def violations(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (dict: exact keys; [s]: list of s; types: isinstance)."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        problems = [f"{path}: missing {k!r}" for k in schema.keys() - value.keys()]
        problems += [f"{path}: unexpected {k!r}" for k in value.keys() - schema.keys()]
        for key in schema.keys() & value.keys():
            problems += violations(value[key], schema[key], f"{path}.{key}")
        return problems
    if isinstance(schema, EachValue):
        if not isinstance(value, dict):
            return [f"{path}: expected an object"]
        return [p for k, v in value.items() for p in violations(v, schema.schema, f"{path}.{k}")]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in violations(v, schema[0], f"{path}[{i}]")]
    kinds = schema if isinstance(schema, tuple) else (schema,)
    # JSON has no separate bool: refuse True where an int is expected, and vice versa.
    if isinstance(value, bool) and bool not in kinds:
        return [f"{path}: expected {kinds}, got bool"]
    if not isinstance(value, kinds):
        return [f"{path}: expected {kinds}, got {type(value).__name__} {value!r}"]
    return []


def test_the_validator_catches_mistakes() -> None:
    assert violations({"a": 1}, {"a": int}) == []
    assert violations({"a": True}, {"a": int}) == ["$.a: expected (<class 'int'>,), got bool"]
    assert violations({"a": [1, "x"]}, {"a": [int]}) == [
        "$.a[1]: expected (<class 'int'>,), got str 'x'"
    ]
    assert violations({}, {"a": int}) == ["$: missing 'a'"]
    assert violations({"a": 1, "b": 2}, {"a": int}) == ["$: unexpected 'b'"]


def test_probe_json_follows_the_schema() -> None:
    done = run_cli("probe", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert violations(info, SCHEMA) == []
    assert info["torch"]["version"] == torch.__version__
    assert info["devices"]["cpu"] == {"available": True, "missing": None, "backend": "gloo"}
    assert info["initialized"] is False
    assert ("nccl" in info["unusable_backends"]) == (
        "nccl" in info["backends"] and not info["cuda"]["available"]
    )
    if info["cuda"]["available"]:
        assert info["pick"]["device"] == "cuda:0"
        assert len(info["cuda"]["devices"]) == info["cuda"]["device_count"] > 0
    else:
        assert info["cuda"]["problem"] == info["devices"]["cuda"]["missing"]
        assert info["cuda"]["devices"] == []
        if not info["mps"]["available"]:
            assert info["pick"]["device"] == "cpu"
    assert info["pick"]["backend"] is None  # one process: no process group at all


def test_probe_under_torchrun_reports_the_topology_and_backend() -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_RUN_ID": "x",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "",
    }
    done = run_cli("probe", "--json", env=env)
    info = json.loads(done.stdout)
    assert violations(info, SCHEMA) == []
    assert info["launcher"] == "torchrun"
    assert info["topology"]["rank"] == 1
    assert info["pick"]["backend"] == info["pick"]["backend_if_distributed"]


def test_probe_table() -> None:
    done = run_cli("probe")
    assert done.returncode == 0, done.stderr
    for line in ("  torch         ", "  nvidia driver ", "  devices", "    cpu         available"):
        assert line in done.stdout
    assert "  would use     " in done.stdout


def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    props = types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=150 * 2**30, multi_processor_count=132
    )
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


def test_probe_lists_gpus_and_picks_the_local_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch)
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(unidist.session.devices, "available_backends", lambda: ("gloo", "nccl"))
    out = io.StringIO()
    info = show_probe(file=out)
    assert violations(json.loads(json.dumps(info)), SCHEMA) == []
    assert info["cuda"]["devices"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "capability": "9.0",
        "memory_gib": 150.0,
        "multiprocessors": 132,
    }
    assert info["pick"] == {
        "device": "cuda:1",
        "kind": "cuda",
        "backend": "nccl",
        "backend_if_distributed": "nccl",
        "reason": "2 CUDA device(s) visible",
    }
    table = out.getvalue()
    assert table == format_probe(info)
    assert "    cuda:1       NVIDIA H200, 150.0 GiB, sm 9.0" in table
    assert "  would use     cuda:1, backend nccl" in table
    assert not torch.distributed.is_initialized()  # the probe started nothing
