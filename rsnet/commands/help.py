"""``--help`` of every rsnet command, written from the command's own config file.

Each command's config (``conf/<name>.yaml``) sets ``hydra.help.template: ${rsnet_help:<name>}``; this resolver
renders the file's leading comment (what the command does, how to call it), the config groups its ``defaults``
list composes with their options, and its own settings with their comments. So a command's help lists exactly the
keys it reads (rsnet-evaluate does not list the training groups it ignores) and cannot drift from its config.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from rsnet.commands import conf_folder, config_groups

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


def command_help(config_name: str) -> str:
    """The help text of the command whose config is ``conf/<config_name>.yaml``."""
    text = conf_folder().joinpath(f"{config_name}.yaml").read_text()
    lines = text.splitlines()
    sections = ["\n".join(_header(lines))]
    groups = _groups(config_name)
    if groups:
        sections.append("== Config groups (group=option; a group's keys: group.key=value) ==\n" + "\n".join(groups))
    sections.append("== Settings (key=value) ==\n" + "\n".join(_settings(lines)))
    sections.append(FOOTER)
    # Hydra fills the template with string.Template: a literal "$" (as in ${...} values) must be doubled
    return ("\n\n".join(sections) + "\n").replace("$", "$$")


def register_help_resolver() -> None:
    """Make ``${rsnet_help:<config name>}`` available to the configs (idempotent)."""
    OmegaConf.register_new_resolver(RESOLVER, command_help, replace=True)
