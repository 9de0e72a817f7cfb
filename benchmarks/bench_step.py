"""Steady-state training throughput, side by side in one run: is the input pipeline or rsnet's loop the limit?

For every image size and batch size, ``--rounds`` interleaved rounds of ``--steps`` timed steps (after
``--warmup`` untimed ones) of:

  (a)   host side of the input pipeline: cache -> uint8 batch ready to upload (``SceneDataset.stored_batch``, pinned
        for a GPU) — all a host thread must do for a worker; one thread
  (a0)  the host path, a CPU worker's input (``SceneDataset.get_batch``: OpenCV crop/flips/jitter per image with its
        parameters of (seed, epoch, index), normalised float32 batch); one thread
  (a')  the whole input pipeline on the worker's device: (a), upload, ``DeviceAugment`` (augmented, normalised,
        in the model's memory format); no model. On a CPU device with one torch thread (the same core as (a0))
  (b)   the rsnet training step fed through the trainer's ``BatchPrefetcher`` by the input path training takes on
        that device (``--on-device`` as ``augment.on_device``; auto: (a') on a GPU, (a0) on a CPU worker) with
        rsnet's model, multi-branch loss, optimizer, mixed precision and memory format as in training
  (c)   a plain loop on one synthetic batch already on the device (same timm backbone, cross-entropy, SGD): the
        compute ceiling

and prints images/s (median and range over the rounds) with the ratios (b)/(c), (a)/(b) and (a')/(b).
The images are random uint8 pixels in the cache's layout (throughput does not depend on content).

    python benchmarks/bench_step.py                 # a GPU: ResNet-18 at 128/224 px, batch 32/128/256, 300 steps
    python benchmarks/bench_step.py --device cpu    # --sizes 128 224 --batches 32 128 --steps 8 --input-steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsnet.data import BatchPrefetcher, DeviceAugment, ImageStore, SceneDataset, train_transform  # noqa: E402
from rsnet.data.device_augment import augments_on_device  # noqa: E402
from rsnet.engine.acceleration import (  # noqa: E402
    compiled_forward,
    memory_format,
    tune_convolutions,
)
from rsnet.engine.optim import build_optimizer  # noqa: E402
from rsnet.losses import MultiBranchLoss  # noqa: E402
from rsnet.models import build_model  # noqa: E402
from rsnet.precision import StepPrecision  # noqa: E402

CLASSES = 30
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRAINING = {"channels_last": True, "deterministic": False}  # the step settings of conf/config.yaml
DEFAULTS = {  # options left unset, by device type: a CPU run takes minutes, not hours
    "cuda": {"sizes": [128, 224], "batches": [32, 128, 256], "steps": 300, "input_steps": None, "warmup": 30},
    "cpu": {"sizes": [128, 224], "batches": [32, 128], "steps": 8, "input_steps": 30, "warmup": 2}}


def synthetic_dataset(size: int, count: int, crop: bool) -> SceneDataset:
    """``count`` random uint8 images of ``size`` px in an in-memory store, with rsnet's training transform."""
    pixels = np.random.default_rng(0).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    store = ImageStore([f"img{i}.png" for i in range(count)], size, "memory", array=pixels)
    labels = np.arange(count) % CLASSES
    transform = train_transform(size, MEAN, STD, scale=(0.5, 1.0) if crop else None)
    return SceneDataset(store, np.arange(count), labels, [f"c/{i}" for i in range(count)],
                        [f"c{k}" for k in range(CLASSES)], transform, "synthetic")


def index_batches(count: int, batch: int) -> Callable[[], np.ndarray]:
    """Endless batches of a fresh permutation per pass."""
    rng, order, start = np.random.default_rng(1), np.empty(0, np.int64), count

    def next_batch() -> np.ndarray:
        nonlocal order, start
        if start + batch > count:
            order, start = rng.permutation(count), 0
        start += batch
        return order[start - batch:start]

    return next_batch


def timed(step: Callable[[], None], steps: int, warmup: int, device: torch.device, batch: int) -> float:
    """Images/s of ``steps`` calls of ``step`` after ``warmup`` untimed ones (the device synchronised around)."""
    for _ in range(warmup):
        step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return steps * batch / (time.perf_counter() - started)


