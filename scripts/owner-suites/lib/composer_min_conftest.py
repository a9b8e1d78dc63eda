# Harness-side stand-in for Composer's tests/conftest.py + tests/fixtures, used ONLY when
# Composer itself is not importable (e.g. a venv with just torch + unidist, to run the
# shim copy of test_dist.py). It keeps what test_dist.py relies on from Composer's
# conftest: the world_size(N) marker filter against $WORLD_SIZE, a process group set up
# once per session when WORLD_SIZE > 1 (Composer's configure_dist, gloo on CPU),
# chdir to tmp_path, and an empty "mlruns" folder in tmp_path.
import os

import pytest
import torch.distributed as tdist


def pytest_configure(config):
    config.addinivalue_line("markers", "world_size(val): number of ranks the test needs")


def pytest_collection_modifyitems(config, items):
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    keep, drop = [], []
    for item in items:
        m = item.get_closest_marker("world_size")
        (keep if (m.args[0] if m else 1) == ws else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 5:
        session.exitstatus = 0


@pytest.fixture(autouse=True, scope="session")
def configure_dist():
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        yield
        return
    if not tdist.is_initialized():
        tdist.init_process_group("gloo")
    tdist.barrier()
    yield


@pytest.fixture(autouse=True)
def chdir_to_tmp_path(tmp_path):
    os.chdir(tmp_path)


@pytest.fixture(autouse=True)
def setup_mlflow_tracking(tmp_path):
    os.makedirs(str(tmp_path / "mlruns"), exist_ok=True)
