"""Mistakes on the command line in one line, before Hydra: a misspelt key gets the closest key, an unknown group option
the valid ones, an unparsable override is named (ValueError: exit status 2 through :func:`rsnet.cli.user_errors`)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.errors import (ConfigCompositionException, HydraException, MissingConfigException,
                          OverrideParseException)
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, ValidationError

from rsnet.commands import CHECKOUT_CONF, conf_folder, config_groups
from rsnet.config_schema import SCHEMA_SUFFIX, TRAIN_CONFIG, register_schemas, type_error

# Hydra's flags that change what is composed: the command line is then left to Hydra
HYDRA_CONFIG_FLAGS = ("-cn", "-cp", "--config-name", "--config-path")
CONFIG_DIR_FLAGS = ("-cd", "--config-dir")  # composed with, as a search path
MULTIRUN_FLAGS = ("-m", "--multirun")
HELP_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i")  # no job runs: a value may be missing


def check_overrides(config_name: str, argv: Sequence[str], command: str) -> None:
    """Compose ``conf/<config_name>.yaml`` with the ``key=value`` arguments of ``argv`` as Hydra will (a sweep:
    with each of its values); a composition error becomes one ValueError naming the override and what is valid."""
    flags = {arg.split("=", 1)[0] for arg in argv}
    if flags & set(HYDRA_CONFIG_FLAGS):
        return
    if config_name == TRAIN_CONFIG:
        register_schemas()  # its defaults list names them (rsnet-train registers them too, before Hydra composes)
    overrides = [arg for arg in argv if "=" in arg and not arg.startswith("-")  # Hydra's own settings left out,
                 and (not arg.lstrip("+~").startswith(("hydra.", "hydra/")) or arg.startswith("hydra.searchpath="))]
    config_dir = _config_dir(argv)
    if config_dir is not None:
        if any(arg.startswith("hydra.searchpath=") for arg in overrides):
            return  # both: left to Hydra
        overrides.append(f"hydra.searchpath=[file://{Path(config_dir).resolve()}]")
    try:
        for composition in _sweep_jobs(overrides) if flags & set(MULTIRUN_FLAGS) else [overrides]:
            composed = _compose(config_name, composition)
            if not flags & set(HELP_FLAGS):
                _check_groups_complete(composed, config_name, command)
    except MissingConfigException as error:
        group, _, option = str(error.missing_cfg_file or "").rpartition("/")
        choices = ", ".join(sorted(option for option in error.options or [] if not option.endswith(SCHEMA_SUFFIX)))
        timm_name = f", or set backbone.name={option} (any timm CNN: docs/models.md)" if group == "backbone" else ""
        raise ValueError(f"{group}={option}: there is no such {group}; choose one of {choices}{timm_name}") from None
    except OverrideParseException as error:
        raise ValueError(f"cannot read the override {_parsed(error, overrides)!r}: {str(error).splitlines()[0]} "
                         "(key=value; a list: key=[a,b]; quote values with spaces)") from None
    except ConfigCompositionException as error:
        if isinstance(error.__cause__, ValidationError):  # a value the schema's type refuses (rsnet/config_schema.py)
            raise ValueError(type_error(error.__cause__)) from None
        if not isinstance(error.__cause__, (ConfigAttributeError, ConfigKeyError)):
            return  # Hydra reports what this does not recognise
        raise ValueError(_unknown_key(config_name, overrides, str(error.__cause__.full_key), command)) from None


def _config_dir(argv: Sequence[str]) -> str | None:
    """The folder of ``--config-dir DIR`` / ``-cd DIR`` / ``--config-dir=DIR`` (None without one)."""
    for previous, argument in zip(["", *argv], argv):
        if previous in CONFIG_DIR_FLAGS:
            return argument
        flag, _, value = argument.partition("=")
        if flag in CONFIG_DIR_FLAGS and value:
            return value
    return None


def _check_groups_complete(composed: DictConfig, config_name: str, command: str) -> None:
    """Refuse a group option that leaves a key of its schema without a value (a yaml of the user's own that does
    not start from the shared keys), naming the key, before Hydra fails on it with several lines."""
    for group in config_groups(config_name):
        node = composed.get(group)
        if not isinstance(node, DictConfig):
            continue
        try:
            OmegaConf.to_container(node, throw_on_missing=True)
        except MissingMandatoryValue as error:
            key = error.full_key
            raise ValueError(f"{key}=... is required: the chosen {group} yaml does not set it (the shipped ones take "
                             f"the shared keys from conf/_base/ through their defaults list); add it there or pass "
                             f"{key}=... ({Path(command).name} --help lists every setting)") from None


def _sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Overrides without sweeps that give every value of every swept key once (``seed=0,1 lr=0.1,abc``: the
    jobs seed=0 lr=0.1, seed=1 lr=0.1, seed=0 lr=abc): a value a type refuses is found before any job runs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    values = [list(item.sweep_string_iterator()) if item.is_sweep_override() else [item.input_line]
              for item in parsed]
    keyed = [[value if not item.is_sweep_override() else f"{item.get_key_element()}={value}" for value in choices]
             for item, choices in zip(parsed, values)]
    first = [choices[0] for choices in keyed]
    return [first] + [first[:index] + [value] + first[index + 1:]
                      for index, choices in enumerate(keyed) for value in choices[1:]]


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
    chosen = [o for o in overrides  # the group options (and where they are found): where the key lives
              if o.split("=", 1)[0] in groups or o.startswith("hydra.searchpath=")]
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
