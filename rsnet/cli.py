"""Shared behaviour of the command-line scripts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rsnet.data.errors import CorruptImageError
from rsnet.files import DiskFullError

# Errors caused by the user's input or files: one line, exit status 2.
USER_ERRORS = (ValueError, FileNotFoundError, CorruptImageError)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors caused by the user's input into one clear line and exit status 2 (no traceback); a full
    disk into one line naming the file and exit status 1."""
    try:
        yield
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except DiskFullError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
