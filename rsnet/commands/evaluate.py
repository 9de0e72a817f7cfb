"""Evaluate a checkpoint or an exported model on a dataset's test split and write its metrics as JSON with the confusion
matrix (``rsnet-evaluate``; docs/usage.md, Evaluation and the protocol)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf

from rsnet.cli import user_errors
from rsnet.commands import hydra_config_path, shared_dataset_settings
from rsnet.commands.overrides import check_overrides
from rsnet.data.errors import CorruptImageError
from rsnet.files import write_json
from rsnet.commands.values import bool_setting, check_writable, int_setting, tta_setting
from rsnet.devices import resolve_device

# the model and data code (torch, timm) is imported where the evaluation starts (main), not here: --help and a
# refused setting answer without it
if TYPE_CHECKING:
    from rsnet.model_loading import LoadedModel, ModelSource

SCORES = ("precision", "recall", "f1")
PLAIN_NAME = re.compile(r"\w[\w.-]*")  # a dataset name that can be part of a file name: no separator, no ..


def dataset_settings(cfg: DictConfig, train_config: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """The dataset to score on and whether it is the run's own: ``dataset=<name>``, else the checkpoint's with any
    ``+dataset.<key>=...`` applied (a key the run's config lacks takes conf/_base/dataset.yaml's value)."""
    given = OmegaConf.to_container(cfg.dataset, resolve=True) if cfg.get("dataset") is not None else {}
    if "name" in given:
        return given, False
    if train_config is None:
        raise ValueError("an exported model carries no dataset settings; pass dataset=<name> (and dataset.root=...)")
    return {**shared_dataset_settings(), **train_config["dataset"], **given}, True


def check_dataset_name(name: Any, source: ModelSource, runs_own: bool) -> None:
    """Refuse a dataset name that is not plain (it names the result file beside the model: no ``../..`` out of its
    folder), naming the checkpoint that holds it (``runs_own``), else the setting."""
    if isinstance(name, str) and PLAIN_NAME.fullmatch(name):
        return
    where = f"{source.path}: its dataset.name {name!r}" if runs_own else f"dataset.name={name!r}"
    raise ValueError(f"{where} is not a plain name (letters, digits, '_', '.', '-'); pass dataset=<name> "
                     "(and dataset.root=...) to score on a dataset of yours")


def output_path(cfg: DictConfig, source: ModelSource, dataset: dict[str, Any]) -> Path:
    """``out=``, else ``eval_<dataset>_test.json`` beside the model file; checked writable now, not after scoring."""
    out = Path(cfg.out) if cfg.out else source.path.parent / f"eval_{dataset['name']}_test.json"
    return check_writable(out, "out")


def summary(metrics: dict[str, Any]) -> str:
    """One line: accuracy of the reported head, kappa, every head's accuracy and the test-time augmentation."""
    heads = ", ".join(f"{head} {value:.2f}" for head, value in metrics["oa"].items())
    return (f"{metrics['dataset']} test split ({metrics['num_samples']} images): accuracy {metrics['accuracy']:.2f} % "
            f"[{metrics['reported_head']}], kappa {metrics['kappa']:.4f}; per head: {heads}; tta {metrics['tta']}")


def class_table(metrics: dict[str, Any]) -> str:
    """Per-class support, precision, recall and F1 (%) of the reported head, then their macro averages."""
    names = list(metrics["per_class_f1"])
    support = [sum(row) for row in metrics["confusion_matrix"]]
    width = max(len("macro average"), *map(len, names))
    rows = [(name, count, *(metrics[f"per_class_{key}"][name] for key in SCORES))
            for name, count in zip(names, support)]
    rows.append(("macro average", sum(support), *(metrics[f"macro_{key}"] for key in SCORES)))
    header = f"{'class':<{width}}  {'support':>7}" + "".join(f"  {key:>9}" for key in SCORES)
    return "\n".join([header, *(f"{name:<{width}}  {count:>7}" + "".join(f"  {value:>9.2f}" for value in values)
                                 for name, count, *values in rows)])


def model_name(loaded: LoadedModel) -> str | None:
    """``<arch> on <backbone>`` of a checkpoint (its training config) or an export (its model.json); None if unknown."""
    config = loaded.train_config or {}
    arch = (config.get("model") or {}).get("arch", loaded.metadata.get("arch"))
    backbone = (config.get("backbone") or {}).get("name", loaded.metadata.get("backbone"))
    return f"{arch} on {backbone}" if arch and backbone else None


