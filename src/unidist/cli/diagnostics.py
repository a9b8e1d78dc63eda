"""What unidist sees here, starting nothing: ``unidist config`` and ``unidist probe``.

* :func:`describe` / :func:`show_config` (``unidist config``): launcher, topology, the adapter
  unidist would choose and why, installed adapters, backends.
* :func:`probe` / :func:`show_probe` (``unidist probe``): the same, plus the torch build, the
  NVIDIA driver, devices and their memory, usable backends and the device unidist would use.

Both are safe checks before a launch: they start no training and no process group, write no
environment variable, and import no framework (adapters are reported from package metadata).
:func:`probe` does ask CUDA for device properties, which initialises CUDA in the calling process
when a GPU is present (run it before forking DataLoader workers, or use the command line).
"""

from __future__ import annotations

import ctypes
import json
import platform
import sys
from pathlib import Path
from typing import Any, TextIO

from unidist.adapters import registry
from unidist.environments import variables as _env
from unidist.errors import UnidistError
from unidist.session import devices, lifecycle, state as _state

__all__ = ["describe", "format_config", "format_probe", "probe", "show_config", "show_probe"]

_DRIVER_FILE = Path("/proc/driver/nvidia/version")


# -- unidist config ----------------------------------------------------------------------------


def describe() -> dict[str, Any]:
    """Launcher, topology, chosen adapter and why, installed adapters, backends, as a dict.

    ``backends`` are those built into torch; ``unusable_backends`` maps the ones whose devices
    are missing here (``nccl`` without a GPU) to the reason. Starts no process group and imports
    no framework.
    """
    settings = _env.read_settings()
    info: dict[str, Any] = {"unidist": _version(), "python": sys.version.split()[0]}
    try:
        reading = _state.effective_reading() if _state.published() else _env.read()
        info["launcher"] = reading.launcher
        info["topology"] = (
            reading.topology().as_dict()
            if not reading.missing
            else {
                "rank": reading.rank,
                "world_size": reading.world_size,
                "unknown": list(reading.missing),
            }
        )
        info["environment_notes"] = list(reading.notes)
        info["master"] = {"addr": reading.master_addr, "port": reading.master_port}
    except UnidistError as exc:
        info["launcher"] = None
        info["topology_error"] = str(exc)
    try:
        chosen, reason = registry.choose(None, settings.adapter, _env.read())
        info["adapter"] = {"name": chosen.name, "reason": reason}
    except UnidistError as exc:
        info["adapter"] = {"name": None, "reason": str(exc)}
    info["adapters"] = {
        name: {
            "installed": spec.installed,
            "version": spec.version,
            "origin": spec.origin,
            "install": None if spec.installed else spec.pip_hint,
        }
        for name, spec in sorted(registry.specs().items())
    }
    info["torch"] = _torch_version()
    info["backends"] = list(devices.available_backends())
    # nccl is built into every CUDA build of torch; without a GPU it cannot run, and a config
    # that listed it as usable would send users after the wrong problem.
    info["unusable_backends"] = _unusable_backends(info["backends"])
    info["initialized"] = lifecycle.is_initialized()
    return info


def _version() -> str:
    from unidist._base.version import __version__

    return __version__


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def show_config(as_json: bool = False, file: TextIO | None = None) -> dict[str, Any]:
    """Print :func:`describe` as a table (or JSON) and return it."""
    info = describe()
    out = file if file is not None else sys.stdout
    out.write(json.dumps(info, indent=2) + "\n" if as_json else format_config(info))
    return info


