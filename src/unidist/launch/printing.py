"""How the launcher prints what a user or another program chose: paths, ids, names.

A folder name may hold a newline or an escape sequence (``ESC ]0;title BEL`` retitles the
terminal, others move the cursor or hide text); printed raw, it would rewrite the report it is
part of. :func:`shown` prints such a value escaped, and every other value as it is.
"""

from __future__ import annotations

__all__ = ["shown"]


def shown(value: object) -> str:
    """``value`` as text, escaped and quoted (Python's repr) if it has a non-printable character.

    >>> shown("/tmp/logs/rank0.log")
    '/tmp/logs/rank0.log'
    >>> shown("/tmp/\\x1b]0;x\\x07/rank0.log")
    "'/tmp/\\\\x1b]0;x\\\\x07/rank0.log'"
    """
    text = str(value)
    return text if text.isprintable() else repr(text)
