"""Errors and warnings raised by the data layer."""

from __future__ import annotations

__all__ = [
    "DatasetNotFoundError",
    "DatasetValidationError",
    "CorruptImageError",
    "SplitMismatchError",
    "DatasetCountWarning",
    "CorruptImageWarning",
]


class DatasetNotFoundError(FileNotFoundError):
    """The dataset root is missing, empty, or holds none of the expected class folders."""


class DatasetValidationError(ValueError):
    """The class folders do not match the dataset's class list (missing, unexpected or empty)."""


class SplitMismatchError(DatasetValidationError):
    """A saved split lists files or classes that the dataset on disk does not have."""


class CorruptImageError(OSError):
    """An image file could not be decoded. ``path`` names the file."""

    def __init__(self, path: str, cause: BaseException | None = None) -> None:
        self.path = str(path)
        self.cause = cause
        reason = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(
            f"cannot decode image '{self.path}'{reason} "
            "(re-extract the archive, delete the file, or set dataset.skip_corrupt=true to skip it)"
        )

    def __reduce__(self):  # keep picklable across processes
        return (type(self), (self.path, None))


class DatasetCountWarning(UserWarning):
    """A class folder holds a different number of images than the official archive."""


class CorruptImageWarning(UserWarning):
    """Some images could not be decoded and were skipped (``skip_corrupt=True``)."""
