"""Shared behaviour of the command-line scripts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors caused by the user's input into one clear line and exit status 2 (no traceback)."""
    try:
        yield
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
