"""unidist.compat.composer against the installed Composer: the same calls, the same outcomes.

Every case of tests/compat/_cases.py runs through ``composer.utils.dist`` and through the
shim, on the same inputs, in one process and on two gloo ranks (first before the process
group exists, then with it); results, their types, warnings and error types must match,
except the rows the migration page marks as deliberate (``COMPOSER_DELIBERATE``). Where unidist
refuses an input, its error is also of Composer's type (``COMPOSER_BOTH_TYPES``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat import _cases
from unidist.testing import run_distributed

pytestmark = pytest.mark.composer

NAMES = [*_cases.COMPOSER_UNINITIALIZED, *_cases.COMPOSER]
PAIRS = [(world, name) for world in (1, 2) for name in NAMES] + [
    (1, name) for name in _cases.COMPOSER_ONE_PROCESS
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """Each world size's per-rank outcomes, run once for the module."""
    runs = {}
    for world in (1, 2):
        workdir = str(tmp_path_factory.mktemp(f"composer{world}"))
        runs[world] = run_distributed(
            _cases.run_composer, workdir, world_size=world, init=False, timeout=180
        )
    return runs


@pytest.mark.parametrize(("world", "name"), PAIRS, ids=[f"{w}-{n}" for w, n in PAIRS])
def test_the_shim_does_what_composer_does(
    outcomes: dict[int, list[dict[str, Any]]], world: int, name: str
) -> None:
    _cases.assert_same(outcomes[world], name, _cases.COMPOSER_DELIBERATE)


def test_deliberate_differences_are_real_differences(
    outcomes: dict[int, list[dict[str, Any]]],
) -> None:
    for name in _cases.COMPOSER_DELIBERATE:
        owner, shim = outcomes[2][0][name]
        assert owner != shim, f"{name}: the shim now does what Composer does; drop it from the list"


@pytest.mark.parametrize("name", _cases.COMPOSER_BOTH_TYPES)
def test_a_refusal_is_unidists_error_and_of_composers_type(
    outcomes: dict[int, list[dict[str, Any]]], name: str
) -> None:
    # A ported script's `except RuntimeError` (TypeError, ...) catches it, and so does
    # `except unidist.ConfigurationError`.
    _cases.assert_both_types(outcomes[2], name)


def test_an_unpicklable_object_is_refused_with_pickles_type(
    outcomes: dict[int, list[dict[str, Any]]],
) -> None:
    _cases.assert_both_types(outcomes[1], "broadcast_object_list/unpicklable")
