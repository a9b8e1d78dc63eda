"""The conformance suite passes for every built-in adapter and catches broken ones."""

from __future__ import annotations

import pytest

from unidist.testing import CLAUSES, ConformanceError, check_adapter

pytestmark = pytest.mark.multiprocess

ADAPTERS = [
    pytest.param("torch", id="torch"),
    pytest.param("composer", id="composer", marks=pytest.mark.composer),
    pytest.param("ignite", id="ignite", marks=pytest.mark.ignite),
]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_builtin_adapter_passes_every_clause(adapter: str) -> None:
    report = check_adapter(adapter, world_size=2)
    assert set(report) == set(CLAUSES)
    assert all(message is None for ranks in report.values() for message in ranks.values())


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_builtin_adapter_passes_with_three_ranks(adapter: str) -> None:
    check_adapter(adapter, world_size=3, clauses=["all_gather", "groups", "one_rank_first"])


def test_serial_adapter_passes_alone() -> None:
    check_adapter("serial", world_size=1)


def test_a_class_can_be_checked_by_import_path() -> None:
    check_adapter("unidist.adapters.torch:TorchAdapter", clauses=["primitives", "objects"])


@pytest.mark.parametrize(
    ("target", "clause", "symptom"),
    [
        ("tests.adapters.broken:ReversedGatherAdapter", "all_gather", "ranks [1, 0] in that"),
        (
            "tests.adapters.broken:ReversedGatherAdapter",
            "primitives",
            "all_gather must return the tensors in rank order",
        ),
        ("tests.adapters.broken:FloatBroadcastAdapter", "broadcast_tensors", "int64 broadcast"),
    ],
)
def test_a_broken_adapter_fails_the_clause_it_breaks(
    target: str, clause: str, symptom: str
) -> None:
    with pytest.raises(ConformanceError) as caught:
        check_adapter(target)
    assert clause in caught.value.report
    assert symptom in str(caught.value)


def test_unknown_clause_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown conformance clauses"):
        check_adapter("torch", clauses=["nope"])
