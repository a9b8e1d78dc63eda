"""A lazy, name-keyed table of adapters, with install hints and an entry-point group.

Built-in adapters are listed as ``"module:Class"`` strings, so ``import unidist`` imports neither
Composer nor Ignite; whether a framework is installed is answered with ``importlib.util.find_spec``
(no import). Third-party packages register adapters through the entry-point group
``unidist.adapters``::

    [project.entry-points."unidist.adapters"]
    horovod = "unidist_horovod:HorovodAdapter"

or at run time with :func:`register`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from unidist.adapters.base import Adapter
from unidist.environments import places as environments
from unidist.environments.variables import EnvReading
from unidist.errors import AdapterNotFoundError, AdapterUnavailableError, ConfigurationError

__all__ = [
    "ENTRY_POINT_GROUP",
    "AdapterSpec",
    "available",
    "choose",
    "get",
    "register",
    "specs",
]

ENTRY_POINT_GROUP = "unidist.adapters"


@dataclass(frozen=True)
class AdapterSpec:
    """How to find, check and load one adapter.

    Attributes:
        name: registry name (``adapter="name"``, ``UNIDIST_ADAPTER=name``).
        target: ``"module:Class"`` of the adapter class (imported on first use), or the class.
        requires: top-level module the framework provides, checked without importing it.
        distribution: the PyPI distribution whose version is reported.
        pip_hint: the install line shown when the framework is missing.
        origin: ``"builtin"``, ``"entry point"`` or ``"register()"``.
    """

    name: str
    target: str | type
    requires: str | None = None
    distribution: str | None = None
    pip_hint: str | None = None
    origin: str = "builtin"

    @property
    def installed(self) -> bool:
        """Whether the framework can be imported (found on the path; nothing is imported)."""
        if self.requires is None:
            return True
        try:
            return importlib.util.find_spec(self.requires) is not None
        except ValueError:  # already imported, without a spec (replaced or built in memory)
            return self.requires in sys.modules

    @property
    def version(self) -> str | None:
        """The installed framework version, or None."""
        import importlib.metadata  # lazily: it costs more than the rest of import unidist

        if self.distribution is None or not self.installed:
            return None
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None


_BUILTINS = (
    AdapterSpec(
        "composer",
        "unidist.adapters.composer:ComposerAdapter",
        "composer",
        "mosaicml",
        "pip install 'pytorch-unidist[composer]'",
    ),
    AdapterSpec(
        "ignite",
        "unidist.adapters.ignite:IgniteAdapter",
        "ignite",
        "pytorch-ignite",
        "pip install 'pytorch-unidist[ignite]'",
    ),
    AdapterSpec("serial", "unidist.adapters.serial:SerialAdapter"),
    AdapterSpec(
        "torch", "unidist.adapters.torch:TorchAdapter", "torch", "torch", "pip install torch"
    ),
)
#: Detection asks these first (a framework in use), then third-party adapters, then ``torch``.
_DETECTION_FIRST = ("ignite", "composer")

_lock = threading.Lock()
_specs: dict[str, AdapterSpec] = {}
_instances: dict[str, Adapter] = {}
_loaded_entry_points = False


def _table() -> dict[str, AdapterSpec]:
    global _loaded_entry_points
    with _lock:
        if not _specs:
            _specs.update({spec.name: spec for spec in _BUILTINS})
        if not _loaded_entry_points:
            import importlib.metadata

            _loaded_entry_points = True
            for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                if entry.name in _specs:
                    continue  # built-ins and run-time registrations win over entry points
                dist_name = entry.dist.name if entry.dist is not None else None
                _specs[entry.name] = AdapterSpec(
                    entry.name,
                    entry.value,
                    None,
                    dist_name,
                    f"pip install {dist_name}" if dist_name else None,
                    "entry point",
                )
        return _specs


def specs() -> Mapping[str, AdapterSpec]:
    """Every registered adapter by name (read-only view)."""
    return MappingProxyType(_table())


def available() -> tuple[str, ...]:
    """Names of the adapters whose framework is installed, sorted."""
    return tuple(sorted(name for name, spec in _table().items() if spec.installed))


def register(
    name: str,
    target: str | type,
    *,
    requires: str | None = None,
    distribution: str | None = None,
    pip_hint: str | None = None,
    override: bool = False,
) -> None:
    """Register an adapter under ``name``.

    Args:
        name: the registry name.
        target: the adapter class, or ``"module:Class"`` to import it lazily.
        requires: top-level module the adapter needs (checked before loading).
        distribution: distribution name for version reports.
        pip_hint: install line for the error shown when ``requires`` is missing.
        override: replace an existing registration of the same name.

    Raises:
        ConfigurationError: ``name`` is taken and ``override`` is False.
    """
    table = _table()
    if name in table and not override:
        raise ConfigurationError(
            f"an adapter named {name!r} is already registered ({table[name].target}). "
            "HINT: pass override=True to replace it, or choose another name."
        )
    _instances.pop(name, None)
    table[name] = AdapterSpec(name, target, requires, distribution, pip_hint, "register()")


def get(name: str) -> Adapter:
    """The adapter instance registered as ``name`` (one per process), importing it on first use.

    Raises:
        AdapterNotFoundError: no adapter has that name.
        AdapterUnavailableError: its framework is not installed; the message has the pip line.
    """
    instance = _instances.get(name)
    if instance is not None:
        return instance
    table = _table()
    spec = table.get(name)
    if spec is None:
        raise AdapterNotFoundError(
            f"no adapter named {name!r}; registered adapters: {', '.join(sorted(table))}. "
            "HINT: check the spelling, or install the package that provides it."
        )
    if not spec.installed:
        raise AdapterUnavailableError(
            f"the {name!r} adapter needs the {spec.requires!r} package, which is not installed. "
            f"HINT: {spec.pip_hint}",
            pip_hint=spec.pip_hint or f"pip install {spec.requires}",
        )
    cls = spec.target if isinstance(spec.target, type) else _load(spec)
    target = spec.target if isinstance(spec.target, str) else spec.target.__qualname__
    instance = _checked(cls(), target)
    _know_environment(instance)
    _instances[name] = instance
    return instance


#: The members of :class:`Adapter`, in the order a refusal names the missing ones.
_MEMBERS = (
    "name",
    "environment",
    "detect",
    "initialize",
    "finalize",
    "topology",
    "all_reduce",
    "all_gather",
    "broadcast",
    "barrier",
    "new_group",
)


def _checked(candidate: object, what: str) -> Adapter:
    """``candidate`` itself when it has every member of :class:`Adapter`.

    Args:
        candidate: the adapter object.
        what: where it came from, for messages (``"examples.mine:MyAdapter"``).

    Raises:
        ConfigurationError: a member is missing; the message names each one.
    """
    if isinstance(candidate, Adapter):
        return candidate
    missing = [name for name in _MEMBERS if not hasattr(candidate, name)]
    hint = "run unidist.testing.check_adapter on it"
    if missing == ["environment"]:
        hint = (
            "give it `environment = None` (unidist's environments read its launcher's "
            "variables), or the Environment of the place it runs, registered under the "
            f"entry-point group {environments.ENTRY_POINT_GROUP!r}"
        )
    raise ConfigurationError(
        f"{what} does not implement the adapter contract (unidist.adapters.base.Adapter): it "
        f"has no {', '.join(missing)}. HINT: {hint}."
    )


def _know_environment(adapter: Adapter) -> None:
    """Let unidist's environment chooser ask a third-party adapter's environment (after the
    torch variables, before SLURM and MPI), unless an environment of its type is known."""
    place = adapter.environment
    if place is None or isinstance(place, environments.BUILT_IN):  # always asked
        return
    known = environments.environments()
    if not any(type(other) is type(place) for other in known):
        environments.register(place)


def _load(spec: AdapterSpec) -> type:
    module_name, _, class_name = str(spec.target).partition(":")
    try:
        cls: type = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        hint = spec.pip_hint or "reinstall the package that provides it"
        raise AdapterUnavailableError(
            f"the {spec.name!r} adapter ({spec.target}) could not be loaded: {exc}. HINT: {hint}",
            pip_hint=hint,
        ) from exc
    return cls


def choose(
    explicit: str | Adapter | None, from_env: str | None, env: EnvReading
) -> tuple[Adapter, str]:
    """Pick the adapter: explicit argument > ``UNIDIST_ADAPTER`` > detection > ``torch``.

    Returns:
        The adapter and a sentence saying why it was chosen.
    """
    if explicit is not None and not isinstance(explicit, str):
        chosen = _checked(explicit, f"the object {explicit!r}")
        _know_environment(chosen)
        return chosen, "passed as an object"
    if explicit is not None:
        return get(explicit), f"adapter={explicit!r} was passed"
    if from_env is not None:
        return get(from_env), f"UNIDIST_ADAPTER={from_env}"
    table = _table()
    order = [*_DETECTION_FIRST, *(n for n in table if table[n].origin != "builtin")]
    for name in order:
        spec = table.get(name)
        if spec is None or not spec.installed:
            continue
        adapter = get(name)
        reason = adapter.detect(env)
        if reason:
            return adapter, f"detected: {reason}"
    return get("torch"), "no framework detected; plain torch.distributed is the default"


def _reset() -> None:
    """Forget instances and run-time registrations (tests only)."""
    global _loaded_entry_points
    with _lock:
        _specs.clear()
        _instances.clear()
        _loaded_entry_points = False
