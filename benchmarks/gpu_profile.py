"""Where the time of a training step goes, as text that can be read after the GPU is gone: ``torch.profiler`` over
steady steps of rsnet's training step and over one epoch of a real training run.

``--part step``: ``--steps`` steady steps (after ``--warmup``) of bench_step's (b): rsnet's training step (baseline
model, multi-branch loss, optimizer, mixed precision, memory format) fed through the trainer's ``BatchPrefetcher``
as training feeds it on that device. ``--part epoch``: ``scripts/train.py`` in this process (one worker, adaptive,
the baseline model, every epoch evaluated) on ``--root`` for ``--epoch`` epochs; it prints each epoch's seconds of
training, evaluation and epoch end (checkpoints, TensorBoard, the last epoch's pictures), and profiles the last
epoch's training from its first batch to its last step's end. For each profiled part it prints:

- the top ops by device (GPU) time and by CPU time (self time, ``--top`` rows each);
- the share of the profiled wall time in which the GPU runs nothing (the union of its kernels, copies and sets);
- the host's wall time by the trainer's ranges: ``rsnet.data_wait`` (waiting for the next batch),
  ``rsnet.step`` (forward, backward, optimizer: mostly launching on a GPU), ``rsnet.sync`` (waiting for the device
  once per interval), ``rsnet.interval_end`` (merge and schedule), and the rest.

``--trace FILE`` also writes the steady part's Chrome trace, gzipped, if it is under 16 MiB.

    python benchmarks/gpu_profile.py --part step epoch --root REAL_SIZE     # ResNet-50, 224 px, bf16, batch 256
    python benchmarks/gpu_profile.py --device cpu --backbone test_resnet --size 32 --batch 8 --steps 3 \\
        --part step epoch --root FAKE_AID                                   # the CPU stand-in (tests this script)
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_step import (  # noqa: E402
    TRAINING,
    device_augmenter,
    index_batches,
    rsnet_training_step,
    synchronize,
    synthetic_dataset,
    training_feed,
)

from rsnet.engine.acceleration import memory_format, tune_convolutions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HOST_RANGES = ("rsnet.data_wait", "rsnet.step", "rsnet.sync", "rsnet.interval_end")
TRACE_LIMIT = 16 * 2**20  # the largest file worth keeping


def merged_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The total length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def device_idle_share(events: list[Any]) -> float | None:
    """The share of the profiled window (first to last event, host and device) in which no GPU kernel, copy or set
    runs; None when the profile holds no GPU activity."""
    spans = [(e.time_range.start, e.time_range.end) for e in events]
    on_device = [(e.time_range.start, e.time_range.end) for e in events
                 if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                 and not e.name.startswith("rsnet.")]
    if not on_device or not spans:
        return None
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    return 1.0 - merged_length(on_device) / window if window > 0 else None


def host_breakdown(events: list[Any], wall_s: float) -> str:
    """The host's wall time per trainer range (summed over calls) and the rest, as a Markdown table. Host events
    only: on a GPU each range is also recorded as a device annotation of the same name."""
    totals = {name: 0.0 for name in HOST_RANGES}
    counts = dict.fromkeys(HOST_RANGES, 0)
    for event in events:
        if event.name in totals and event.device_type == DeviceType.CPU:
            totals[event.name] += event.cpu_time_total / 1e6
            counts[event.name] += 1
    rows = ["| host range | calls | seconds | share of wall |", "|---|---|---|---|"]
    for name in HOST_RANGES:
        rows.append(f"| {name} | {counts[name]} | {totals[name]:.3f} | {totals[name] / wall_s:.1%} |")
    rest = wall_s - sum(totals.values())
    rows.append(f"| rest (bookkeeping, logging, the profiler) | | {rest:.3f} | {rest / wall_s:.1%} |")
    return "\n".join(rows)


def top_ops(averages: EventList, on_gpu: bool, top: int) -> str:
    """The top ops by self device time (on a GPU) and by self CPU time."""
    device_key = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
    tables = []
    orders = ([("by GPU time", device_key)] if on_gpu else []) + [("by CPU time", "self_cpu_time_total")]
    for title, key in orders:
        tables.append(f"### Top {top} ops {title}\n```\n"
                      f"{averages.table(sort_by=key, row_limit=top, max_name_column_width=70)}\n```")
    return "\n\n".join(tables)


def report(title: str, prof: profile, wall_s: float, images: int, on_gpu: bool, top: int,
           extra: str = "") -> None:
    """Print one part's figures."""
    events = list(prof.events())
    idle = device_idle_share(events)
    idle_text = f"{idle:.1%}" if idle is not None else "n/a (no GPU activity recorded)"
    print(f"## {title}\n\n{images} images in {wall_s:.2f} s of profiled wall time: {images / wall_s:,.0f} images/s "
          f"(under the profiler)\nGPU idle: {idle_text} of the profiled window\n{extra}\n"
          f"{host_breakdown(events, wall_s)}\n\n{top_ops(prof.key_averages(), on_gpu, top)}\n", flush=True)


def activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]


def profile_steps(args: argparse.Namespace, device: torch.device) -> None:
    """Steady steps of bench_step's (b), profiled."""
    tune_convolutions(TRAINING, device)
    dataset = synthetic_dataset(args.size, max(4 * args.batch, 512), args.crop)
    layout = memory_format(TRAINING, device)
    next_indices = index_batches(len(dataset), args.batch)
    train = rsnet_training_step(args.backbone, device, args.amp)
    prefetcher = training_feed(dataset, device, "auto", device_augmenter(args.size, args.crop, layout))
    stream = prefetcher.batches(next_indices() for _ in itertools.count())

    def step() -> None:
        prepared = next(stream)
        with record_function("rsnet.step"):
            train(prepared.images, prepared.labels)

    try:
        for _ in range(args.warmup):
            step()
        synchronize(device)
        with profile(activities=activities(device)) as prof:
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            with record_function("rsnet.sync"):
                synchronize(device)
            wall = time.perf_counter() - started
    finally:
        stream.close()
        prefetcher.close()
    report(f"Steady steps: {args.backbone}, {args.size} px, batch {args.batch}, {args.amp}, {args.steps} steps after "
           f"{args.warmup}", prof, wall, args.steps * args.batch, device.type == "cuda", args.top)
    if args.trace:
        save_trace(prof, args.trace)


