"""``import unidist`` imports no framework (not even torch) and changes no environment variable."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, os, sys
before = dict(os.environ)
import unidist
frameworks = {"torch", "composer", "ignite", "numpy"}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in frameworks)
print(json.dumps({"heavy": heavy, "env_changed": dict(os.environ) != before}))
"""


def test_import_unidist_is_light_and_pure() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result == {"heavy": [], "env_changed": False}


def test_getters_need_no_torch() -> None:
    probe = (
        "import sys, unidist; unidist.get_rank(); unidist.topology(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
