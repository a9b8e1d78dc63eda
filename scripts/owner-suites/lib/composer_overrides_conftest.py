# Harness-side conftest, placed at tests/utils/conftest.py next to Composer's test_dist.py.
# Composer's autouse fixture `setup_mlflow_tracking` starts with pytest.importorskip('mlflow'),
# so without mlflow installed every Composer test is skipped. test_dist.py only depends on
# its side effect (an empty "mlruns" folder in tmp_path: test_busy_wait_for_local_rank_zero
# asserts os.listdir(tmp_path) == ['mlruns']). This same-name fixture overrides it with that
# side effect only. It is used only when mlflow is not importable.
import os

import pytest


@pytest.fixture(autouse=True)
def setup_mlflow_tracking(tmp_path):
    os.makedirs(str(tmp_path / "mlruns"), exist_ok=True)
