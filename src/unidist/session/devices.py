"""Which device this process trains on, and which process-group backend goes with it.

:func:`device` answers with a ``torch.device`` and checks that the runtime is really there:
asking for ``"gpu"`` on a CUDA build of torch without an NVIDIA driver raises
:class:`~unidist.errors.DeviceUnavailableError` naming what is missing, instead of failing later
inside the first ``.to()``. ``"auto"`` picks CUDA (``cuda:<local rank % visible devices>``, and
makes it the current device), else Apple's MPS, else the CPU.

========  ==================  =========  ======================================================
kind      aliases             backend    needs
========  ==================  =========  ======================================================
cpu                           gloo       nothing
cuda      gpu                 nccl       a CUDA build of torch, an NVIDIA driver, a visible GPU
mps                           gloo       macOS on Apple silicon (gloo carries CPU-side copies)
xla       tpu                 xla        ``torch_xla`` and its runtime (``PJRT_DEVICE=TPU``)
neuron                        xla        ``torch_neuronx`` and ``torch_xla`` (AWS Trainium)
hpu                           hccl       Intel Gaudi's ``habana_frameworks`` (SynapseAI)
xpu                           xccl       a torch build with Intel XPU support and a device
========  ==================  =========  ======================================================

Nothing here writes environment variables (Composer's Neuron device sets ``PJRT_DEVICE``; here
the error says to export it).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from unidist.environments import variables as _env
from unidist.errors import ConfigurationError, DeviceUnavailableError
from unidist.session import state as _state

if TYPE_CHECKING:
    import torch

__all__ = [
    "BACKENDS",
    "DEVICE_KINDS",
    "KINDS",
    "available_backends",
    "default_backend",
    "device",
    "device_kind",
    "local_cuda_device",
    "require_backend",
    "unavailable_reason",
]


@dataclass(frozen=True)
class _Kind:
    name: str
    torch_type: str
    backend: str
    needs: str


_KINDS: dict[str, _Kind] = {
    kind.name: kind
    for kind in (
        _Kind("cpu", "cpu", "gloo", "nothing"),
        _Kind("cuda", "cuda", "nccl", "a CUDA build of torch, an NVIDIA driver and a GPU"),
        _Kind("mps", "mps", "gloo", "macOS 12.3+ on Apple silicon and a torch build with MPS"),
        _Kind("xla", "xla", "xla", "torch_xla and its runtime (export PJRT_DEVICE=TPU)"),
        _Kind("neuron", "xla", "xla", "torch_neuronx and torch_xla (export PJRT_DEVICE=NEURON)"),
        _Kind("hpu", "hpu", "hccl", "Intel Gaudi's habana_frameworks (SynapseAI)"),
        _Kind("xpu", "xpu", "xccl", "a torch build with Intel XPU support and an XPU device"),
    )
}
_ALIASES = {"gpu": "cuda", "tpu": "xla"}
#: The device kinds, canonical names.
KINDS: tuple[str, ...] = tuple(_KINDS)
#: Device kind -> the process-group backend that goes with it.
BACKENDS: dict[str, str] = {kind.name: kind.backend for kind in _KINDS.values()}
#: Every name :func:`device` accepts.
DEVICE_KINDS: tuple[str, ...] = ("auto", *_KINDS, *_ALIASES)
#: torch device type -> process-group backend (mps: gloo moves CPU copies of the tensors).
_BACKEND_OF_TYPE = {kind.torch_type: kind.backend for kind in _KINDS.values()}
#: When the preferred backend is not built into torch, gloo also carries these device types.
_GLOO_FALLBACK = {"cuda", "xpu"}


def device(kind: str = "auto") -> torch.device:
    """This process's training device; checks that its runtime is present.

    Args:
        kind: ``auto`` (CUDA, else MPS, else CPU), or one of ``cpu``, ``cuda``/``gpu``, ``mps``,
            ``xla``/``tpu``, ``neuron``, ``hpu``, ``xpu``. ``cuda:1`` pins an index. CUDA (asked
            for or picked) uses ``local_rank % device_count`` and becomes the current device
            (``torch.cuda.set_device``), so collectives and ``.cuda()`` land on it.

    Returns:
        The ``torch.device``, e.g. ``cuda:1`` on local rank 1 (never a bare ``cuda``).

    Raises:
        DeviceUnavailableError: the kind's runtime is missing; the message says what is missing.
        ConfigurationError: an unknown kind or an index out of range.
        TopologyError: CUDA needs the local rank and the launcher does not say it.
    """
    name, index = _parse(kind)
    if name == "auto":
        name = device_kind()
    _check_available(name, kind)
    if name == "cuda":
        return _cuda_device(index)
    if index is not None and name not in ("xpu", "hpu"):
        raise ConfigurationError(
            f"device {kind!r}: a {name} device takes no index. HINT: use {name!r}."
        )
    if name in ("xla", "neuron"):
        return _xla_device(name)
    import torch

    torch_type = _KINDS[name].torch_type
    return torch.device(torch_type) if index is None else torch.device(torch_type, index)


def device_kind() -> str:
    """The kind ``device("auto")`` picks here: ``cuda``, else ``mps``, else ``cpu``. Cheap.

    Neither touches the local rank nor sets the current device.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def default_backend(device: torch.device | str | None = None) -> str:
    """The process-group backend for a device: cpu/mps -> gloo, cuda -> nccl, xla -> xla, ...

    Args:
        device: a ``torch.device``, a device string (``"cuda:1"``) or kind (``"gpu"``);
            ``None`` means the kind ``device("auto")`` would pick.

    Returns:
        ``gloo``, ``nccl``, ``xla``, ``hccl`` or ``xccl``. For CUDA or XPU on a torch build
        without NCCL (XCCL), ``gloo``, which also carries those tensors. MPS gets ``gloo``: gloo
        reduces CPU copies, as there is no MPS collective backend.

    Raises:
        ConfigurationError: a device type no backend is known for (``meta``, ...).
    """
    if device is None:
        kind = device_kind()
    elif isinstance(device, str):
        kind = _parse(device)[0]
        kind = device_kind() if kind == "auto" else kind
    else:
        kind = device.type
    torch_type = _KINDS[kind].torch_type if kind in _KINDS else kind
    backend = _BACKEND_OF_TYPE.get(torch_type)
    if backend is None:
        raise ConfigurationError(
            f"no process-group backend is known for device type {torch_type!r}; known: "
            f"{', '.join(f'{t} -> {b}' for t, b in _BACKEND_OF_TYPE.items())}. HINT: move the "
            "model to a real device first, or pass backend= to unidist.initialize()."
        )
    if torch_type in _GLOO_FALLBACK and backend not in available_backends():
        return "gloo"
    return backend