def format_config(info: dict[str, Any]) -> str:
    """The human-readable table of :func:`describe`."""
    lines = [f"unidist {info['unidist']} (python {info['python']}, torch {info['torch']})"]
    if info.get("topology_error"):
        lines.append(f"  topology      ERROR: {info['topology_error']}")
    else:
        lines.append(f"  launcher      {info['launcher']}")
        topo = info["topology"]
        lines.append("  topology      " + ", ".join(f"{k}={v}" for k, v in topo.items()))
        master = info["master"]
        if master["addr"] is not None or master["port"] is not None:
            lines.append(f"  master        {master['addr']}:{master['port']}")
        lines.extend(f"    - {note}" for note in info["environment_notes"])
    adapter = info["adapter"]
    lines.append(f"  adapter       {adapter['name']} ({adapter['reason']})")
    lines.append("  adapters")
    for name, spec in info["adapters"].items():
        state = (
            f"{spec['version'] or 'installed'}"
            if spec["installed"]
            else (f"not installed: {spec['install']}")
        )
        lines.append(f"    {name:<11} {state} [{spec['origin']}]")
    lines.append(f"  backends      {_format_backends(info)}")
    lines.append(f"  initialized   {info['initialized']}")
    return "\n".join(lines) + "\n"


# -- unidist probe -----------------------------------------------------------------------------


def probe() -> dict[str, Any]:
    """Everything :command:`unidist probe` prints, as a JSON-ready dict.

    Keys: ``unidist``, ``python``, ``platform``, ``torch`` (version and build), ``cuda``
    (availability, why not, driver, devices with memory), ``mps``, ``devices`` (every kind
    :func:`unidist.device` accepts: available, or what is missing), ``backends`` (built into
    torch) and ``unusable_backends`` (built, but their devices are missing here), ``adapters``
    (installed, version), ``launcher``/``topology``/``master``/``environment_notes`` (or
    ``topology_error``), ``adapter`` (the one unidist would choose, and why), ``pick`` (the
    device and backend unidist would use here) and ``initialized``.
    """
    import torch

    info = describe()  # launcher, topology, adapters, backends: written once there
    info["platform"] = platform.platform()
    info["torch"] = _torch_build(torch)
    info["cuda"] = _cuda(torch)
    info["mps"] = {
        "built": bool(torch.backends.mps.is_built()),
        "available": bool(torch.backends.mps.is_available()),
    }
    info["devices"] = _kinds()
    info["pick"] = _pick(info)
    return info


def show_probe(as_json: bool = False, file: TextIO | None = None) -> dict[str, Any]:
    """Print :func:`probe` as a table (or JSON) and return it."""
    info = probe()
    out = file if file is not None else sys.stdout
    out.write(json.dumps(info, indent=2) + "\n" if as_json else format_probe(info))
    return info


def _torch_build(torch: Any) -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    return {
        "version": str(torch.__version__),
        "git": getattr(torch.version, "git_version", None),
        "debug": bool(torch.version.debug),
        "cuda_built": bool(torch.backends.cuda.is_built()),
        "cuda_version": torch.version.cuda,
        "hip_version": getattr(torch.version, "hip", None),
        "cudnn_version": cudnn.version() if cudnn.is_available() else None,
        "distributed": bool(torch.distributed.is_available()),
    }


def _cuda(torch: Any) -> dict[str, Any]:
    problem = devices.unavailable_reason("cuda")
    found: list[dict[str, Any]] = []
    if problem is None:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            found.append(
                {
                    "index": index,
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 2),
                    "multiprocessors": props.multi_processor_count,
                }
            )
    return {
        "available": problem is None,
        "problem": problem,
        "device_count": len(found),
        "driver": _nvidia_driver(),
        "devices": found,
    }


def _nvidia_driver() -> dict[str, str | None]:
    """The kernel module's version and the CUDA version the driver supports, without CUDA init."""
    module = None
    try:
        first = _DRIVER_FILE.read_text().splitlines()[0]
        words = first.split("Kernel Module")[-1].split()
        module = words[0] if words else None
    except (OSError, IndexError):
        pass
    api = None
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:  # needs no cuInit
            api = f"{version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return {"version": module, "cuda": api}


def _kinds() -> dict[str, dict[str, Any]]:
    report: dict[str, dict[str, Any]] = {}
    for kind in devices.KINDS:
        reason = devices.unavailable_reason(kind)
        report[kind] = {
            "available": reason is None,
            "missing": reason,
            "backend": devices.BACKENDS[kind],
        }
    return report


