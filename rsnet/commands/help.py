"""``--help`` of every rsnet command, written from the command's own config file (``hydra.help.template:
${rsnet_help:<name>}``), so it lists exactly the keys the command reads (docs/configuration.md)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from rsnet.commands import conf_folder, config_groups
from rsnet.config_schema import SCHEMA_SUFFIX

RESOLVER = "rsnet_help"
SKIPPED_BLOCKS = ("defaults", "hydra")  # composition and Hydra's own settings: not the command's keys
# What a group left at ``null`` in a command's defaults list means for that command (else: none is composed)
NULL_GROUP_MEANING = {"evaluate": "the run's own"}
FOOTER = ("Every setting is key=value on the command line (a group: group=option). Hydra's own flags work too:\n"
          "--cfg job prints the composed config, --hydra-help lists Hydra's options.")


def _header(lines: list[str]) -> list[str]:
    """The leading comment block, without its ``#``."""
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line[1:].removeprefix(" "))
    return header


def _settings(lines: list[str]) -> list[str]:
    """The config's own lines (keys, nested keys, their comments) outside the skipped top-level blocks."""
    kept, skipping = [], False
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        if not line[0].isspace():  # a top-level key starts (or ends) a skipped block
            skipping = line.split(":", 1)[0].strip() in SKIPPED_BLOCKS
        if not skipping:
            kept.append(line.rstrip())
    return kept


def _groups(config_name: str) -> list[str]:
    """``group: option, option, ...  (default: x)`` for every config group of the command's defaults list."""
    lines = []
    for group, default in config_groups(config_name).items():
        options = sorted(path.name.removesuffix(".yaml") for path in conf_folder().joinpath(group).iterdir()
                         if path.name.endswith(".yaml"))
        chosen = NULL_GROUP_MEANING.get(config_name, "none") if default is None else default
        lines.append(f"{group}: {', '.join(options)}  (default: {chosen})")
    return lines


def _option_settings(path: str) -> list[str]:
    """The settings of ``conf/<path>.yaml`` with their comments, after those of the files its defaults list includes; a
    key the file sets again shows its own line in the inherited key's place."""
    text = conf_folder().joinpath(f"{path}.yaml").read_text()
    defaults = OmegaConf.to_container(OmegaConf.create(text)).get("defaults") or []
    group = path.rsplit("/", 1)[0]
    included = [entry.removesuffix("@_here_") for entry in defaults
                if isinstance(entry, str) and entry != "_self_" and not entry.endswith(SCHEMA_SUFFIX)]
    inherited = [line for base in included
                 for line in _option_settings(base[1:] if base.startswith("/") else f"{group}/{base}")]
    own = _settings(text.splitlines())
    replaced = {_top_level_key(line): line for line in own if _top_level_key(line)}
    merged = [replaced.get(_top_level_key(line), line) for line in inherited]  # a key set again: its own line
    inherited_keys = {_top_level_key(line) for line in inherited} - {None}
    return merged + [line for line in own if _top_level_key(line) not in inherited_keys]


def _top_level_key(line: str) -> str | None:
    """The key a flat ``key: value`` line sets (None for nested or continuation lines)."""
    return line.split(":", 1)[0] if line and not line[0].isspace() and ":" in line else None


def _chosen_groups(config_name: str, choices: dict[str, str | None]) -> list[str]:
    """Every chosen group option's settings, indented under ``group (option):``."""
    blocks = []
    for group in config_groups(config_name):
        option = choices.get(group)
        if option:
            settings = "\n".join(f"  {line}" for line in _option_settings(f"{group}/{option}"))
            preset = conf_folder().joinpath(f"{group}/{option}.yaml").read_text().startswith("# @package _global_")
            blocks.append(f"{group} ({option}): " + ("a preset of top-level keys, it sets" if preset
                                                      else f"{group}.<key>=value") + f"\n{settings}")
    return blocks


def command_help(config_name: str, *, _root_: Any = None) -> str:
    """The help text of the command whose config is ``conf/<config_name>.yaml``; ``_root_`` is the composed
    config OmegaConf passes when Hydra renders the template (the chosen group options)."""
    text = conf_folder().joinpath(f"{config_name}.yaml").read_text()
    lines = text.splitlines()
    sections = ["\n".join(_header(lines))]
    groups = _groups(config_name)
    if groups:
        sections.append("== Config groups (group=option; a group's keys: group.key=value) ==\n" + "\n".join(groups))
        choices = (dict(OmegaConf.to_container(_root_.hydra.runtime.choices)) if _root_ is not None
                   else config_groups(config_name))
        chosen = _chosen_groups(config_name, choices)
        if chosen:
            sections.append("== Settings of the chosen groups (another option, e.g. dataset=aid --help, shows "
                            "its own) ==\n" + "\n\n".join(chosen))
    sections.append("== Settings (key=value) ==\n" + "\n".join(_settings(lines)))
    sections.append(FOOTER)
    # Hydra fills the template with string.Template: a literal "$" (as in ${...} values) must be doubled
    return ("\n\n".join(sections) + "\n").replace("$", "$$")


def register_help_resolver() -> None:
    """Make ``${rsnet_help:<config name>}`` available to the configs (idempotent)."""
    OmegaConf.register_new_resolver(RESOLVER, command_help, replace=True)
