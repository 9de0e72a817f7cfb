"""Export a trained model's main branch (a plain timm classifier) or its full ensemble.

    rsnet-export checkpoint=outputs/run/checkpoints/best.pt \
        [format=torchscript|onnx|state_dict|timm] [head=main|ensemble] [out=exported/] [batch_size=2] [seed=0]

``checkpoint`` is a training checkpoint file or a run folder (its checkpoints/best.pt, else last.pt).
Writes ``out/model.{ts,onnx,pt}`` (or, for format=timm, timm's ``model.safetensors`` + ``config.json``,
which ``timm.create_model("local-dir:out", pretrained=True)`` loads; main branch only) and ``out/model.json``
(class names, image size, mean/std, backbone, num_classes, head) and prints the largest absolute difference
between the exported model's logits and the full model's main-branch (or ensemble) logits on a random batch.
``out`` must not hold training checkpoints (an export there would overwrite or shadow them).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rsnet.cli import user_errors

DEFAULTS = {"checkpoint": None, "format": "torchscript", "head": "main", "out": "exported", "batch_size": "2",
            "seed": "0"}


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    """``key=value`` arguments (``+``/``--`` prefixes tolerated) merged over the defaults."""
    args = dict(DEFAULTS)
    for item in argv:
        key, sep, value = item.lstrip("+-").partition("=")
        if not sep or key not in DEFAULTS:
            raise ValueError(f"bad argument {item!r}; use key=value with keys {sorted(DEFAULTS)}")
        args[key] = value
    if not args["checkpoint"]:
        raise ValueError("checkpoint=PATH is required (a run's checkpoints/best.pt or last.pt)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    with user_errors():
        args = parse_args(sys.argv[1:] if argv is None else argv)
        from rsnet.settings import int_setting
        from rsnet.export import export_checkpoint

        batch_size, seed = int_setting("batch_size", args["batch_size"], 1), int_setting("seed", args["seed"])
        result = export_checkpoint(args["checkpoint"], args["out"], format=args["format"], head=args["head"],
                                   batch_size=batch_size, seed=seed)
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


if __name__ == "__main__":
    main()
