"""Checkpoints in an object store: a real S3 API (moto's server, as s3fs's own tests use).

The server runs on a free port in this process; ranks and launchers reach it through
``AWS_ENDPOINT_URL``. Credentials are a distinctive fake secret, which must never appear in any
output, log, record or error (every test greps for it)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import unidist
from tests._waiting import wait_for
from unidist.errors import CheckpointError
from unidist.resume._remote import redact
from unidist.testing import DistributedTestError, run_distributed

ROOT = Path(__file__).resolve().parents[2]
SECRET = "unidist-test-secret-4fa9c1"
sys.path.insert(0, str(ROOT / "tests"))
from test_resume import (  # noqa: E402
    _committed,
    _each_once,
    _parts,
    _train,
    _weights,
)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """One server for the whole session of this process (of each xdist worker), never a second:
    fsspec keeps one S3 filesystem per set of options, and the endpoint comes from
    ``AWS_ENDPOINT_URL`` rather than the options, so a server started again on another port (a
    module-scoped fixture does, when a worker comes back to this module after another one) left
    ``Remote`` talking to the stopped one (EndpointConnectionError in a run on 40a2b10)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A new bucket, and the variables that reach it (as a user sets them)."""
    import s3fs

    env = {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "unidist-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    unique = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]  # parametrized too
    name = "b" + request.node.name.lower().replace("_", "-")[:34].strip("-") + unique
    name += str(os.getpid())
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
    return name


def _latest(bucket: str, run: str = "run") -> dict[str, Any]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    return json.loads(fs.cat_file(f"{bucket}/{run}/latest.json"))  # type: ignore[no-any-return]


def _objects(bucket: str) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    return sorted(str(p) for p in fs.find(bucket))


def test_a_crash_resumes_from_s3_bit_for_bit(bucket: str, tmp_path: Path) -> None:
    reference = _parts(str(tmp_path / "ref"))
    _train(reference, 2)
    url = f"s3://{bucket}/run"
    first = _parts(url, save_every=5)
    rows = _committed(_train(first, 2, stop_after=18), 15)
    second = _parts(url, save_every=5)
    assert second["state"].restore()
    assert second["state"].resumed_from == 15
    rows += _train(second, 2)
    _each_once(rows, 2)
    assert _weights(second["model"]) == _weights(reference["model"])
    assert _latest(bucket)["step"] == 20
    steps = {p.split("/")[2] for p in _objects(bucket) if "/step-" in p}
    assert steps == {"step-000000015", "step-000000020"}  # keep=2: 5 and 10 were removed


def _save_on_two(url: str, steps: int) -> list[float]:
    parts = _parts(url, world=2)
    rows = _train(parts, 2, stop_after=steps)
    parts["state"].save()
    return [*rows, _weights(parts["model"])]  # type: ignore[list-item]


@pytest.mark.multiprocess
def test_two_ranks_save_to_s3_and_one_resumes_every_sample_once(bucket: str) -> None:
    url = f"s3://{bucket}/run"
    saved = run_distributed(_save_on_two, url, 7, timeout=120)
    weights = [r.pop() for r in saved]
    parts = _parts(url)
    parts["state"].restore()
    assert (parts["state"].epoch, parts["state"].steps) == (0, 7)
    assert _weights(parts["model"]) == weights[0]
    _each_once(saved[0] + saved[1] + _train(parts, 2), 2)


def _killed_mid_upload(url: str) -> None:
    """Save step 3, then die on rank 1 while step 6's files are being written."""
    from torch.distributed.checkpoint import _fsspec_filesystem

    parts = _parts(url, world=2, save_every=3)
    original = _fsspec_filesystem.FsspecWriter.write_data

    def write_then_die(self: Any, plan: Any, planner: Any) -> Any:
        if unidist.get_rank() == 1 and parts["state"].steps == 6:
            stream = self.fs.create_stream(self.path / "__1_0.distcp", "wb")
            stream.__enter__().write(b"half a file")  # an upload cut short
            os._exit(9)
        return original(self, plan, planner)

    _fsspec_filesystem.FsspecWriter.write_data = write_then_die  # type: ignore[method-assign]
    _train(parts, 2)


@pytest.mark.multiprocess
def test_a_rank_killed_mid_upload_leaves_the_previous_checkpoint_in_force(bucket: str) -> None:
    url = f"s3://{bucket}/run"
    with pytest.raises(DistributedTestError):
        run_distributed(_killed_mid_upload, url, timeout=120)
    assert _latest(bucket)["step"] == 3
    parts = _parts(url)
    assert parts["state"].restore()
    assert parts["state"].steps == 3  # the partial step 6 never counted ...
    assert not any("step-000000006" in p for p in _objects(bucket))  # ... and was removed


