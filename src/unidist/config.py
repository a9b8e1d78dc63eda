"""``unidist config`` and :func:`unidist.show_config`: what unidist sees, starting nothing."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from unidist import _env, _state, devices, lifecycle
from unidist.adapters import registry
from unidist.errors import UnidistError

__all__ = ["describe", "format_config", "show_config"]


def describe() -> dict[str, Any]:
    """Launcher, topology, chosen adapter and why, installed adapters, backends, as a dict.

    Starts no process group and imports no framework.
    """
    settings = _env.read_settings()
    info: dict[str, Any] = {"unidist": _version(), "python": sys.version.split()[0]}
    try:
        reading = _state.view() if _state.current() else _env.read()
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
    info["initialized"] = lifecycle.is_initialized()
    return info


def _version() -> str:
    from unidist._version import __version__

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
    lines.append(f"  backends      {', '.join(info['backends']) or 'none'}")
    lines.append(f"  initialized   {info['initialized']}")
    return "\n".join(lines) + "\n"