def _pick(info: dict[str, Any]) -> dict[str, Any]:
    kind = next(k for k in ("cuda", "mps", "cpu") if info["devices"][k]["available"])
    name = kind
    if kind == "cuda":
        local = info.get("topology", {}).get("local_rank")
        count = info["cuda"]["device_count"]
        name = f"cuda:{local % count}" if isinstance(local, int) else "cuda:<local rank>"
    try:
        backend = devices.default_backend(kind)
    except UnidistError as exc:  # pragma: no cover (every auto kind has a backend)
        backend = f"none ({exc})"
    world = info.get("topology", {}).get("world_size", 1)
    return {
        "device": name,
        "kind": kind,
        "backend": backend if world != 1 else None,
        "backend_if_distributed": backend,
        "reason": _why(info),
    }


def _why(info: dict[str, Any]) -> str:
    if info["devices"]["cuda"]["available"]:
        return f"{info['cuda']['device_count']} CUDA device(s) visible"
    if info["mps"]["available"]:
        return "no usable CUDA device; MPS is available"
    return "no usable CUDA device and no MPS"


def _format_backends(info: dict[str, Any]) -> str:
    unusable = info["unusable_backends"]
    shown = [f"{b} (built, unusable here)" if b in unusable else b for b in info["backends"]]
    return ", ".join(shown) or "none"


def _unusable_backends(names: list[str]) -> dict[str, str]:
    """Built-in backends whose devices are missing here (``nccl`` without a GPU), and why."""
    unusable = {}
    for name in names:
        try:
            devices.require_backend(name)
        except UnidistError as exc:
            unusable[name] = str(getattr(exc, "missing", exc))
    return unusable


def format_probe(info: dict[str, Any]) -> str:
    """The human-readable table of :func:`probe`."""
    build = info["torch"]
    lines = [
        f"unidist {info['unidist']} (python {info['python']}, {info['platform']})",
        f"  torch         {build['version']} (CUDA {build['cuda_version'] or 'none'}, cuDNN "
        f"{build['cudnn_version'] or 'none'}, distributed {build['distributed']})",
    ]
    cuda = info["cuda"]
    driver = cuda["driver"]
    driver_text = (
        f"{driver['version'] or '?'} (CUDA {driver['cuda'] or '?'})"
        if driver["version"] or driver["cuda"]
        else "none found"
    )
    lines.append(f"  nvidia driver {driver_text}")
    if cuda["available"]:
        lines.append(f"  cuda          {cuda['device_count']} device(s)")
        lines.extend(
            f"    cuda:{d['index']:<7} {d['name']}, {d['memory_gib']} GiB, sm {d['capability']}"
            for d in cuda["devices"]
        )
    else:
        lines.append(f"  cuda          unavailable: {cuda['problem']}")
    lines.append("  devices")
    for kind, state in info["devices"].items():
        missing = "see cuda above" if kind == "cuda" else state["missing"]
        text = "available" if state["available"] else f"no: {missing}"
        lines.append(f"    {kind:<11} {text} [backend {state['backend']}]")
    lines.append(f"  backends      {_format_backends(info)}")
    lines.append("  adapters")
    for name, spec in info["adapters"].items():
        installed = spec["version"] or "installed"
        state = installed if spec["installed"] else f"not installed: {spec['install']}"
        lines.append(f"    {name:<11} {state}")
    if info.get("topology_error"):
        lines.append(f"  topology      ERROR: {info['topology_error']}")
    else:
        topo = info["topology"]
        lines.append(f"  launcher      {info['launcher']}")
        lines.append("  topology      " + ", ".join(f"{k}={v}" for k, v in topo.items()))
    lines.append(f"  adapter       {info['adapter']['name']} ({info['adapter']['reason']})")
    pick = info["pick"]
    backend = pick["backend"] or f"none in one process ({pick['backend_if_distributed']} if more)"
    lines.append(f"  would use     {pick['device']}, backend {backend}")
    lines.append(f"    - {pick['reason']}")
    return "\n".join(lines) + "\n"
