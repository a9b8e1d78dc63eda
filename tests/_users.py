"""Another local user, for the tests that play one (the ``otheruser`` marker): uid 65534, reached
through ``setpriv`` in a child, and folders that user can reach."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: The other user (``nobody`` on most systems).
NOBODY = 65534


def as_user(uid: int = NOBODY) -> list[str]:
    """The start of a command line that runs the rest as ``uid`` (its group too, no others)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


@contextlib.contextmanager
def reachable_folder(prefix: str) -> Iterator[Path]:
    """A new folder in /tmp that the other user can reach (pytest's own are private to root),
    removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
