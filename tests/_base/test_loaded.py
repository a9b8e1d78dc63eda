"""``unidist._base.loaded``: isinstance tests that import nothing, and the FSDP imports they
spare."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
from torch import nn

from unidist._base.loaded import loaded_classes


class Wrapper(nn.Module):
    pass


def test_a_module_not_imported_has_no_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "unidist_not_imported", raising=False)
    assert loaded_classes("unidist_not_imported", "Anything") == ()
    assert not isinstance(nn.Linear(1, 1), loaded_classes("unidist_not_imported", "Anything"))
    assert "unidist_not_imported" not in sys.modules  # asking imported nothing


def test_an_imported_module_gives_its_classes_and_skips_what_it_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("unidist_fake_wrappers")
    module.Wrapper = Wrapper  # type: ignore[attr-defined]
    module.NOT_A_CLASS = 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "unidist_fake_wrappers", module)
    found = loaded_classes("unidist_fake_wrappers", "Missing", "Wrapper", "NOT_A_CLASS")
    assert found == (Wrapper,)
    assert isinstance(Wrapper(), found)


#: In a fresh interpreter (this one has imported FSDP for other tests): a plain model through
#: auto_model, a MicroBatcher and unwrap_model leaves torch.distributed.fsdp unimported; a model
#: sharded by FSDP2 (its class made as fully_shard makes it) is still refused by both.
_FRESH = """
import json, sys
import torch
from torch import nn
import unidist
model = unidist.auto_model(nn.Linear(2, 2))
unidist.MicroBatcher(model)
unidist.unwrap_model(model)
out = {"fsdp_imported": "torch.distributed.fsdp" in sys.modules}
from torch.distributed.fsdp import FSDPModule
sharded = nn.Linear(2, 2)
sharded.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
for name, call in [("auto_model", unidist.auto_model), ("MicroBatcher", unidist.MicroBatcher)]:
    try:
        call(sharded if name == "auto_model" else nn.Sequential(sharded))
        out[name] = "accepted"
    except unidist.ConfigurationError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.multiprocess
def test_a_plain_model_imports_no_fsdp_and_a_sharded_one_is_still_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["fsdp_imported"] is False, out
    assert "does not support FSDP" in out["MicroBatcher"], out
    assert "already wrapped (FSDPLinear)" in out["auto_model"], out
