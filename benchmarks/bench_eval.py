"""Evaluation throughput: rsnet's per-epoch evaluation against a plain inference loop over the same inputs.

``--rounds`` interleaved rounds (plain, rsnet, plain, rsnet, ...), each a whole pass over a synthetic cached set of
``--images`` random uint8 images (throughput does not depend on content), of:

  plain  ``with torch.inference_mode(): for x in batches: model(x).main_logits.softmax(1)`` over the model inputs,
         made beforehand as rsnet makes them (on the device, in the model's memory format): the ceiling
  rsnet  ``rsnet.engine.epoch_end.evaluate_epoch``, what the trainer calls after an evaluated epoch (one worker):
         batches read from the cache, made the model's input as training's path on that device does
         (``--on-device``, as ``augment.on_device``), prefetched, under autocast, probabilities kept on the device,
         then the metrics

with the same model (rsnet's baseline on ``--backbone``), batch (``--batch``; auto: ``eval_batch_size=auto`` for
a training batch of ``--step-batch``) and precision (``--amp``). Prints images/s (median and range over the
rounds) and the ratio rsnet/plain of every round with its median; ``--train-step`` adds the training step's
images/s (bench_step's rsnet step on one batch of ``--step-batch`` on the device) and rsnet's evaluation / the step.

    python benchmarks/bench_eval.py --require-cuda --backbone resnet50 --size 224 --amp bf16 --train-step \\
        --step-batch 256                                   # a GPU: eval batch auto = 512, 10,000 images, 5 rounds
    python benchmarks/bench_eval.py --device cpu --backbone resnet18 --size 64 --rounds 7   # batch 64, 1,024 images
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_step import rsnet_training_step, synchronize, timed  # noqa: E402

from rsnet.data import DataBundle, DeviceAugment, ImageStore, SceneDataset, Split, eval_transform  # noqa: E402
from rsnet.data.device_augment import augments_on_device  # noqa: E402
from rsnet.data.loader import eval_prefetcher, index_chunks  # noqa: E402
from rsnet.engine.acceleration import memory_format, tune_convolutions  # noqa: E402
from rsnet.engine.epoch_end import evaluate_epoch  # noqa: E402
from rsnet.evaluation import eval_batch_size  # noqa: E402
from rsnet.models import build_model  # noqa: E402
from rsnet.parallel import WorkerContext  # noqa: E402
from rsnet.precision import StepPrecision  # noqa: E402

CLASSES = 30
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULTS = {  # options left unset, by device type: a CPU run takes a minute, not hours
    "cuda": {"backbone": "resnet50", "size": 224, "images": 10_000, "steps": 50, "warmup": 10},
    "cpu": {"backbone": "resnet18", "size": 64, "images": 1_024, "steps": 3, "warmup": 1}}


def synthetic_bundle(size: int, count: int) -> DataBundle:
    """``count`` random uint8 images of ``size`` px cached in memory as a test split, with rsnet's eval transforms
    (the host's and the device's)."""
    pixels = np.random.default_rng(0).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    store = ImageStore([f"img{i}.png" for i in range(count)], size, "memory", array=pixels)
    labels, names = np.arange(count) % CLASSES, [f"c{i % CLASSES}/img{i}.png" for i in range(count)]
    class_names = [f"c{k}" for k in range(CLASSES)]
    test = SceneDataset(store, np.arange(count), labels, names, class_names, eval_transform(size, MEAN, STD), "test")
    split = Split("synthetic", 0.5, 0, class_names, [], names)
    return DataBundle(test, test, class_names, MEAN, STD, size, split, eval_augment=DeviceAugment(size, MEAN, STD))


def training_config(args: argparse.Namespace, batch: int) -> dict[str, object]:
    """The settings ``evaluate_epoch`` reads, as conf/config.yaml has them, with this run's batch and precision (the
    evaluation's ``eval_amp`` and the training step's ``amp`` both ``--amp``)."""
    return {"epochs": 1, "eval_every": 1, "eval_batch_size": batch, "batch_size": args.step_batch, "amp": args.amp,
            "eval_amp": args.amp,
            "channels_last": True, "prefetch": True, "augment": {"on_device": args.on_device}}


def model_inputs(data: DataBundle, config: dict[str, object], device: torch.device, batch: int) -> list[torch.Tensor]:
    """The test split's model inputs on ``device``, batch by batch, made as rsnet's evaluation makes them."""
    on_device = data.eval_augment if augments_on_device(config["augment"]["on_device"], device) else None
    prefetcher = eval_prefetcher(data.test, device, on_device, memory_format(config, device), enabled=False)
    inputs = [prepared.images for prepared in prefetcher.batches(index_chunks(np.arange(len(data.test)), batch))]
    prefetcher.close()
    return inputs


def images_per_s(run: Callable[[], None], count: int, device: torch.device) -> float:
    """Images/s of one call of ``run`` over ``count`` images (the device synchronised around)."""
    synchronize(device)
    started = time.perf_counter()
    run()
    synchronize(device)
    return count / (time.perf_counter() - started)


def measure_eval(args: argparse.Namespace, device: torch.device, batch: int) -> dict[str, list[float]]:
    """Images/s of the plain loop and of rsnet's evaluation in each of ``args.rounds`` interleaved rounds."""
    data = synthetic_bundle(args.size, args.images)
    config = training_config(args, batch)
    layout = memory_format(config, device)
    model = build_model("baseline", args.backbone, CLASSES).to(device).to(memory_format=layout).eval()
    inputs = model_inputs(data, config, device, batch)
    precision = StepPrecision.for_device(args.amp, device)
    ctx = WorkerContext(rank=0, world_size=1, device=device, store=None, is_primary=True)

    def plain() -> None:
        with torch.inference_mode(), precision.autocast():
            for x in inputs:
                model(x).main_logits.softmax(1)

    def rsnet() -> None:
        evaluate_epoch(ctx, config, data, model, epoch=1)

    paths = {"plain": plain, "rsnet": rsnet}
    for run in paths.values():  # untimed: cuDNN's autotuning of both batch shapes, allocations
        run()
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, run in paths.items():
            rates[name].append(images_per_s(run, args.images, device))
    return rates


