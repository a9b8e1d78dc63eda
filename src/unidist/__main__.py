"""``python -m unidist``: the same as the ``unidist`` command."""

from __future__ import annotations

from unidist.cli import run

if __name__ == "__main__":
    run()
