"""Inference cost of the bare backbone, the pruned main branch and the full multi-branch models.

    python benchmarks/bench_inference.py [--backbone resnet50] [--size 224] [--batch 8] [--reps 5] [--threads N]
        [--main-pool avg|gem|avgmax|grid2] [--main-heads s2_g4 ...] [--classes 45]
    python benchmarks/bench_inference.py --table [--backbones vgg16 resnet50 densenet121] [--main-pool ...]
        [--main-heads ...]

Default: CPU images/s of (a) timm.create_model(backbone) -- the bare classifier, (b) the main branch
extracted from an ESD-MBENet model, (c) full ESD-MBENet, (d) full MGML-FENet, measured in interleaved
rounds (every model once per round, the order rotating) so that drifts in machine load hit all alike;
the fastest round of each model (least disturbed by other load; the median is printed too) gives the
images/s and the ratios pruned/bare (expected 1.00) and full/pruned cost.
``--table``: parameters and forward FLOPs (torch.utils.flop_counter, one 224 px image) of each model x
backbone: full model, pruned main branch, bare backbone, as a Markdown table.
``--main-pool``: the multi-branch models' (and in the table the baseline's) ``model.options.main_pool``, so the pruned
main branch of each candidate pooling is measured against the bare classifier (which pools by global average).
``--main-heads``: MGML-FENet's ``model.options.main_heads``; its pruned main branch (the backbone's classifier averaged
with those FC-FG heads, one forward) is measured against the bare classifier as well.
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from rsnet.models import build_model
from rsnet.models.main_branch import extract_main_branch
from rsnet.models.pooling import MAIN_POOLS

NUM_CLASSES = 45  # NWPU-RESISC45


def params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops(model: torch.nn.Module, size: int) -> int:
    x = torch.randn(1, 3, size, size)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return counter.get_total_flops()


def table(backbones: list[str], size: int, main_pool: str = "avg", main_heads: list[str] | None = None,
          classes: int = NUM_CLASSES) -> None:
    print("| model | backbone | full params (M) | full GFLOPs | pruned params (M) | pruned GFLOPs | "
          "bare params (M) | bare GFLOPs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for backbone in backbones:
        bare = timm.create_model(backbone, num_classes=classes).eval()
        bare_p, bare_f = params(bare), flops(bare, size)
        del bare
        for arch in ("baseline", "esd_mbenet", "mgml_fenet"):
            heads = {"main_heads": main_heads, "image_size": size} if arch == "mgml_fenet" and main_heads else {}
            model = build_model(arch, backbone, classes, main_pool=main_pool, **heads).eval()
            pruned = extract_main_branch(model)
            row = [params(model), flops(model, size), params(pruned), flops(pruned, size), bare_p, bare_f]
            cells = [f"{v / 1e6:.2f}" if i % 2 == 0 else f"{v / 1e9:.2f}" for i, v in enumerate(row)]
            name = arch + "".join(f" ({key}={value})" for key, value in (("main_pool", main_pool),
                                                                          ("main_heads", heads.get("main_heads")))
                                  if value not in (None, "avg"))
            print(f"| {name} | {backbone} | " + " | ".join(cells) + " |", flush=True)
            del model, pruned


def bench(backbone: str, size: int, batch: int, reps: int, warmup: int, main_pool: str = "avg",
          main_heads: list[str] | None = None, classes: int = NUM_CLASSES) -> None:
    torch.manual_seed(0)
    esd = build_model("esd_mbenet", backbone, classes, main_pool=main_pool).eval()
    mgml = build_model("mgml_fenet", backbone, classes, main_pool=main_pool, image_size=size,
                       main_heads=main_heads or []).eval()
    models = {
        "bare": timm.create_model(backbone, num_classes=classes).eval(),
        "pruned": extract_main_branch(esd),
        **({"pruned_mgml": extract_main_branch(mgml)} if main_heads else {}),
        "esd_mbenet": esd,
        "mgml_fenet": mgml,
    }
    x = torch.randn(batch, 3, size, size)
    times: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    with torch.inference_mode():
        for name in names:
            for _ in range(warmup):
                models[name](x)
        for r in range(reps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                start = time.perf_counter()
                models[name](x)
                times[name].append(time.perf_counter() - start)
    rate = {name: batch / min(t) for name, t in times.items()}
    print(f"backbone {backbone}, {size} px, batch {batch}, {reps} interleaved rounds, "
          f"{torch.get_num_threads()} threads (CPU), main_pool={main_pool}; pruned params / bare: "
          f"{params(models['pruned']) / params(models['bare']):.4f}")
    for name in names:
        spread = (max(times[name]) - min(times[name])) / statistics.median(times[name])
        print(f"  {name:<11} {rate[name]:8.2f} images/s  (best {1000 * min(times[name]):.1f} ms/batch, median "
              f"{1000 * statistics.median(times[name]):.1f} ms, spread {100 * spread:.0f}%)")
    print(f"pruned / bare throughput: {rate['pruned'] / rate['bare']:.3f} (target 1.00 +/- 0.03)")
    if main_heads:
        print(f"pruned MGML-FENet main branch (main_heads={main_heads}) / bare: throughput "
              f"{rate['pruned_mgml'] / rate['bare']:.3f}, parameters "
              f"{params(models['pruned_mgml']) / params(models['bare']):.4f}")
    for name in ("esd_mbenet", "mgml_fenet"):
        print(f"{name} full / pruned cost: {rate['pruned'] / rate[name]:.2f}x time per image")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=NUM_CLASSES, help="classes of every model (default 45)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--table", action="store_true", help="print the parameter / FLOP table instead")
    parser.add_argument("--backbones", nargs="+", default=["vgg16", "resnet50", "densenet121"])
    parser.add_argument("--main-pool", default="avg", choices=MAIN_POOLS,
                        help="model.options.main_pool of the models whose main branch is pruned (default avg)")
    parser.add_argument("--main-heads", nargs="+", metavar="HEAD",
                        help="MGML-FENet's model.options.main_heads (e.g. s2_g4): its pruned main branch is measured "
                        "too")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.table:
        table(args.backbones, args.size, args.main_pool, args.main_heads, args.classes)
    else:
        bench(args.backbone, args.size, args.batch, args.reps, args.warmup, args.main_pool, args.main_heads,
              args.classes)


if __name__ == "__main__":
    main()
