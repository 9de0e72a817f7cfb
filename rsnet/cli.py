"""Shared behaviour of the command-line scripts."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from rsnet.data.errors import CorruptImageError
from rsnet.files import DiskFullError, check_writable_dir

# Errors caused by the user's input or files: one line, exit status 2.
USER_ERRORS = (ValueError, FileNotFoundError, CorruptImageError)


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun`` in the right number: "1 epoch", "12 epochs" (``noun`` is the singular)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors caused by the user's input into one clear line and exit status 2 (no traceback); a full
    disk into one line naming the file and exit status 1; Ctrl-C into one line and exit status 130."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"interrupted: {Path(sys.argv[0]).name} stopped before it finished; no file it writes is left "
              "half-written", file=sys.stderr)
        sys.exit(130)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except MissingMandatoryValue as error:  # a "???" setting of the command's config left out
        print(f"error: {error.full_key}=... is required ({Path(sys.argv[0]).name} --help lists every setting)",
              file=sys.stderr)
        sys.exit(2)
    except DiskFullError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


def check_renamed_setting(argv: Sequence[str], old: str, new: str) -> None:
    """Refuse ``old=...`` on the command line, which Hydra would misread (e.g. as a config group), naming ``new``."""
    for argument in argv:
        if argument.lstrip("+~").split("=", 1)[0] == old:
            raise ValueError(f"{argument}: this command takes {new}=... ({old}= is a training config group here)")


# Hydra's flags that take the next argument as their value (--cfg job, --config-dir DIR, ...)
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def check_no_bare_words(argv: Sequence[str], key: str) -> None:
    """Refuse a bare word (no ``=``, not a ``-`` flag), which Hydra cannot parse, showing it as ``key=<word>``."""
    words = [argument for previous, argument in zip(["", *argv], argv) if "=" not in argument
             and not argument.startswith("-") and previous not in HYDRA_VALUE_FLAGS]
    if words:
        suggestion = words[0] if len(words) == 1 else f"[{','.join(words)}]"
        raise ValueError(f"{' '.join(words)}: settings are key=value; did you mean {key}={suggestion}?")


class RunDirCheck(Callback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): refuse a run dir that cannot be written, in one
    line, before Hydra creates it and sets up its log file there (which would fail with a traceback)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with user_errors():
            check_writable_dir(Path(config.hydra.run.dir), "hydra.run.dir")
