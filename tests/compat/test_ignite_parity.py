"""unidist.compat.ignite against the installed Ignite: the same calls, the same outcomes.

Every case of tests/compat/_cases.py runs through ``ignite.distributed`` and through the shim,
on the same inputs, in one process (Ignite's serial model) and on two gloo ranks; results,
their types, warnings and error types must match, except the rows the migration page marks
as deliberate (``IGNITE_DELIBERATE``). Where unidist refuses an input, its error is also of
Ignite's type (``IGNITE_BOTH_TYPES``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.compat import _cases
from unidist._base.workarounds import GLOO_TEARDOWN_DEADLOCK
from unidist.testing import run_distributed

pytestmark = pytest.mark.ignite

PAIRS = [(1, name) for name in {**_cases.IGNITE, **_cases.IGNITE_ONE_PROCESS}] + [
    (2, name) for name in _cases.IGNITE
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """Each world size's per-rank outcomes, run once for the module."""
    runs = {}
    for world in (1, 2):
        workdir = str(tmp_path_factory.mktemp(f"ignite{world}"))
        runs[world] = run_distributed(
            _cases.run_ignite, workdir, world_size=world, init=False, timeout=180
        )
    return runs


@pytest.mark.parametrize(("world", "name"), PAIRS, ids=[f"{w}-{n}" for w, n in PAIRS])
def test_the_shim_does_what_ignite_does(
    outcomes: dict[int, list[dict[str, Any]]], world: int, name: str
) -> None:
    _cases.assert_same(outcomes[world], name, _cases.IGNITE_DELIBERATE)


def test_deliberate_differences_are_real_differences(
    outcomes: dict[int, list[dict[str, Any]]],
) -> None:
    for name in _cases.IGNITE_DELIBERATE:
        owner, shim = outcomes[1][0][name]
        assert owner != shim, f"{name}: the shim now does what Ignite does; drop it from the list"


@pytest.mark.parametrize("name", _cases.IGNITE_BOTH_TYPES)
def test_a_refusal_is_unidists_error_and_of_ignites_type(
    outcomes: dict[int, list[dict[str, Any]]], name: str
) -> None:
    # A ported script's `except RuntimeError` (TypeError, ...) catches it, and so does
    # `except unidist.ConfigurationError`.
    _cases.assert_both_types(outcomes[2], name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.multiprocess
def test_parallel_spawns_the_same_processes_as_ignites(tmp_path: Path) -> None:
    import ignite.distributed as owner

    import unidist.compat.ignite as shim

    modules = {"shim": shim}
    if not GLOO_TEARDOWN_DEADLOCK.present():
        # Ignite's workers end with destroy_process_group(), which can deadlock in gloo on
        # the torch versions with that bug (bench/launch saw Ignite's Parallel hang there).
        modules["owner"] = owner
    seen = {}
    for label, module in modules.items():
        out = tmp_path / label
        out.mkdir()
        with module.Parallel(
            backend="gloo", nproc_per_node=2, master_port=_free_port()
        ) as parallel:
            parallel.run(_cases.report_rank, str(out), scale=3)
        reports = [json.loads(p.read_text()) for p in out.glob("*.json")]
        seen[label] = sorted(reports, key=lambda report: report["rank"])
    expected = [
        {"local_rank": rank, "rank": rank, "world": 2, "backend": "gloo", "sum": 9}
        for rank in (0, 1)
    ]
    assert seen["shim"] == expected
    assert seen.get("owner", expected) == expected
