"""Hygiene for every test (a clean launcher environment, no leaked variables or process groups)
and the one way a test states a need: the markers ``composer``, ``ignite``, ``gpu``, ``netns``
and ``otheruser``.

A marked test is skipped, with a reason that says what is missing and how to get it, when its
need is not met; nothing else may skip a test for a missing package. ``--allow-skips composer,gpu``
(scripts/test passes it) makes any other skip fail the run, so an environment cannot quietly
test less than it claims to.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from typing import Any

import pytest

from unidist.adapters import registry
from unidist.session import lifecycle, state as _state

#: Variables that would make the test process look like a rank of some job.
_LAUNCHER_VARIABLE = re.compile(
    r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|GROUP_WORLD_SIZE|"
    r"ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_\w+|SLURM_\w+|OMPI_\w+|"
    r"PMI_\w+|MPI_LOCAL\w+|MV2_\w+|UNIDIST_\w+|PET_\w+)$"
)
#: Variables torch itself sets while tests run (not a test's leak): newer releases set the
#: inductor cache folder when it first compiles and the elastic signal list when an agent runs.
_SET_BY_TORCH = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TORCHELASTIC_SIGNALS_TO_HANDLE"})

# torch 2.7 starts a pool of inductor compile workers (a process per core, 2 s of CPU each)
# the first time torch._inductor is imported, as torch.compile(model) does before any call;
# torch 2.14 starts none until it compiles. No test runs a compiled model (unwrap_model's tests
# only wrap one), so neither the suite's processes nor their children start the pool.
os.environ.setdefault("TORCH_WARM_POOL", "0")


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _netns_missing() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "not root on Linux"
    for tool in ("ip", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"no {tool} command"
    # Root in a container may still lack CAP_SYS_ADMIN: try (a namespace nobody else sees).
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, timeout=10
    )
    return None if probe.returncode == 0 else "unshare --net fails here"


def _otheruser_missing() -> str | None:
    """Why this process cannot run a child as another local user (uid 65534), or None."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "not root on Linux"
    return None if shutil.which("setpriv") else "no setpriv command (util-linux)"


#: marker -> (is the need met?, the skip reason when it is not)
_NEEDS = {
    "composer": (
        lambda: find_spec("composer") is not None,
        "needs mosaicml, which this environment does not have (it pins torch<2.7.1): "
        "pip install 'pytorch-unidist[composer]'",
    ),
    "ignite": (
        lambda: find_spec("ignite") is not None,
        "needs pytorch-ignite: pip install 'pytorch-unidist[ignite]'",
    ),
    "gpu": (lambda: _cuda_devices() > 0, "needs a CUDA device (found none)"),
    "netns": (
        lambda: _netns_missing() is None,
        "needs network namespaces for hosts of its own: run the tests as root on Linux with "
        "iproute2 (ip netns) and util-linux (unshare)",
    ),
    "otheruser": (
        lambda: _otheruser_missing() is None,
        "plays another local user (uid 65534 through setpriv): run the tests as root on Linux "
        "with util-linux",
    ),
}
#: The user property that names the need a marker's skip stands for. A report carries its
#: item's user properties to the process that tallies skips (pytest-xdist's controller, which
#: has no items), so the check works with and without workers.
_SKIPPED_FOR = "unidist-skipped-for"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--allow-skips",
        default=None,
        metavar="MARKERS",
        help="comma-separated markers (composer, ignite, gpu) whose tests may skip for a missing "
        "need; any other skip fails the run",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    met: dict[str, bool] = {}
    for item in items:
        for marker, (check, reason) in _NEEDS.items():
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in met:
                met[marker] = check()
            if not met[marker]:
                item.add_marker(pytest.mark.skip(reason=reason))
                item.user_properties.append((_SKIPPED_FOR, marker))
                break


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SkipTally(config), "unidist-skip-tally")


class _SkipTally:
    """Counts the skips ``--allow-skips`` does not allow, from the reports of every test."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        allowed = _allowed(self.config)
        if allowed is not None and dict(report.user_properties).get(_SKIPPED_FOR) not in allowed:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            text = str(reason).removeprefix("Skipped: ")
            _unexpected_skips(self.config).append(f"{report.nodeid}: {text}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped (pytest.importorskip, say): never a marker's skip
        _UNEXPECTED_AT_COLLECTION.append(f"{report.nodeid}: {report.longrepr}")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skips = _unexpected_skips(config)
    if skips:
        terminalreporter.section("skips that --allow-skips does not allow", red=True)
        for line in skips:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected_skips(session.config) and exitstatus == 0:
        session.exitstatus = 1


def _allowed(config: pytest.Config) -> set[str] | None:
    option = config.getoption("--allow-skips")
    return None if option is None else {name for name in option.split(",") if name}


_UNEXPECTED_AT_COLLECTION: list[str] = []
_UNEXPECTED = pytest.StashKey[list[str]]()


def _unexpected_skips(config: pytest.Config) -> list[str]:
    if _allowed(config) is None:
        return []
    found = config.stash.setdefault(_UNEXPECTED, [])
    found.extend(_UNEXPECTED_AT_COLLECTION)
    _UNEXPECTED_AT_COLLECTION.clear()
    return found


@pytest.fixture(autouse=True)
def clean_distributed_state() -> Iterator[None]:
    """Strip launcher variables and reset unidist; afterwards fail on leaked variables or groups.

    Deliberately not built on ``monkeypatch``: a test's own ``monkeypatch`` is undone before this
    fixture's teardown, so whatever is still changed here leaked past it.
    """
    original = dict(os.environ)
    for name in list(os.environ):
        if _LAUNCHER_VARIABLE.match(name):
            del os.environ[name]
    before = dict(os.environ)
    _state.reset()
    registry._reset()
    yield
    lifecycle.finalize()
    dist = sys.modules.get("torch.distributed")
    leaked_group = dist is not None and dist.is_initialized()
    if leaked_group:
        dist.destroy_process_group()
    _state.reset()
    registry._reset()
    changed = sorted(
        name
        for name in set(before) | set(os.environ)
        if before.get(name) != os.environ.get(name)
        and name != "PYTEST_CURRENT_TEST"
        and name not in _SET_BY_TORCH
    )
    os.environ.clear()
    os.environ.update(original)
    assert not leaked_group, "the test left a torch process group behind"
    assert not changed, f"the test changed environment variables without monkeypatch: {changed}"