def fill_defaults(args: argparse.Namespace, defaults: dict[str, dict[str, object]]) -> None:
    """Give every option left unset (None) its default for the type of ``args.device``."""
    for key, value in defaults[torch.device(args.device).type].items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rsnet_training_step(backbone: str, device: torch.device, amp: str,
                        compile_fixed: bool | None = None) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One rsnet training step on a batch as the trainer takes it: the baseline model in training's memory format,
    the multi-branch loss, rsnet's optimizer and mixed precision. ``compile_fixed``: None eager, else
    ``compile=true`` with ``compiled_forward``'s ``fixed_batch_sizes`` (True static shapes, False dynamic)."""
    layout = memory_format(TRAINING, device)
    model = build_model("baseline", backbone, CLASSES).to(device).to(memory_format=layout)
    forward = compiled_forward(model, {"compile": compile_fixed is not None}, bool(compile_fixed))
    criterion = MultiBranchLoss(label_smoothing=0.1)
    optimizer = build_optimizer(model, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4})
    precision = StepPrecision.for_device(amp, device)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with precision.autocast():
            losses = criterion(forward(images), labels, epoch=1.0)
        optimizer.zero_grad(set_to_none=True)
        precision.backward_and_step(losses.total, optimizer, model.parameters(), None)

    return step


class OneThread:
    """torch on one intra-op thread inside the block (a host thread's share of a CPU)."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.threads)


def device_augmenter(size: int, crop: bool, layout: torch.memory_format
                     ) -> Callable[[torch.Tensor, np.ndarray], torch.Tensor]:
    """rsnet's training augmentation of uint8 batches on their device, a new epoch's draw per call."""
    augment = DeviceAugment.for_training(size, MEAN, STD, (0.5, 1.0) if crop else None, 0.2)
    epoch = itertools.count(1)

    def on_device(images: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
        return augment.apply(images, indices, 0, next(epoch), layout)

    return on_device


def host_augmenter(dataset: SceneDataset) -> Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]:
    """rsnet's training augmentation of batches on the host (``dataset.get_batch``), a new epoch's draw per call."""
    epoch = itertools.count(1)

    def on_host(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return dataset.get_batch(indices, 0, next(epoch))

    return on_host


def training_feed(dataset: SceneDataset, device: torch.device, on_device: bool | str,
                  augmenter: Callable[[torch.Tensor, np.ndarray], torch.Tensor]) -> BatchPrefetcher:
    """The trainer's prefetcher for ``device`` with ``augment.on_device`` = ``on_device``: uint8 batches augmented on
    the device by ``augmenter``, or the host path."""
    if augments_on_device(on_device, device):
        return BatchPrefetcher(dataset.stored_batch, device, True, augmenter)
    return BatchPrefetcher(host_augmenter(dataset), device, True)


def measure(args: argparse.Namespace, size: int, batch: int, device: torch.device) -> dict[str, list[float]]:
    """Every path's images/s in each of ``args.rounds`` interleaved rounds."""
    dataset = synthetic_dataset(size, max(4 * batch, 512), args.crop)
    layout = memory_format(TRAINING, device)
    on_device = device_augmenter(size, args.crop, layout)
    cuda = device.type == "cuda"
    next_indices = index_batches(len(dataset), batch)

    def host() -> None:
        images, _ = dataset.stored_batch(next_indices())
        if cuda:
            images.pin_memory()

    on_host = host_augmenter(dataset)

    def host_augment() -> None:
        on_host(next_indices())

    def pipeline() -> None:
        indices = next_indices()
        images, _ = dataset.stored_batch(indices)
        on_device(images.to(device, non_blocking=cuda), indices)

    train = rsnet_training_step(args.backbone, device, args.amp)
    precision = StepPrecision.for_device(args.amp, device)
    prefetcher = training_feed(dataset, device, args.on_device, on_device)  # as the trainer feeds this device
    stream = prefetcher.batches(next_indices() for _ in itertools.count())

    def rsnet_step() -> None:
        prepared = next(stream)
        train(prepared.images, prepared.labels)

    plain = timm.create_model(args.backbone, num_classes=CLASSES).to(device).to(memory_format=layout)
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    synthetic = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=layout)
    targets = torch.randint(0, CLASSES, (batch,), device=device)

    def plain_step() -> None:
        with precision.autocast():
            loss = torch.nn.functional.cross_entropy(plain(synthetic), targets)
        plain_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        plain_optimizer.step()

    steps = args.input_steps or args.steps
    paths: dict[str, tuple[Callable[[], None], bool, int]] = {  # the step, on one thread, timed steps
        "(a) host: uint8 batch": (host, True, steps), "(a0) host: OpenCV augment": (host_augment, True, steps),
        "(a') input pipeline on the device": (pipeline, not cuda, steps),
        "(b) rsnet step": (rsnet_step, False, args.steps),
        "(c) plain loop, synthetic batch": (plain_step, False, args.steps)}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for _ in range(args.rounds):
            for name, (step, one_thread, count) in paths.items():
                with OneThread() if one_thread else contextlib.nullcontext():
                    rates[name].append(timed(step, count, args.warmup, device, batch))
    finally:
        stream.close()
        prefetcher.close()
    return rates


