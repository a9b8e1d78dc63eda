"""``python -m unidist``: the same as the ``unidist`` command."""

from __future__ import annotations

import sys

from unidist.cli import main

if __name__ == "__main__":
    sys.exit(main())
