"""``unidist.device`` / ``default_backend``: auto choice, explicit kinds, and every missing runtime.

No GPU here: CUDA and MPS are faked with monkeypatch where a test needs them present, and where a
test needs them absent, so the tests pass the same way on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from typing import Any

import pytest
import torch
import torch.distributed as dist

import unidist
from unidist.environments import variables as _env
from unidist.errors import ConfigurationError, DeviceUnavailableError
from unidist.session import devices, lifecycle

NO_DRIVER = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
    "installed a driver from http://www.nvidia.com/Download/index.aspx"
)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build of torch on a machine without an NVIDIA driver (this project's machines)."""

    def init() -> None:
        raise RuntimeError(NO_DRIVER)

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "init", init)


@pytest.fixture
def no_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Two visible CUDA devices; returns the list of indices passed to set_device."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def local_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int = 4) -> None:
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": world,
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": world,
    }.items():
        monkeypatch.setenv(name, str(value))


def test_auto_is_the_cpu_without_cuda_or_mps(no_cuda: None, no_mps: None) -> None:
    assert unidist.device() == torch.device("cpu")
    assert devices.device_kind() == "cpu"
    assert unidist.default_backend() == "gloo"


def test_explicit_cpu() -> None:
    assert unidist.device("cpu") == torch.device("cpu")
    assert unidist.device(" CPU ") == torch.device("cpu")


def test_auto_picks_the_local_ranks_gpu_and_makes_it_current(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: list[int]
) -> None:
    local_rank(monkeypatch, 3)
    assert unidist.device() == torch.device("cuda", 1)  # local rank 3 % 2 visible devices
    assert fake_cuda == [1]
    assert unidist.device("gpu") == torch.device("cuda", 1)
    assert unidist.device("cuda:0") == torch.device("cuda", 0)
    assert fake_cuda == [1, 1, 0]
    assert unidist.default_backend() == "nccl"


def test_cuda_comes_before_mps(monkeypatch: pytest.MonkeyPatch, fake_cuda: list[int]) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert unidist.device() == torch.device("cuda", 0)


def test_auto_picks_mps_when_there_is_no_cuda(
    monkeypatch: pytest.MonkeyPatch, no_cuda: None
) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    assert unidist.device() == torch.device("mps")
    assert unidist.device("mps") == torch.device("mps")
    assert unidist.default_backend() == "gloo"  # CPU-side collectives: no MPS backend exists


def test_cuda_index_out_of_range(fake_cuda: list[int]) -> None:
    with pytest.raises(ConfigurationError, match=r"'cuda:5' does not exist: torch sees 2 CUDA"):
        unidist.device("cuda:5")


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    """Make ``name`` importable (and found by find_spec) as a stub module."""
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    real = importlib.util.find_spec

    def find_spec(wanted: str, *args: Any) -> Any:
        if wanted == name:
            return importlib.machinery.ModuleSpec(name, None)
        return real(wanted, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    ("kind", "missing"),
    [
        (
            "gpu",
            "device 'gpu' is not available: torch 2",  # ... is built for CUDA x.y, but CUDA
        ),
        ("cuda", "CUDA cannot start: Found no NVIDIA driver on your system"),
        ("cuda:0", "It needs a CUDA build of torch, an NVIDIA driver and a GPU"),
        ("mps", "has no MPS support (macOS builds only)"),
        ("tpu", "device 'tpu' is not available: torch_xla is not installed"),
        ("xla", "export PJRT_DEVICE=TPU"),
        ("neuron", "torch_neuronx and torch_xla are not installed"),
        ("hpu", "habana_frameworks is not installed (install Intel Gaudi's SynapseAI"),
        ("xpu", "has no XPU support"),
    ],
)
def test_every_unavailable_kind_says_what_is_missing(
    kind: str, missing: str, no_cuda: None, no_mps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: False)
    with pytest.raises(DeviceUnavailableError) as caught:
        unidist.device(kind)
    message = str(caught.value)
    assert missing in message
    assert "HINT: run where that runtime is installed, or use device('cpu')" in message
    assert caught.value.kind == devices._parse(kind)[0]
    assert caught.value.missing in message
    assert isinstance(caught.value, ConfigurationError)


def test_cpu_only_torch_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with pytest.raises(DeviceUnavailableError, match=r"this torch build \(.*\) has no CUDA"):
        unidist.device("gpu")


def test_cuda_build_with_a_driver_but_no_visible_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    with pytest.raises(DeviceUnavailableError, match=r"sees no CUDA device"):
        unidist.device("cuda")


def test_mps_built_but_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    with pytest.raises(DeviceUnavailableError, match=r"no Metal device is usable"):
        unidist.device("mps")


def test_xla_installed_without_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def xla_device() -> torch.device:
        raise RuntimeError("PJRT_DEVICE is not set")

    fake_module(monkeypatch, "torch_xla")
    fake_module(monkeypatch, "torch_xla.core.xla_model", xla_device=xla_device)
    with pytest.raises(DeviceUnavailableError, match=r"found no device: PJRT_DEVICE is not set"):
        unidist.device("tpu")


