"""``compile=true``: the training forward compiled for static shapes (once per batch size) against a dynamic batch
dimension (compiled once), and eager, side by side in one run.

Every round runs each mode in a fresh interpreter with an empty inductor cache, as a new training run starts: the
first step at batch ``b`` (compiling), the first step at ``b + b/8`` (an epoch's last batch, a second shape: the
static forward compiles again, the dynamic one does not), then images/s of ``--steps`` rsnet training steps at ``b``
after ``--warmup`` (rsnet's baseline model, multi-branch loss, optimizer, mixed precision and memory format as in
training, on a synthetic batch already on the device). Modes alternate within each round; the medians and ranges
over ``--rounds`` rounds are printed with the ratios static/dynamic and compiled/eager.

    python benchmarks/bench_compile.py                 # a GPU: ResNet-18, 224 px, batch 128, bf16
    python benchmarks/bench_compile.py --device cpu    # = --size 128 --batch 32 --steps 10 --warmup 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULTS = {"cuda": {"size": 224, "batch": 128, "steps": 100, "warmup": 10},  # options left unset, by device type
            "cpu": {"size": 128, "batch": 32, "steps": 10, "warmup": 3}}
MODES = {"eager": None, "static": True, "dynamic": False}  # mode -> compiled_forward's fixed_batch_sizes
RATIOS = [("static", "dynamic"), ("static", "eager"), ("dynamic", "eager")]  # printed where both were run


def last_batch(batch: int) -> int:
    """The second shape timed: an epoch's last batch, ``batch + batch/8``."""
    return batch + max(batch // 8, 1)


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One mode's compile seconds (two shapes) and steady images/s, in this interpreter."""
    import torch

    from bench_step import CLASSES, TRAINING, rsnet_training_step, synchronize
    from rsnet.engine.acceleration import memory_format, tune_convolutions

    device = torch.device(args.device)
    torch.manual_seed(0)
    tune_convolutions(TRAINING, device)  # as training does
    step = rsnet_training_step(args.backbone, device, args.amp, MODES[args.worker])
    layout, batches = memory_format(TRAINING, device), {}
    for size in (args.batch, last_batch(args.batch)):
        images = torch.randn(size, 3, args.size, args.size, device=device).contiguous(memory_format=layout)
        batches[size] = (images, torch.randint(0, CLASSES, (size,), device=device))

    def seconds(size: int, steps: int) -> float:
        synchronize(device)
        started = time.perf_counter()
        for _ in range(steps):
            step(*batches[size])
        synchronize(device)
        return time.perf_counter() - started

    first, second = (seconds(size, 1) for size in batches)
    seconds(args.batch, args.warmup)
    return {"first": first, "second": second, "images_s": args.steps * args.batch / seconds(args.batch, args.steps)}


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """``measure`` of ``mode`` in a fresh interpreter with empty compile caches."""
    with tempfile.TemporaryDirectory(prefix="rsnet-compile-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
        command = [sys.executable, __file__, "--worker", mode, "--device", args.device, "--backbone", args.backbone,
                   "--size", str(args.size), "--batch", str(args.batch), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--amp", args.amp]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench_compile: the {mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    def spread(mode: str, key: str, form: str) -> str:
        values = [r[key] for r in results[mode]]
        return f"{median(mode, key):{form}} ({min(values):{form}}–{max(values):{form}})"

    rate = {mode: median(mode, "images_s") for mode in results}
    ratios = [f"{a}/{b} = {rate[a] / rate[b]:.2f}" for a, b in RATIOS if a in rate and b in rate]
    print(f"\nsteady state: {'   '.join(ratios) or 'one mode, no ratio'}")
    print(f"| mode | first step, batch {args.batch} (s) | first step, batch {last_batch(args.batch)} (s) "
          "| images/s after warm-up |\n|---|---|---|---|")
    for mode in results:
        print(f"| {mode} | {spread(mode, 'first', '.1f')} | {spread(mode, 'second', '.1f')} | "
              f"{spread(mode, 'images_s', ',.0f')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="default: cuda if visible, else cpu")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--size", type=int, help="default: 224 on a GPU, 128 on a CPU")
    parser.add_argument("--batch", type=int, help="default: 128 on a GPU, 32 on a CPU")
    parser.add_argument("--steps", type=int, help="timed steps per mode and round (default: 100 on a GPU, 10 on a CPU)")
    parser.add_argument("--warmup", type=int, help="untimed steps after the two first ones (default: 10 / 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median and range reported)")
    parser.add_argument("--amp", default="bf16", help="mixed precision on CUDA: bf16 | fp16 | none")
    parser.add_argument("--require-cuda", action="store_true", help="do nothing without a GPU (make gpu-check)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                        help="run in this order within each round (default: eager static dynamic)")
    parser.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args)))
        return
    import torch

    if args.require_cuda and not torch.cuda.is_available():
        print("bench_compile: no CUDA device visible, nothing measured (run it with --device cpu for the CPU)")
        return
    from bench_step import fill_defaults

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    fill_defaults(args, DEFAULTS)
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(0) if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"bench_compile: {args.backbone} on {name}, {args.size} px, batch {args.batch}; {args.steps} steps after "
          f"{args.warmup}, {args.rounds} rounds, each mode in a fresh interpreter with empty compile caches")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}  # run in the order given
    for round_ in range(1, args.rounds + 1):
        for mode in results:
            results[mode].append(run_mode(mode, args))
            done = results[mode][-1]
            print(f"round {round_}, {mode}: first steps {done['first']:.1f} s and {done['second']:.1f} s, "
                  f"{done['images_s']:,.0f} images/s", flush=True)  # kept if a time limit stops the run
    report(results, args)


if __name__ == "__main__":
    main()
