"""Errors and warnings raised by the data layer."""

from __future__ import annotations

import os
from typing import Sequence

__all__ = ["DatasetNotFoundError", "DatasetValidationError", "CorruptImageError", "SplitMismatchError",
           "DatasetCountWarning", "CorruptImageWarning", "HighBitDepthWarning"]

_LISTED = 10  # files named in a CorruptImageError message; the rest are counted


class DatasetNotFoundError(FileNotFoundError):
    """The dataset root is missing, empty, or holds none of the expected class folders."""


class DatasetValidationError(ValueError):
    """The class folders do not match the dataset's class list (missing, unexpected or empty)."""


class SplitMismatchError(DatasetValidationError):
    """A saved split lists files or classes that the dataset on disk does not have."""


class CorruptImageError(OSError):
    """Image file(s) that could not be decoded, in one line: ``path`` is the first of ``paths``, ``reason`` why it
    failed; ``switch`` is the override that skips such files, as the user types it for the command at hand."""

    def __init__(self, paths: str | os.PathLike | Sequence[str], cause: BaseException | str | None = None,
                 switch: str = "dataset.skip_corrupt=true") -> None:
        self.switch = switch
        self.paths = [str(paths)] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]
        self.path = self.paths[0]
        self.cause = cause if isinstance(cause, BaseException) else None
        self.reason = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else cause
        super().__init__(self._message())

    def _message(self) -> str:
        reason = f": {self.reason}" if self.reason else ""
        if len(self.paths) == 1:
            return (f"cannot decode image '{self.path}'{reason} "
                    f"(re-extract the archive, delete the file, or pass {self.switch} to skip it)")
        listed = ", ".join(f"'{p}'" for p in self.paths[:_LISTED])
        more = f" ... and {len(self.paths) - _LISTED} more" if len(self.paths) > _LISTED else ""
        first = f" (first{reason})" if reason else ""
        return (f"cannot decode {len(self.paths)} images{first}: {listed}{more} "
                f"(re-extract the archive, delete the files, or pass {self.switch} to skip them)")

    def __reduce__(self):  # keep picklable across processes
        return (type(self), (self.paths, self.reason, self.switch))


class DatasetCountWarning(UserWarning):
    """A class folder holds a different number of images than the official archive."""


class CorruptImageWarning(UserWarning):
    """Some images could not be decoded and were skipped (``skip_corrupt=True``)."""


class HighBitDepthWarning(UserWarning):
    """Some images had 16-bit or float pixels and were rescaled to 8 bit (``dataset.high_bit_depth``)."""
