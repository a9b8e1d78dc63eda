"""How the launcher prints what a user or another program chose: paths, ids, names.

A folder name may hold a newline or an escape sequence (``ESC ]0;title BEL`` retitles the
terminal, others move the cursor or hide text); printed raw, it would rewrite the report it is
part of. :func:`shown` prints such a value escaped, and every other value as it is;
:func:`escaped` escapes the non-printable characters of a text inside a line of its own.
"""

from __future__ import annotations

__all__ = ["escaped", "shown"]


def shown(value: object) -> str:
    """``value`` as text, escaped and quoted (Python's repr) if it has a non-printable character.

    >>> shown("/tmp/logs/rank0.log")
    '/tmp/logs/rank0.log'
    >>> shown("/tmp/\\x1b]0;x\\x07/rank0.log")
    "'/tmp/\\\\x1b]0;x\\\\x07/rank0.log'"
    """
    text = str(value)
    return text if text.isprintable() else repr(text)


def escaped(text: str) -> str:
    """``text`` with each non-printable character as its Python escape, the rest as it is.

    >>> escaped("rank 1 at /tmp/\x1b[2J.py:5")
    'rank 1 at /tmp/\\x1b[2J.py:5'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
