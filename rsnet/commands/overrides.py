"""Mistakes on the command line in one line, before Hydra: a misspelt key (``epoch=3``, ``dataset.imagesize=32``)
is answered with the closest key, an unknown group option (``model=foo``) with the valid ones, an override Hydra
cannot parse is named (all ValueError: exit status 2 through :func:`rsnet.cli.user_errors`). Hydra would print
several lines, or a traceback, and exit 1."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.errors import (ConfigCompositionException, HydraException, MissingConfigException,
                          OverrideParseException)
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from rsnet.commands import CHECKOUT_CONF, conf_folder, config_groups

# Hydra's flags that change what is composed, or sweep: the command line is then left to Hydra
HYDRA_MODE_FLAGS = ("-m", "--multirun", "-cn", "-cp", "-cd", "--config-name", "--config-path", "--config-dir")


def check_overrides(config_name: str, argv: Sequence[str], command: str) -> None:
    """Compose ``conf/<config_name>.yaml`` with the ``key=value`` arguments of ``argv`` as Hydra will, and turn a
    composition error into one ValueError naming the override and what is valid (``command --help`` for more)."""
    if any(arg.split("=", 1)[0] in HYDRA_MODE_FLAGS for arg in argv):
        return
    overrides = [arg for arg in argv if "=" in arg and not arg.startswith("-")
                 and not arg.lstrip("+~").startswith(("hydra.", "hydra/"))]
    try:
        _compose(config_name, overrides)
    except MissingConfigException as error:
        group, _, option = str(error.missing_cfg_file or "").rpartition("/")
        choices = ", ".join(sorted(error.options or []))
        raise ValueError(f"{group}={option}: there is no such {group}; choose one of {choices}") from None
    except OverrideParseException as error:
        raise ValueError(f"cannot read the override {_parsed(error, overrides)!r}: {str(error).splitlines()[0]} "
                         "(key=value; a list: key=[a,b]; quote values with spaces)") from None
    except ConfigCompositionException as error:
        if not isinstance(error.__cause__, (ConfigAttributeError, ConfigKeyError)):
            return  # Hydra reports what this does not recognise
        raise ValueError(_unknown_key(config_name, overrides, str(error.__cause__.full_key), command)) from None


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    """The command's config with ``overrides``, composed as ``@hydra.main`` composes it (the package rsnet.conf,
    else the checkout's conf/)."""
    if conf_folder() is CHECKOUT_CONF:
        with initialize_config_dir(str(CHECKOUT_CONF), version_base="1.3"):
            return compose(config_name, overrides=overrides)
    with initialize_config_module("rsnet.conf", version_base="1.3"):
        return compose(config_name, overrides=overrides)


def _unknown_key(config_name: str, overrides: list[str], full_key: str, command: str) -> str:
    """The message for an override of a key the config does not have: the closest keys at its level."""
    parent, _, key = full_key.rpartition(".")
    groups = config_groups(config_name)
    chosen = [o for o in overrides if o.split("=", 1)[0] in groups]  # the group options: where the key lives
    node = _compose(config_name, chosen)
    if parent:
        node = OmegaConf.select(node, parent)
    known = [str(k) for k in node] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(key, known, 1)
    given = next((o for o in overrides if f"{o.split('=', 1)[0]}.".startswith(f"{full_key}.")), full_key)
    where = f"in {parent} " if parent else ""
    return (f"{given}: there is no setting {key!r} {where}"
            + (f"(did you mean {(parent + '.' if parent else '') + close[0]!r}?)" if close else
               f"(settings here: {', '.join(known)})")
            + f"; {Path(command).name} --help lists every setting")


def _parsed(error: OverrideParseException, overrides: list[str]) -> str:
    """The override Hydra could not parse (its message does not say which)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException:
            return override
    return str(error.override or "")
