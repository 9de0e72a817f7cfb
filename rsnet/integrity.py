"""Is a file on disk what rsnet wrote? SHA-256 of checkpoints (of their own contents, so one file stays one atomic
write) and of export files, checked on every load; and one plain reason when torch cannot read a weights file."""

from __future__ import annotations

import hashlib
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch

_CHUNK = 1 << 20


def file_digest(path: str | Path) -> str:
    """SHA-256 of the file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_digest(obj: Any) -> str:
    """SHA-256 of nested dicts / lists / tuples of tensors and plain values, independent of where the tensors live
    (CPU, GPU, memory-mapped) and of dict insertion order."""
    digest = hashlib.sha256()
    _feed(digest, obj)
    return digest.hexdigest()


def _feed(digest: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().to("cpu").contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(obj, Mapping):
        digest.update(b"{")
        for key in sorted(obj, key=repr):
            digest.update(repr(key).encode() + b":")
            _feed(digest, obj[key])
        digest.update(b"}")
    elif isinstance(obj, (list, tuple)):
        digest.update(b"(" if isinstance(obj, tuple) else b"[")
        for item in obj:
            _feed(digest, item)
            digest.update(b",")
        digest.update(b")")
    else:
        digest.update(f"{type(obj).__name__}:{obj!r};".encode())


def load_weights(path: str | Path | IO[bytes], map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """``torch.load`` of tensors and plain values only (``weights_only=True``), without torch's warning about a pickle
    protocol other than its own: such a file fails to load, and :func:`unreadable_reason` says why in one line."""
    with without_pickle_protocol_warning():
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


@contextmanager
def without_pickle_protocol_warning() -> Iterator[None]:
    """Silence torch's warning about a pickle protocol other than its own while weights load: such a file fails to
    load, and rsnet says why in one line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        yield


def unreadable_reason(path: str | Path) -> str:
    """Why torch.load could not read ``path``, in words a user can act on (torch's own text suggests
    ``weights_only=False``, which would run code from the file and is never what rsnet does)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return "the file is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return f"the file ({size} bytes) is not in torch.save's format: damaged, cut short, or another kind of file"
    return ("the file is damaged, or holds Python objects other than tensors and plain values (rsnet loads weights "
            "only, never code from a file)")