def save_trace(prof: profile, target: Path) -> None:
    """The Chrome trace, gzipped, at ``target`` if it is under TRACE_LIMIT; else a line saying why not."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as source, gzip.open(Path(tmp) / "trace.json.gz", "wb") as packed:
            shutil.copyfileobj(source, packed)
        size = (Path(tmp) / "trace.json.gz").stat().st_size
        if size > TRACE_LIMIT:
            print(f"trace: {size / 2**20:.1f} MiB gzipped, over {TRACE_LIMIT / 2**20:.0f} MiB: not kept")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / "trace.json.gz", target)
        print(f"trace: {target} ({size / 2**20:.1f} MiB, gzipped Chrome trace)")


def profile_epoch(args: argparse.Namespace, device: torch.device) -> None:
    """A real run (scripts/train.py in this process, every epoch evaluated): each epoch's seconds of training,
    evaluation and epoch end (checkpoints, TensorBoard, the pictures of the last epoch) as it ends, and its last
    epoch's training profiled."""
    import rsnet.engine.trainer as trainer
    from rsnet.commands.train import run
    from rsnet.engine.epoch_end import RunState

    train_epoch: Callable[..., Any] = trainer.train_one_epoch
    seconds: dict[str, float] = {}

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*arguments: Any, **options: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*arguments, **options)
            finally:
                synchronize(device)
                seconds[name] = time.perf_counter() - started
        return wrapper

    def profiled_epoch(ctx: Any, config: dict[str, Any], epoch: int, *rest: Any, **options: Any) -> Any:
        if epoch != args.epoch - 1:
            return timed("train", train_epoch)(ctx, config, epoch, *rest, **options)
        with profile(activities=activities(ctx.device)) as prof:
            started = time.perf_counter()
            meter = train_epoch(ctx, config, epoch, *rest, **options)
            synchronize(ctx.device)
            wall = seconds["train"] = time.perf_counter() - started
        extra = (f"trainer's own meters: data wait {meter.data_seconds:.3f} s, compute (step to interval end) "
                 f"{meter.compute_seconds:.3f} s, {meter.steps} steps\n")
        report(f"Epoch {args.epoch} of a real run: {args.backbone}, {args.size} px, batch {args.batch}, {args.amp}, "
               f"{args.root}", prof, wall, meter.samples, ctx.device.type == "cuda", args.top, extra)
        return meter

    def epoch_end(*arguments: Any) -> Any:
        summary = finish(*arguments)
        state = next(argument for argument in arguments if isinstance(argument, RunState))
        print(f"| {state.epoch} | {seconds['train']:.2f} | {seconds['evaluate']:.2f} | "
              f"{seconds['epoch end']:.2f} |", flush=True)
        return summary

    print("Whole epochs of the real run (seconds; the profiled epoch's training under the profiler):\n\n"
          "| epoch | train | evaluate | epoch end: checkpoints, TensorBoard, pictures |\n|---|---|---|---|", flush=True)
    trainer.train_one_epoch = profiled_epoch
    trainer.evaluate_epoch = timed("evaluate", trainer.evaluate_epoch)
    finish = timed("epoch end", trainer.finish_epoch)
    trainer.finish_epoch = epoch_end
    worker = f"cuda:{device.index or 0}" if device.type == "cuda" else str(device)
    with tempfile.TemporaryDirectory(prefix="gpu_profile_") as run_dir:
        sys.argv = ["train.py", "trainer=adaptive", f"trainer.devices=[{worker}]", "model=baseline",
                    f"backbone={args.backbone}", "backbone.pretrained=false", "dataset=aid",
                    f"dataset.root={args.root}", f"dataset.image_size={args.size}", f"epochs={args.epoch}",
                    "eval_every=1", f"batch_size={args.batch}", f"amp={args.amp}", "log.progress_bar=false",
                    f"log.attention_every={args.epoch}", "log.embedding_images=0", f"hydra.run.dir={run_dir}"]
        run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", nargs="+", choices=["step", "epoch"], default=["step", "epoch"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--crop", action="store_true", help="with the random resized crop (augment.crop_scale=[0.5,1]; "
                        "the default has none)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--amp", default="bf16", help="bf16 | fp16 | none (CPU workers run float32 whatever it says)")
    parser.add_argument("--steps", type=int, default=20, help="profiled steady steps (part step)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    parser.add_argument("--root", type=Path, help="an AID-layout folder (part epoch), e.g. a real-size set")
    parser.add_argument("--epoch", type=int, default=2, help="the run's epochs; the last one is profiled")
    parser.add_argument("--top", type=int, default=15, help="rows of each top-ops table")
    parser.add_argument("--trace", type=Path, help="write the steady part's gzipped Chrome trace here")
    parser.add_argument("--require-cuda", action="store_true", help="do nothing without a GPU")
    args = parser.parse_args()
    if args.require_cuda and not torch.cuda.is_available():
        print("gpu_profile: no CUDA device visible, nothing profiled")
        return 0
    if "epoch" in args.part and (args.root is None or not args.root.is_dir()):
        print(f"gpu_profile: --root {args.root} is not a folder: the epoch part needs an AID-layout folder")
        return 2
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# Profile: {name}, torch {torch.__version__}\n", flush=True)
    if "step" in args.part:
        profile_steps(args, device)
    if "epoch" in args.part:
        profile_epoch(args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