def require_backend(name: str) -> None:
    """Raise unless backend ``name`` is built into torch and its devices are present.

    Raises:
        ConfigurationError: the backend is not in :func:`unidist.available_backends`.
        DeviceUnavailableError: ``nccl`` without a CUDA device (the message says why there is
            none), ``xccl`` without an XPU.
    """
    known = available_backends()
    if name not in known:
        raise ConfigurationError(
            f"backend {name!r} is not available in this torch build; available: "
            f"{', '.join(known) or 'none'}. HINT: use gloo on CPU, nccl on NVIDIA GPUs."
        )
    needs = {"nccl": ("cuda", "CUDA"), "xccl": ("xpu", "XPU")}.get(name)
    if needs is not None:
        try:
            _check_available(needs[0])
        except DeviceUnavailableError as exc:
            raise DeviceUnavailableError(
                f"backend {name!r} needs {needs[1]} devices: {exc.missing}. HINT: use "
                "backend='gloo' on CPU (or leave backend=None to pick by device).",
                kind=needs[0],
                missing=exc.missing,
            ) from None


def available_backends() -> tuple[str, ...]:
    """Process-group backends this torch build provides (``gloo``, ``nccl``, ``mpi``, ...).

    Built-in backends count when torch was compiled with them (``nccl`` on a CUDA build even
    without a GPU: :func:`unidist.probe` says whether devices are present); backends that a
    plugin registered with ``torch.distributed.Backend.register_backend`` (``hccl`` once
    ``habana_frameworks`` is imported, ``xla`` once ``torch_xla`` is) count too.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return ()
    checks = {
        "gloo": "is_gloo_available",
        "nccl": "is_nccl_available",
        "mpi": "is_mpi_available",
        "ucc": "is_ucc_available",
        "xccl": "is_xccl_available",
    }
    built = [name for name, check in checks.items() if getattr(dist, check, lambda: False)()]
    # "fake" (which newer torch registers for its own tests) moves no data: not a real backend.
    plugins = [
        name
        for name in dist.Backend.backend_list
        if name not in checks and name not in (dist.Backend.UNDEFINED, "fake")
    ]
    return (*built, *plugins)


def unavailable_reason(kind: str) -> str | None:
    """What is missing for device ``kind`` (``cuda``, ``gpu``, ``mps``, ...), or None if usable.

    Cheap and free of side effects, except that for ``cuda`` without a device it asks torch why
    (``torch.cuda.init()`` fails with the driver's reason), and for ``hpu`` it imports
    ``habana_frameworks`` when installed. For ``xla``/``neuron`` it checks the packages only.
    """
    name, _ = _parse(kind)
    if name == "auto":
        return None
    try:
        _check_available(name)
    except DeviceUnavailableError as exc:
        return exc.missing
    return None


def _parse(kind: str) -> tuple[str, int | None]:
    if not isinstance(kind, str):
        raise ConfigurationError(
            f"device kind must be a string such as 'auto', 'cpu' or 'gpu', got {kind!r}."
        )
    name, _, index_text = kind.strip().lower().partition(":")
    name = _ALIASES.get(name, name)
    if name not in _KINDS and name != "auto":
        close = difflib.get_close_matches(name, DEVICE_KINDS, n=1)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigurationError(
            f"unknown device kind {kind!r}{suggestion}; expected one of "
            f"{', '.join(DEVICE_KINDS)}. HINT: 'gpu' and 'cuda' both mean NVIDIA GPUs; 'auto' "
            "picks for you."
        )
    if not index_text:
        return name, None
    if not index_text.isdigit() or name == "auto":
        raise ConfigurationError(
            f"device {kind!r} has a malformed index; expected e.g. 'cuda:1'. HINT: drop the "
            "index to let unidist use the local rank."
        )
    return name, int(index_text)


def _check_available(name: str, asked: str | None = None) -> None:
    checks = {
        "cpu": lambda: None,
        "cuda": _cuda_problem,
        "mps": _mps_problem,
        "xla": lambda: _module_problem(("torch_xla",), "pip install 'torch_xla[tpu]'"),
        "neuron": lambda: _module_problem(
            ("torch_neuronx", "torch_xla"), "install the AWS Neuron SDK (torch-neuronx)"
        ),
        "hpu": _hpu_problem,
        "xpu": _xpu_problem,
    }
    missing = checks[name]()
    if missing is not None:
        raise DeviceUnavailableError(
            f"device {asked or name!r} is not available: {missing}. It needs "
            f"{_KINDS[name].needs}. "
            "HINT: run where that runtime is installed, or use device('cpu') or "
            "device('auto').",
            kind=name,
            missing=missing,
        )


def _cuda_problem() -> str | None:
    import torch

    if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        return f"this torch build ({torch.__version__}) has no CUDA support"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return None
    build = f"torch {torch.__version__} is built for CUDA {torch.version.cuda}"
    # torch.cuda.init() fails with the real reason (no driver, no visible device, ...), but
    # first exports CUDA_MODULE_LOADING=LAZY: put the environment back as it was.
    saved = _env.snapshot(("CUDA_MODULE_LOADING",))
    try:
        torch.cuda.init()  # type: ignore[no-untyped-call]
    except Exception as exc:  # torch raises RuntimeError or AssertionError depending on cause
        reason = str(exc).split(". ")[0].strip().rstrip(".")
        return f"{build}, but CUDA cannot start: {reason}"
    finally:
        _env.restore(saved)
    return f"{build}, but it sees no CUDA device (torch.cuda.device_count() == 0)"


def _mps_problem() -> str | None:
    import torch

    if torch.backends.mps.is_available():
        return None
    if not torch.backends.mps.is_built():
        return f"this torch build ({torch.__version__}) has no MPS support (macOS builds only)"
    return "torch is built with MPS, but no Metal device is usable (macOS < 12.3, or no GPU)"


def _module_problem(modules: tuple[str, ...], install: str) -> str | None:
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    if absent:
        verb = "is" if len(absent) == 1 else "are"
        return f"{' and '.join(absent)} {verb} not installed ({install})"
    return None


def _hpu_problem() -> str | None:
    missing = _module_problem(("habana_frameworks",), "install Intel Gaudi's SynapseAI software")
    if missing is not None:
        return missing
    importlib.import_module("habana_frameworks.torch.core")  # registers torch.hpu
    import torch

    hpu = getattr(torch, "hpu", None)
    if hpu is None or not hpu.is_available():
        return "habana_frameworks is installed, but no Gaudi device is visible"
    return None


def _xpu_problem() -> str | None:
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu._is_compiled():
        return f"this torch build ({torch.__version__}) has no XPU support"
    if not xpu.is_available():
        return "torch is built with XPU support, but no XPU device is visible"
    return None


def local_cuda_device(local_rank: int) -> torch.device:
    """Make the local rank's GPU current and return it (``local_rank % device_count``).

    The modulo keeps one visible GPU per task working (``srun --gpus-per-task``, ignite#3259).
    """
    import torch

    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _cuda_device(index: int | None) -> torch.device:
    import torch

    count = torch.cuda.device_count()
    if index is None:
        return local_cuda_device(_state.effective_reading().require("local_rank"))
    if index >= count:
        raise ConfigurationError(
            f"device 'cuda:{index}' does not exist: torch sees {count} CUDA device(s) "
            f"(cuda:0..cuda:{count - 1}). HINT: drop the index to use the local rank's GPU, or "
            "check CUDA_VISIBLE_DEVICES."
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _xla_device(name: str) -> torch.device:
    try:
        xla_model = importlib.import_module("torch_xla.core.xla_model")
        found: torch.device = xla_model.xla_device()
    except Exception as exc:  # torch_xla raises RuntimeError subclasses of its own
        raise DeviceUnavailableError(
            f"device {name!r}: torch_xla is installed but found no device: {exc}. HINT: "
            f"{_KINDS[name].needs}.",
            kind=name,
            missing=str(exc),
        ) from exc
    return found
