"""MkDocs hook: the command-line reference, written from the ``unidist`` argparse parsers.

docs/reference/cli.md holds the marker ``<!-- cli-reference -->``; at build time it becomes the
help of ``unidist`` and of each subcommand, so the page can never disagree with the parsers.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

MARKER = "<!-- cli-reference -->"


def cli_reference() -> str:
    """Markdown: one section per command with its ``--help`` text."""
    from unidist.cli import _parser

    parser = _parser()
    sections = [("unidist", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sections += [(f"unidist {name}", sub) for name, sub in action.choices.items()]
    parts = []
    for title, sub in sections:
        # argparse wraps to the terminal's width: fix it, so the page is the same everywhere.
        sub.formatter_class = functools.partial(sub.formatter_class, width=100)  # type: ignore[assignment]
        parts.append(f"## `{title}`\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
