"""pytest entry point for launcher-started ranks (composer -n N / torchrun).

Each rank writes its own JUnit file: argv[1] is a path containing "{rank}".
Usage: <launcher> rank_pytest.py JUNIT_PATTERN [pytest args...]
"""

import os
import sys

import pytest

if __name__ == "__main__":
    pattern, args = sys.argv[1], sys.argv[2:]
    rank = os.environ.get("RANK", "0")
    sys.exit(pytest.main([f"--junitxml={pattern.format(rank=rank)}", *args]))