def test_xla_installed_with_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_module(monkeypatch, "torch_xla")
    fake_module(monkeypatch, "torch_xla.core.xla_model", xla_device=lambda: torch.device("xla"))
    assert unidist.device("tpu") == torch.device("xla")
    assert unidist.default_backend(torch.device("xla")) == "xla"


def test_hpu_installed_without_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_module(monkeypatch, "habana_frameworks")
    fake_module(monkeypatch, "habana_frameworks.torch.core")
    monkeypatch.setattr(
        torch, "hpu", types.SimpleNamespace(is_available=lambda: False), raising=False
    )
    with pytest.raises(DeviceUnavailableError, match=r"no Gaudi device is visible"):
        unidist.device("hpu")
    monkeypatch.setattr(torch, "hpu", types.SimpleNamespace(is_available=lambda: True))
    assert unidist.device("hpu") == torch.device("hpu")


def test_xpu_built_without_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match=r"no XPU device is visible"):
        unidist.device("xpu")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("gpux", "unknown device kind 'gpux' (did you mean 'gpu'?); expected one of auto, cpu"),
        ("metal", "unknown device kind 'metal'; expected one of auto, cpu, cuda, mps"),
        ("cpu:1", "a cpu device takes no index"),
        ("cuda:x", "malformed index"),
        ("auto:0", "malformed index"),
        (0, "device kind must be a string"),
    ],
)
def test_bad_kinds(kind: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        unidist.device(kind)


@pytest.mark.parametrize(
    ("device", "backend"),
    [
        ("cpu", "gloo"),
        (torch.device("cpu"), "gloo"),
        ("cuda:1", "nccl"),
        ("gpu", "nccl"),
        (torch.device("cuda", 0), "nccl"),
        (torch.device("mps"), "gloo"),
        ("tpu", "xla"),
        ("neuron", "xla"),
        ("hpu", "hccl"),
        ("xpu", "xccl"),
    ],
)
def test_default_backend(device: Any, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "available_backends", lambda: ("gloo", "nccl", "xccl"))
    assert unidist.default_backend(device) == backend


def test_default_backend_falls_back_to_gloo_without_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "available_backends", lambda: ("gloo",))
    assert unidist.default_backend("cuda") == "gloo"
    assert unidist.default_backend("xpu") == "gloo"


def test_default_backend_of_an_unknown_device_type() -> None:
    with pytest.raises(ConfigurationError, match=r"no process-group backend is known for .*meta"):
        unidist.default_backend(torch.device("meta"))


def test_available_backends_tells_the_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    built = unidist.available_backends()
    assert "gloo" in built
    assert ("nccl" in built) == dist.is_nccl_available()
    assert ("mpi" in built) == dist.is_mpi_available()
    # A plugin's registered backend (habana_frameworks registers hccl) counts too.
    monkeypatch.setattr(dist.Backend, "backend_list", [*dist.Backend.backend_list, "hccl"])
    assert unidist.available_backends() == (*built, "hccl")


def test_initialize_picks_the_backend_of_the_auto_device(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: list[int]
) -> None:
    two = _env.read({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    monkeypatch.setattr(devices, "available_backends", lambda: ("gloo", "nccl"))
    assert lifecycle._resolve_backend(None, two, live=False) == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert lifecycle._resolve_backend(None, two, live=False) == "gloo"
    one = _env.read({})
    assert lifecycle._resolve_backend(None, one, live=False) is None


def test_initialize_refuses_nccl_without_cuda(no_cuda: None) -> None:
    with pytest.raises(DeviceUnavailableError) as caught:
        unidist.initialize("nccl")
    assert str(caught.value).startswith("backend 'nccl' needs CUDA devices: torch ")
    assert "Found no NVIDIA driver" in str(caught.value)
    assert "HINT: use backend='gloo' on CPU" in str(caught.value)


def test_unavailable_reason_is_side_effect_free(no_cuda: None, no_mps: None) -> None:
    assert devices.unavailable_reason("cpu") is None
    assert devices.unavailable_reason("auto") is None
    reason = devices.unavailable_reason("gpu")
    assert reason is not None
    assert "Found no NVIDIA driver" in reason


def test_the_real_cuda_check_leaves_the_environment_alone() -> None:
    # Unfaked: torch.cuda.init() exports CUDA_MODULE_LOADING; the autouse fixture fails the
    # test if unidist leaves it behind.
    reason = devices.unavailable_reason("cuda")
    assert (reason is None) == (torch.cuda.is_available() and torch.cuda.device_count() > 0)


def test_local_cuda_device_wraps_the_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from unidist.session.devices import local_cuda_device

    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert local_cuda_device(3) == torch.device("cuda", 1)
    assert chosen == [1]