def test_the_example_resumes_from_s3_under_unidist_launch(bucket: str, tmp_path: Path) -> None:
    # examples/elastic.py --checkpoint s3://bucket/run, as a user runs it with AWS_ENDPOINT_URL
    # set: stopped by SIGTERM mid-run (2 ranks), then run to the end; every sample once.
    record = tmp_path / "record"
    record.mkdir()
    example = [str(ROOT / "examples" / "elastic.py"), "--checkpoint", f"s3://{bucket}/run"]
    example += ["--record", str(record), "--samples", "240", "--epochs", "2", "--workers", "0"]
    launch = [sys.executable, "-m", "unidist", "launch", "-n", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    first = subprocess.Popen(
        [*launch, "--log-dir", str(tmp_path / "a"), *example, "--step-delay", "0.05"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def lines() -> int:
            return sum(len(p.read_text().splitlines()) for p in record.glob("reads-*.jsonl"))

        wait_for(lambda: lines() >= 20, 120, "10 steps")
        first.send_signal(signal.SIGTERM)
        out1, err1 = first.communicate(timeout=120)
    finally:
        first.kill()
        first.communicate(timeout=30)
    saved = _latest(bucket)["step"]
    assert saved >= 10, err1[-3000:]
    second = subprocess.run(
        [*launch, "--log-dir", str(tmp_path / "b"), *example],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    reads = [
        json.loads(x) for p in record.glob("reads-*.jsonl") for x in p.read_text().splitlines()
    ]
    kept = [x for x in reads if x["resumed_from"] != 0 or x["step"] <= saved]
    for epoch in range(2):
        counts: dict[int, int] = {}
        for x in kept:
            if x["epoch"] == epoch:
                for i in x["ids"]:
                    counts[i] = counts.get(i, 0) + 1
        assert sorted(counts) == list(range(240)), epoch
        assert set(counts.values()) == {1}, epoch
    everything = out1 + err1 + second.stdout + second.stderr
    everything += "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET not in everything


def test_credentials_never_appear_in_an_error(bucket: str, tmp_path: Path) -> None:
    # An endpoint where nothing answers, the secret given as a storage option: the error says
    # what failed, without it.
    options = {
        "key": "unidist-test-key",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
        "retries": 1,
    }
    state = unidist.ResumableState(
        f"s3://{bucket}/run",
        job="j",
        model=torch.nn.Linear(2, 1),
        stop_signals=(),
        storage_options=options,
    )
    with pytest.raises(CheckpointError) as failed:
        state.save()
    assert "failed" in str(failed.value) or "cannot" in str(failed.value)
    assert SECRET not in str(failed.value)
    signed = f"https://host/b/k?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}&part=2"
    shown = redact(f"failed: {signed} and s3://user:{SECRET}@bucket/run", (SECRET,))
    assert SECRET not in shown
    assert "X-Amz-Signature=***" in shown
    assert "part=2" in shown
    assert "s3://user:***@bucket/run" in shown


def test_a_missing_driver_names_the_install(tmp_path: Path) -> None:
    state = unidist.ResumableState("nosuchproto://b/run", job="j", stop_signals=())
    with pytest.raises(CheckpointError, match=r"driver is not installed|cannot be reached"):
        state.restore()


@pytest.mark.parametrize(
    ("userinfo", "secret"),
    [
        ("url-key-id:{s}", "url-secret-71c3e0"),
        ("{s}", "url-secret-71c3e0"),  # a token as the user part
        ("url-key-id:{s}", "urlsecret/71c3e0+x"),  # an S3 secret key often holds / and +
    ],
)
def test_a_secret_in_the_url_never_appears_in_an_error(
    bucket: str, userinfo: str, secret: str
) -> None:
    # s3://KEY:SECRET@bucket/run: the driver's own message quotes the bucket part, secret and
    # all ('Invalid bucket name "KEY:SECRET@bucket"'), without the scheme that marks a URL.
    # The secret is not the environment's: nothing else would hide it.
    url = f"s3://{userinfo.format(s=secret)}@{bucket}/run"
    state = unidist.ResumableState(url, job="j", stop_signals=())
    with pytest.raises(CheckpointError) as failed:
        state.restore()
    text = str(failed.value) + str(state.root)
    assert "***" in text  # what was there is shown as hidden
    assert secret not in text, text
    assert not [part for part in secret.split("/") if part in text], text
    assert failed.value.__cause__ is None  # nor in a chained exception's text


@pytest.fixture
def silent_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a hung proxy, a black hole)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = False

    def accept() -> None:
        while not stop:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)  # held open, never read or answered

    import threading

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    for name, value in {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "unidist-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    yield url
    stop = True
    server.close()
    for conn in accepted:
        conn.close()


def test_an_object_store_that_never_answers_costs_the_timeout_not_a_hang(
    silent_endpoint: str,
) -> None:
    state = unidist.ResumableState(
        "s3://silent-bucket/run",
        job="j",
        stop_signals=(),
        timeout=3,
        # Options of its own: fsspec reuses one S3 filesystem per set of options, and another
        # test's would still reach that test's server.
        storage_options={"client_kwargs": {"endpoint_url": silent_endpoint}},
    )
    started = time.monotonic()
    with pytest.raises(CheckpointError) as failed:
        state.restore()
    elapsed = time.monotonic() - started
    assert elapsed < 60, elapsed  # botocore's own retries and timeouts: minutes
    message = str(failed.value)
    assert "did not answer within 3 s" in message, message
    assert "timeout=" in message  # the fix: how to wait longer
    assert SECRET not in message