def measure_step(args: argparse.Namespace, device: torch.device) -> list[float]:
    """Images/s of bench_step's rsnet training step on one batch of ``--step-batch`` on the device, per round."""
    step = rsnet_training_step(args.backbone, device, args.amp)
    layout = memory_format({"channels_last": True}, device)
    images = torch.randn(args.step_batch, 3, args.size, args.size, device=device).contiguous(memory_format=layout)
    labels = torch.randint(0, CLASSES, (args.step_batch,), device=device)
    return [timed(lambda: step(images, labels), args.steps, args.warmup, device, args.step_batch)
            for _ in range(args.rounds)]


def spread(values: list[float], digits: int = 0) -> str:
    """Median (min–max) of ``values``."""
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}–{max(values):,.{digits}f})"


def report(rates: dict[str, list[float]], step: list[float] | None) -> None:
    ratios = [rsnet / plain for plain, rsnet in zip(rates["plain"], rates["rsnet"])]
    print("| round | plain img/s | rsnet img/s | rsnet/plain |\n|---|---|---|---|")
    for number, (plain, rsnet, ratio) in enumerate(zip(rates["plain"], rates["rsnet"], ratios), 1):
        print(f"| {number} | {plain:,.0f} | {rsnet:,.0f} | {ratio:.3f} |")
    print(f"| median (range) | {spread(rates['plain'])} | {spread(rates['rsnet'])} | {spread(ratios, 3)} |")
    if step is not None:
        print(f"training step: {spread(step)} img/s; rsnet evaluation / step = "
              f"{statistics.median(rates['rsnet']) / statistics.median(step):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backbone", help="timm backbone of rsnet's baseline (default: resnet50 on a GPU, resnet18 "
                        "on a CPU)")
    parser.add_argument("--size", type=int, help="image side, px (default: 224 on a GPU, 64 on a CPU)")
    parser.add_argument("--batch", default="auto",
                        help="evaluation batch, as eval_batch_size: auto (for a training batch of --step-batch) "
                             "or a number")
    parser.add_argument("--images", type=int, help="cached images a pass (default: 10,000 on a GPU, 1,024 on a CPU)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median and range reported)")
    parser.add_argument("--amp", default="bf16", help="mixed precision on CUDA: bf16 | fp16 | none")
    parser.add_argument("--on-device", type=lambda v: {"true": True, "false": False}.get(v, v), default="auto",
                        choices=["auto", True, False],
                        help="how rsnet makes the inputs, as augment.on_device: auto (on a GPU's device, on a "
                             "CPU's host), true, false")
    parser.add_argument("--train-step", action="store_true", help="also time the training step on the same backbone")
    parser.add_argument("--step-batch", type=int, default=256, help="training batch (the step, and --batch auto)")
    parser.add_argument("--steps", type=int, help="timed training steps a round (default: 50 on a GPU, 3 on a CPU)")
    parser.add_argument("--warmup", type=int, help="untimed training steps first (default: 10 on a GPU, 1 on a CPU)")
    parser.add_argument("--require-cuda", action="store_true", help="do nothing without a GPU")
    args = parser.parse_args()
    if args.require_cuda and not torch.cuda.is_available():
        print("bench_eval: no CUDA device visible, nothing measured (run it with --device cpu for the CPU)")
        return
    device = torch.device(args.device)
    for key, value in DEFAULTS[device.type].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    batch = eval_batch_size(args.batch if args.batch == "auto" else int(args.batch), device, args.step_batch)
    tune_convolutions({"deterministic": False}, device)  # as training does
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    feed = "on the device" if augments_on_device(args.on_device, device) else "on the host"
    print(f"bench_eval: baseline {args.backbone}, {args.size} px, on {name}; {args.images:,} cached images, eval "
          f"batch {batch}, amp {args.amp if device.type == 'cuda' else 'none (CPU)'}, {args.rounds} rounds; rsnet "
          f"makes its inputs {feed}")
    rates = measure_eval(args, device, batch)
    report(rates, measure_step(args, device) if args.train_step else None)


if __name__ == "__main__":
    main()
