"""The command-line tools (rsnet-train, rsnet-evaluate, rsnet-export, rsnet-predict, rsnet-aggregate); scripts/*.py in a
checkout are thin wrappers that run the same code. Their Hydra configs are the package ``rsnet.conf``."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

if TYPE_CHECKING:
    from importlib.abc import Traversable

CHECKOUT_CONF = Path(__file__).resolve().parents[2] / "conf"


def conf_folder() -> Traversable:
    """The folder of the configs: the package ``rsnet.conf``, else (rsnet on ``PYTHONPATH``, an older editable
    install) the checkout's conf/."""
    try:
        return files("rsnet.conf")
    except ModuleNotFoundError:
        return CHECKOUT_CONF


def hydra_config_path() -> str:
    """``config_path`` of ``@hydra.main``: ``pkg://rsnet.conf``, else the checkout's conf/ folder."""
    return "pkg://rsnet.conf" if conf_folder() is not CHECKOUT_CONF else str(CHECKOUT_CONF)


def config_groups(config_name: str) -> dict[str, str | None]:
    """The config groups ``conf/<config_name>.yaml`` selects in its defaults list, each with its default option
    (None: none unless given); Hydra's own groups and ``override`` entries are not listed."""
    text = conf_folder().joinpath(f"{config_name}.yaml").read_text()
    defaults = OmegaConf.to_container(OmegaConf.create(text)).get("defaults") or []  # not resolved
    return {group: default for entry in defaults if isinstance(entry, dict) for group, default in entry.items()
            if not group.startswith(("override ", "hydra/"))}


def shared_dataset_settings() -> dict[str, Any]:
    """conf/_base/dataset.yaml: the settings every dataset config starts from, with their defaults."""
    return OmegaConf.to_container(OmegaConf.create(conf_folder().joinpath("_base/dataset.yaml").read_text()))


from rsnet.commands.help import register_help_resolver  # noqa: E402 - needs conf_folder, config_groups, above
from rsnet.run_folders import dataset_folder, protocol_folder

register_help_resolver()  # ${rsnet_help:<name>}: every command's --help (hydra.help.template in its config)
# run folder names: ${rsnet_dataset:<name>,<root>,<bands>} -> aid, image_folder-my_scenes-1a2b3c4d,
# eurosat_ms_bands-all; ${rsnet_protocol:<train_ratio>,<val_ratio>,<image_size>,<pretrained>} -> r0.5_64px_scratch
OmegaConf.register_new_resolver("rsnet_dataset", dataset_folder, replace=True)
OmegaConf.register_new_resolver("rsnet_protocol", protocol_folder, replace=True)

