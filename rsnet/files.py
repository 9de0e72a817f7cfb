"""Writing files so that nothing is lost: atomic replacement, and one clear message when the disk is full."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class DiskFullError(OSError):
    """No space was left on the device while writing ``path``; the file's previous version (if any) is intact."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        super().__init__(errno.ENOSPC, f"no space left on device while writing {self.path}; free space on that "
                                       "file system or write elsewhere (its previous version, if any, is intact)")

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.path,))


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", errors: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it replaces ``path`` in one step, on failure it is removed; a
    full disk raises :class:`DiskFullError`. ``errors``: a text mode's encoding error handler."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = _create_beside(path)
    try:
        with disk_full_named(path):
            with os.fdopen(fd, mode, errors=errors) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, document: Any, **dumps: Any) -> None:
    """Write ``document`` as JSON at ``path`` atomically (:func:`atomic_write`); ``dumps``: json.dumps's options."""
    with atomic_write(path, "w") as handle:
        handle.write(json.dumps(document, **dumps))


@contextmanager
def disk_full_named(path: str | os.PathLike) -> Iterator[None]:
    """Inside, an error caused by a full disk (however a library wrapped it: TensorBoard's writer thread, torch's
    serializer) becomes :class:`DiskFullError` naming ``path`` (e.g. the run folder)."""
    try:
        yield
    except DiskFullError:
        raise
    except BaseException as error:
        if disk_was_full(error):
            raise DiskFullError(path) from error
        raise


def disk_was_full(error: BaseException) -> bool:
    """True when ``error``, or an error it was raised from or while handling, is ENOSPC (as torch.save's)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


TEMPORARY_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")  # what _create_beside names a file being written


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files of :func:`atomic_write` below ``folder`` (a writer killed mid-write, SIGKILL or a
    power cut, leaves one); return them. Only for a folder no live process writes in (a run dir its lock holds)."""
    stale = sorted(path for path in Path(folder).rglob(".*.tmp") if TEMPORARY_NAME.fullmatch(path.name)
                   and path.is_file())
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _create_beside(path: Path) -> tuple[int, str]:
    """A new, uniquely named temporary file in ``path``'s folder, open for writing, with the mode an ordinary file
    gets (0o666 less the user's umask; ``tempfile.mkstemp`` would make it 0o600, unreadable to colleagues)."""
    for _ in range(100):
        tmp_name = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp_name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")


PATH_ROOM = 160  # bytes rsnet's own paths add below a folder it writes in (checkpoints/.last.pt.<hex>.tmp,
# tensorboard/events.out.tfevents.<time>.<host>.<pid>.<n>, <stem>_confusion.png, ...)


def check_path_room(folder: str | os.PathLike, setting: str) -> None:
    """ValueError naming ``setting`` when ``folder``'s absolute path leaves less than :data:`PATH_ROOM` bytes of
    its file system's longest path for the files written in it (checked before anything is created)."""
    absolute = os.path.abspath(folder)
    existing = next((Path(parent) for parent in (absolute, *Path(absolute).parents) if Path(parent).exists()), None)
    try:
        limit = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError, TypeError):  # no pathconf (Windows), or the limit is unknown
        return
    length = len(os.fsencode(absolute))
    if length + PATH_ROOM > limit:
        raise ValueError(f"{setting}={folder} is {length} bytes long as an absolute path, and the files written in "
                         f"it need up to {PATH_ROOM} bytes more, past the file system's limit of {limit}: choose a "
                         "shorter folder")


def check_writable_dir(folder: str | os.PathLike, setting: str) -> Path:
    """Create ``folder`` if needed and make sure a file can be created in it; ValueError naming ``setting``
    otherwise (read-only, a file in the way, no permission, a path too long for the files written in it), before
    any work that would be lost."""
    folder = Path(folder)
    check_path_room(folder, setting)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise DiskFullError(folder) from error
        raise ValueError(f"{setting}={folder} cannot be written ({error.strerror or error}): choose a folder "
                         "you can write to") from error
    return folder