def report(size: int, batch: int, rates: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(values) for name, values in rates.items()}
    a, a_device, b, c = (medians[k] for k in ("(a) host: uint8 batch", "(a') input pipeline on the device",
                                               "(b) rsnet step", "(c) plain loop, synthetic batch"))
    print(f"\n{size} px, batch {batch}: (b)/(c) = {b / c:.2f}   (a)/(b) = {a / b:.1f}   "
          f"(a')/(b) = {a_device / b:.1f}   "
          f"(a')/(a0) = {a_device / medians['(a0) host: OpenCV augment']:.2f}")
    print("| path | images/s (median) | range over rounds |\n|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {medians[name]:,.0f} | {min(values):,.0f}–{max(values):,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--sizes", type=int, nargs="+", help="default: 128 224")
    parser.add_argument("--crop", action="store_true", help="with the random resized crop (augment.crop_scale=[0.5,1]; "
                        "the default has none)")
    parser.add_argument("--batches", type=int, nargs="+", help="default: 32 128 256 on a GPU, 32 128 on a CPU")
    parser.add_argument("--steps", type=int, help="timed steps per path and round (default: 300 on a GPU, 8 on a CPU)")
    parser.add_argument("--input-steps", type=int,
                        help="timed steps of the input paths (a), (a0), (a') (default: --steps, 30 on a CPU)")
    parser.add_argument("--warmup", type=int,
                        help="untimed steps before each timing (default: 30 on a GPU, 2 on a CPU)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median and range reported)")
    parser.add_argument("--on-device", type=lambda v: {"true": True, "false": False}.get(v, v), default="auto",
                        choices=["auto", True, False],
                        help="how (b) is fed, as augment.on_device: auto (the device path on a GPU, the host "
                             "path on a CPU), true (the device path), false (the host path)")
    parser.add_argument("--amp", default="bf16", help="mixed precision on CUDA: bf16 | fp16 | none")
    parser.add_argument("--require-cuda", action="store_true", help="do nothing without a GPU (make gpu-check)")
    args = parser.parse_args()
    if args.require_cuda and not torch.cuda.is_available():
        print("bench_step: no CUDA device visible, nothing measured (run it with --device cpu for the CPU)")
        return
    fill_defaults(args, DEFAULTS)
    device = torch.device(args.device)
    tune_convolutions(TRAINING, device)  # as training does: sizes stay on the grid
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    feed = "(a') the device path" if augments_on_device(args.on_device, device) else "(a0) the host path"
    print(f"bench_step: {args.backbone} on {name}; {args.steps} steps after {args.warmup}, {args.rounds} rounds; "
          f"(b) is fed by {feed}")
    for size in args.sizes:
        for batch in args.batches:
            report(size, batch, measure(args, size, batch, device))


if __name__ == "__main__":
    main()