def figure_title(metrics: dict[str, Any], loaded: LoadedModel) -> str:
    """The confusion figure's title, as training's: the run, then the split, the head and the epoch scored."""
    from rsnet.engine.run_history import head_name

    name = model_name(loaded)
    scored = f"epoch {metrics['epoch']}" if metrics["epoch"] is not None else "exported model"
    tta = ", tta d4" if metrics["tta"] != "none" else ""
    return (f"{metrics['dataset']}: {name}" if name else metrics["dataset"]) + \
        f"\ntest split, {head_name(metrics['reported_head'])}, {scored}{tta} (rsnet-evaluate)"


def write_outputs(out: Path, metrics: dict[str, Any], class_names: list[str], title: str) -> None:
    """The metrics JSON at ``out``, the confusion matrix beside it as ``<stem>_confusion.csv`` and ``.png`` (with
    ``title``)."""
    from rsnet.evaluation import rounded_numbers, write_confusion_csv, write_confusion_png

    write_json(out, rounded_numbers(metrics), indent=2)
    print(f"metrics written to {out}")
    table, image = (out.with_name(f"{out.stem}_confusion{suffix}") for suffix in (".csv", ".png"))
    write_confusion_csv(table, metrics["confusion_matrix"], class_names)
    write_confusion_png(image, metrics["confusion_matrix"], class_names, title)
    print(f"confusion matrix written to {table} and {image}")


@hydra.main(config_path=hydra_config_path(), config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Score the model, print the main figures and per-class table, then write the metrics and confusion."""
    with user_errors():  # around the imports too: a Ctrl-C while torch loads is one line as well
        from rsnet.data import build_datasets_from_config
        from rsnet.data.raster import bands_from_metadata
        from rsnet.evaluation import EvalFeed, TTAModel, compute_metrics, evaluate
        from rsnet.model_loading import load_model
        from rsnet.precision import check_amp

        device = resolve_device(str(cfg.device))
        batch_size = int_setting("batch_size", cfg.batch_size, 1)
        tta = tta_setting(cfg.tta)
        loaded = load_model(str(cfg.checkpoint), device)
        scored = f"; epoch {loaded.epoch}, sha256 {loaded.sha256}" if loaded.sha256 else ""
        print(f"model: {loaded.source}{scored}")
        dataset, runs_own = dataset_settings(cfg, loaded.train_config)
        check_dataset_name(dataset["name"], loaded.source, runs_own)
        seed = int_setting("seed", cfg.seed) if cfg.seed is not None else (loaded.train_config or {}).get("seed", 0)
        out = output_path(cfg, loaded.source, dataset)
        run_split = loaded.source.path.resolve().parent.parent / "split.json"
        same_run = runs_own and cfg.seed is None
        # read the bands the model was trained on (None: RGB pictures), normalised with its own statistics
        dataset["bands"] = bands_from_metadata(loaded.metadata.get("bands"))
        try:
            data = build_datasets_from_config(dataset, seed, image_size=loaded.metadata["image_size"],
                                              split_file=run_split if same_run and run_split.is_file() else None,
                                              mean=loaded.metadata["mean"], std=loaded.metadata["std"])
        except CorruptImageError as error:  # name the override that works here (the run's dataset is not a group)
            switch = "+dataset.skip_corrupt=true" if runs_own else "dataset.skip_corrupt=true"
            raise CorruptImageError(error.paths, error.reason, switch) from None
        class_names = list(loaded.metadata["class_names"])
        if list(data.class_names) != class_names:
            raise ValueError(f"{loaded.source.path} was trained on {len(class_names)} classes "
                             f"({', '.join(class_names[:4])}, ...) which differ from dataset "
                             f"{dataset['name']!r} ({len(data.class_names)} classes); pass the matching dataset=")
        model = TTAModel(loaded.model) if tta == "d4" else loaded.model
        progress = f"evaluating {dataset['name']} test" if bool_setting("progress_bar", cfg.progress_bar) else None
        amp = check_amp(cfg.amp if cfg.amp is not None else (loaded.train_config or {}).get("eval_amp", "none"))
        result = evaluate(model, data.test, device, batch_size=batch_size, progress=progress, feed=EvalFeed(amp=amp))
        metrics = compute_metrics(result, data.class_names)
        metrics.update(checkpoint=str(loaded.source.path), epoch=loaded.epoch, checkpoint_sha256=loaded.sha256,
                       dataset=dataset["name"], train_ratio=dataset["train_ratio"], seed=seed, tta=tta, amp=amp)
        print(summary(metrics))
        print(class_table(metrics))
        write_outputs(out, metrics, class_names, figure_title(metrics, loaded))


def run() -> None:
    """The ``rsnet-evaluate`` command (and its script in a checkout): :func:`main` after the command line's check."""
    with user_errors():
        check_overrides("evaluate", sys.argv[1:], sys.argv[0])
    main()


if __name__ == "__main__":
    run()
