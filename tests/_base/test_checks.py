"""unidist._base.checks: one wording for every argument check, whoever asks (the Python API, the
launcher's options, unidist's environment variables)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from unidist._base import checks as _checks
from unidist.environments import parse as reading, variables as _env
from unidist.errors import ConfigurationError
from unidist.launch.plan import checks as launch_checks


@pytest.mark.parametrize(
    ("value", "expected"), [(2, 2.0), (0.5, 0.5), (timedelta(minutes=2), 120.0)]
)
def test_seconds_come_back_as_a_float(value: object, expected: float) -> None:
    assert _checks.check_seconds(value) == expected


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "30", None])
def test_a_timeout_argument_must_be_positive_and_finite(value: object) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _checks.check_seconds(value)
    assert str(caught.value) == (
        f"timeout must be a positive number of seconds or a timedelta, got {value!r}."
    )


def test_zero_minimum_maximum_and_the_hint_are_said_in_the_one_wording() -> None:
    assert _checks.check_seconds(0, "wait", zero="waits for ever") == 0.0
    assert _checks.check_seconds(_checks.YEAR, "wait", maximum=_checks.YEAR) == _checks.YEAR
    with pytest.raises(ConfigurationError) as caught:
        _checks.check_seconds(
            0.0001,
            "--poll",
            timedelta_ok=False,
            zero="turns it off",
            minimum=0.001,
            maximum=_checks.YEAR,
            hint="e.g. --poll 0.1.",
        )
    assert str(caught.value) == (
        "--poll must be a number of seconds of at least 0.001 and at most 31536000 (a year), "
        "or 0 (turns it off), got 0.0001. HINT: e.g. --poll 0.1."
    )
    year = r"at most 31536000 \(a year\) or a timedelta, got 31536001\.$"
    with pytest.raises(ConfigurationError, match=year):
        _checks.check_seconds(_checks.YEAR + 1, "wait", maximum=_checks.YEAR)
    # Without timedelta_ok a timedelta is refused, not read.
    with pytest.raises(ConfigurationError, match=r"got datetime\.timedelta"):
        _checks.check_seconds(timedelta(seconds=1), "--wait", timedelta_ok=False)


def test_ints_in_a_closed_range() -> None:
    assert _checks.check_int(65535, "port", minimum=0, maximum=65535) == 65535
    with pytest.raises(ConfigurationError, match=r"^port must be from 0 to 65535, got 65536\.$"):
        _checks.check_int(65536, "port", minimum=0, maximum=65535)
    with pytest.raises(ConfigurationError, match=r"^n must be at most 3, got 4\.$"):
        _checks.check_int(4, "n", maximum=3)
    with pytest.raises(ConfigurationError, match=r"^n must be at least 1, got 0\.$"):
        _checks.check_int(0, "n", minimum=1)


def test_the_launchers_options_and_the_variables_use_the_same_wording() -> None:
    with pytest.raises(ConfigurationError) as caught:
        launch_checks.check_option_seconds(
            -1.0, "--exit-timeout", zero="waits for ever", example="600"
        )
    assert str(caught.value) == (
        "--exit-timeout must be a positive number of seconds and at most 31536000 (a year), "
        "or 0 (waits for ever), got -1.0. HINT: e.g. --exit-timeout 600; --exit-timeout 0 "
        "waits for ever."
    )
    with pytest.raises(ConfigurationError, match=r"^UNIDIST_TIMEOUT must be a positive number "):
        _env.read_settings({"UNIDIST_TIMEOUT": "-3"})
    # inf was let through here and failed later, in timedelta(seconds=inf); timeout= refuses it.
    with pytest.raises(ConfigurationError, match="got inf"):
        _env.read_settings({"UNIDIST_TIMEOUT": "inf"})
    with pytest.raises(ConfigurationError) as caught:
        reading.worker_start_timeout({"UNIDIST_WORKER_START_TIMEOUT": "soon"})
    assert str(caught.value).startswith(
        "UNIDIST_WORKER_START_TIMEOUT must be a positive number of seconds, or 0 (waits as long "
        "as torch does: for ever), got 'soon'. HINT: "
    )
    assert reading.worker_start_timeout({"UNIDIST_WORKER_START_TIMEOUT": "0"}) is None
    assert reading.worker_start_timeout({"UNIDIST_WORKER_START_TIMEOUT": "2.5"}) == 2.5


def _square(x: float) -> float:
    return x * x


@pytest.mark.parametrize("timeout", [math.nan, -1.0, timedelta(0), 10.0 * _checks.YEAR])
def test_spawn_refuses_a_timeout_before_it_starts_a_process(timeout: object) -> None:
    import unidist

    with pytest.raises(ConfigurationError, match=r"^spawn timeout must be a positive number of "):
        unidist.spawn(_square, 3.0, nproc=1, timeout=timeout)


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"world_size": 0}, r"^world_size must be at least 1, got 0\.$"),
        ({"hang_timeout": -1.0}, r"^hang_timeout must be .*, or 0 \(turns it off\), got -1\.0\."),
        ({"hang_timeout": math.nan}, r"got nan\. HINT: None \(the default\) gives three quarters"),
    ],
)
def test_the_harness_checks_its_arguments_in_the_one_wording(
    keywords: dict[str, object], said: str
) -> None:
    from unidist.testing import run_distributed

    arguments: dict[str, object] = {"world_size": 2, **keywords}
    with pytest.raises(ConfigurationError, match=said):
        run_distributed(_square, 3.0, **arguments)  # type: ignore[arg-type]
