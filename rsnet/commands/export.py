"""Export a trained model's main branch (a plain timm classifier) or its full ensemble (``rsnet-export``; in a checkout
also ``python scripts/export_main_branch.py``); settings in conf/export.yaml. docs/models.md, Export."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from rsnet.cli import user_errors
from rsnet.commands import hydra_config_path
from rsnet.commands.overrides import check_overrides
from rsnet.commands.values import bool_setting, int_setting
from rsnet.progress import progress_bar


@hydra.main(config_path=hydra_config_path(), config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Export, then say what was written and how far its logits are from the full model's."""
    with user_errors():
        checkpoint, out, format, head = str(cfg.checkpoint), str(cfg.out), str(cfg.format), str(cfg.head)
        batch_size, seed = int_setting("batch_size", cfg.batch_size, 1), int_setting("seed", cfg.seed)
        progress = bool_setting("progress_bar", cfg.progress_bar)
        from rsnet.export import EXPORT_STAGES, export_checkpoint  # here: --help answers without torch and timm

        # shown once the export has taken half a second: a refused setting or file prints no bar
        with progress_bar(total=EXPORT_STAGES, desc="export", leave=False, dynamic_ncols=True, disable=not progress,
                          delay=0.5, bar_format="{desc}{n_fmt}/{total_fmt} stages done [{elapsed}]") as bar:
            def on_stage(name: str) -> None:  # called as each stage begins: the stages before it are done
                bar.set_description(f"export: {name}", refresh=False)
                bar.n = stages_begun[0]
                bar.update(0)
                stages_begun[0] += 1

            stages_begun = [0]
            result = export_checkpoint(checkpoint, out, format=format, head=head, batch_size=batch_size, seed=seed,
                                       on_stage=on_stage)
        meta = result.metadata
        print(f"from {result.source}")
        print(f"exported {meta['head']} head of {meta['arch']}/{meta['backbone']} ({meta['num_classes']} classes, "
              f"{meta['image_size']} px) as {meta['format']}: {result.path}")
        print(f"metadata: {result.metadata_path}")
        if meta["format"] == "timm":
            print(f"reload with timm: timm.create_model('local-dir:{result.path.parent}', pretrained=True)")
        if result.max_abs_diff is None:
            print("max abs logit difference: not measured (install onnxruntime to run the ONNX file)")
        else:
            print(f"max abs logit difference vs the full model's {meta['head']} logits: {result.max_abs_diff:.3g}")


def run() -> None:
    """The ``rsnet-export`` command (and its script in a checkout): :func:`main` after the command line's check."""
    with user_errors():
        check_overrides("export", sys.argv[1:], sys.argv[0])
    main()


if __name__ == "__main__":
    run()
