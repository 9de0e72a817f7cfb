"""Evaluate a checkpoint or an exported model on a dataset's test split and write its metrics as JSON.

    python scripts/evaluate.py checkpoint=outputs/.../checkpoints/best.pt
    python scripts/evaluate.py checkpoint=exported/ dataset=ucmerced dataset.root=/data/UCMerced_LandUse
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from rsnet.cli import user_errors
from rsnet.data import build_datasets_from_config
from rsnet.engine.checkpoint import load_checkpoint, model_from_checkpoint
from rsnet.engine.evaluate import compute_metrics, evaluate
from rsnet.export import is_exported_model, load_exported


def load_any_model(path: Path, device: torch.device) -> tuple[Any, dict[str, Any], dict[str, Any] | None]:
    """A training checkpoint (full model) or an exported model, with its metadata and training config."""
    if not is_exported_model(path):
        checkpoint = load_checkpoint(path, map_location=device)
        model = model_from_checkpoint(checkpoint, source=path).to(device)
        meta = {key: checkpoint[key] for key in ("class_names", "image_size", "mean", "std")}
        return model, meta, checkpoint.get("config")
    exported = load_exported(path)
    return exported, dict(exported.metadata), None


def dataset_settings(cfg: DictConfig, train_config: dict[str, Any] | None) -> dict[str, Any]:
    """The dataset to score on: the command line's, else the one the checkpoint was trained on."""
    if cfg.get("dataset") is not None:
        return OmegaConf.to_container(cfg.dataset, resolve=True)
    if train_config is None:
        raise ValueError("an exported model carries no dataset settings; pass dataset=<name> (and dataset.root=...)")
    return train_config["dataset"]


@hydra.main(config_path=str(Path(__file__).resolve().parent.parent / "conf"), config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Score the model, print the main figures and write the metrics JSON."""
    with user_errors():
        path = Path(cfg.checkpoint)
        device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                              ("cpu" if cfg.device == "auto" else cfg.device))
        model, meta, train_config = load_any_model(path, device)
        dataset = dataset_settings(cfg, train_config)
        seed = cfg.seed if cfg.seed is not None else (train_config or {}).get("seed", 0)
        run_split = path.resolve().parent.parent / "split.json"
        same_run = train_config is not None and cfg.get("dataset") is None and cfg.seed is None
        data = build_datasets_from_config(dataset, seed, image_size=meta["image_size"],
                                          split_file=run_split if same_run and run_split.is_file() else None)
        if list(data.class_names) != list(meta["class_names"]):
            raise ValueError(f"{path} was trained on {len(meta['class_names'])} classes "
                             f"({', '.join(meta['class_names'][:4])}, ...) which differ from dataset "
                             f"{dataset['name']!r} ({len(data.class_names)} classes); pass the matching dataset=")
        metrics = compute_metrics(evaluate(model, data.test, device, batch_size=cfg.batch_size), data.class_names)
    metrics.update(checkpoint=str(path), dataset=dataset["name"], train_ratio=dataset["train_ratio"], seed=seed)
    out = Path(cfg.out) if cfg.out else (path if path.is_dir() else path.parent) / f"eval_{dataset['name']}_test.json"
    out.write_text(json.dumps(metrics, indent=2))
    heads = ", ".join(f"{head} {value:.2f}" for head, value in metrics["oa"].items())
    print(f"{dataset['name']} test split ({metrics['num_samples']} images): accuracy {metrics['accuracy']:.2f} % "
          f"[{metrics['reported_head']}], kappa {metrics['kappa']:.4f}; per head: {heads}")
    print(f"metrics written to {out}")


if __name__ == "__main__":
    main()
