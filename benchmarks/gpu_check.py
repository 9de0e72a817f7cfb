"""GPU check: one epoch of every trainer x model on the visible GPUs, as a Markdown pass/fail table.

Runs ``scripts/train.py`` in a subprocess, as a user would, for each device configuration x trainer
(every registered strategy: adaptive, local_sgd, sync, static) x model (every registered model: baseline,
esd_mbenet, mgml_fenet): one epoch of the bundled
data/ucmerced-mini, ResNet-18 from scratch. Device configurations:

* ``1gpu``: ``[cuda:0]``;
* ``2gpu``: ``[cuda:0, cuda:1]`` (NCCL), skipped when fewer than 2 GPUs are visible;
* ``gpu+cpu``: ``[cuda:0, cpu]`` (gloo).

A run that fails or passes ``--timeout`` is a FAIL row (its stderr tail is printed under the table) and
the check goes on. The table gives devices, backend, trainer, model, PASS/FAIL, images/s and test accuracy
from the run's metrics.json, and from its ``scheduler`` entry (n/a where absent) the merge seconds of the
slowest worker and the number of merges. Exit status 1 if any run failed, else 0 (also when no GPU is
visible: nothing to check).

    python benchmarks/gpu_check.py                                  # every visible GPU, 36 runs at most
    python benchmarks/gpu_check.py --configs 1gpu --models baseline --out gpu_check.md
    python benchmarks/gpu_check.py --cpu-stand-in --backbone test_resnet --image-size 32   # test this script on a CPU
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from process_group import run_in_group
from rsnet.models import MODELS as MODEL_REGISTRY
from rsnet.parallel.launcher import choose_backend
from rsnet.parallel.strategies import STRATEGIES

REPO = Path(__file__).resolve().parents[1]
TRAINERS = tuple(STRATEGIES)  # the registries: a newly registered strategy or model is checked too
MODELS = tuple(sorted(MODEL_REGISTRY))
CONFIGS = {"1gpu": ["cuda:0"], "2gpu": ["cuda:0", "cuda:1"], "gpu+cpu": ["cuda:0", "cpu"]}
TAIL_LINES = 20
ERROR_LINE = re.compile(r"^\s*([\w.]*(Error|Exception)|error):|^timed out|^killed by signal|metrics\.json")


@dataclass
class Result:
    """One run's row of the table."""

    config: str
    devices: list[str]
    trainer: str
    model: str
    seconds: float
    error_tail: str = ""  # a failed run's stderr tail and what went wrong; empty: PASS
    images_per_s: float = 0.0
    accuracy: float = 0.0
    merge_s: str = "n/a"
    merges: str = "n/a"

    @property
    def passed(self) -> bool:
        return not self.error_tail


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--image-size", type=int, default=None, help="default: the dataset config's")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run before it is killed (a FAIL)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report (Markdown) to this file")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="extra train.py overrides for every run, e.g. --set amp=fp16 channels_last=false "
                             "compile=true")
    parser.add_argument("--cpu-stand-in", action="store_true",
                        help="replace every cuda:i by cpu: tests this script on a machine without a GPU")
    return parser.parse_args()


def device_configs(names: list[str], gpus: int, stand_in: bool) -> tuple[dict[str, list[str]], list[str]]:
    """The device lists to run (cuda:i -> cpu under the stand-in) and a note per configuration skipped."""
    selected: dict[str, list[str]] = {}
    skipped: list[str] = []
    for name in names:
        devices = CONFIGS[name]
        needed = sum(device.startswith("cuda") for device in devices)
        if stand_in:
            selected[name] = ["cpu" if device.startswith("cuda") else device for device in devices]
        elif needed > gpus:
            skipped.append(f"{name} [{', '.join(devices)}]: needs {needed} GPUs, {gpus} visible")
        else:
            selected[name] = devices
    return selected, skipped


def header(stand_in: bool, extra: list[str]) -> list[str]:
    """Machine facts: GPU names, torch, CUDA and NCCL versions, the extra overrides; a loud warning under the
    stand-in."""
    lines = [f"# GPU check: rsnet, {time.strftime('%Y-%m-%d %H:%M')}", ""]
    if stand_in:
        lines += ["**!!! CPU STAND-IN: every cuda:i below ran on the CPU. This tests the check script, "
                  "NOT the GPU code path. !!!**", ""]
    gpus = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpus else "n/a"
    lines += [f"- GPUs: {'; '.join(gpus) or 'none'}",
              f"- torch {torch.__version__}, CUDA {torch.version.cuda or 'n/a'} (torch build), NCCL {nccl}",
              f"- extra overrides: {' '.join(extra) or 'none (the config defaults: amp=bf16, channels_last=true)'}", ""]
    return lines


def overrides(trainer: str, model: str, devices: list[str], args: argparse.Namespace, run_dir: Path) -> list[str]:
    """Command-line overrides of scripts/train.py for one run."""
    values = [f"trainer={trainer}", f"trainer.devices=[{','.join(devices)}]", f"model={model}",
              f"backbone={args.backbone}", "backbone.pretrained=false", f"epochs={args.epochs}",
              "log.progress_bar=false", "log.attention_every=2", f"hydra.run.dir={run_dir}", "overwrite=true",
              # a hung collective is reported by the trainer before the kill
              f"trainer.timeout_s={max(1, args.timeout // 2)}"]
    if args.image_size:
        values.append(f"dataset.image_size={args.image_size}")
    return [*values, *args.set]


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last non-empty lines of a log file."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def run_training(command: list[str], log_dir: Path, timeout: int) -> int | None:
    """Run the command in its own process group, output to log_dir/std{out,err}.log; its exit status, None on timeout.

    On timeout the whole group is killed, so spawned workers do not keep holding a GPU."""
    with open(log_dir / "stdout.log", "w") as out, open(log_dir / "stderr.log", "w") as err:
        return run_in_group(command, REPO, timeout, out, err)


def check(config: str, devices: list[str], trainer: str, model: str, args: argparse.Namespace, tmp: Path) -> Result:
    """Train one configuration; a PASS needs exit status 0 and a metrics.json with images/s and accuracy."""
    run_dir = tmp / f"{config}_{trainer}_{model}"
    run_dir.mkdir(parents=True)
    command = [sys.executable, str(REPO / "scripts" / "train.py"), *overrides(trainer, model, devices, args, run_dir)]
    started = time.perf_counter()
    status = run_training(command, run_dir, args.timeout)
    result = Result(config, devices, trainer, model, time.perf_counter() - started)
    if status is None:
        problem = f"timed out after {args.timeout} s (process group killed)"
    elif status < 0:
        problem = f"killed by signal {signal.Signals(-status).name}"
    elif status != 0:
        problem = f"exit status {status}"
    else:
        try:
            metrics = json.loads((run_dir / "metrics.json").read_text())
            result.images_per_s, result.accuracy = float(metrics["images_per_s"]), float(metrics["accuracy"])
            result.merge_s, result.merges = merge_cells(metrics)
            return result
        except (OSError, ValueError, KeyError, TypeError) as error:
            problem = f"exit status 0 but metrics.json unreadable: {type(error).__name__}: {error}"
    stderr = tail(run_dir / "stderr.log")
    result.error_tail = f"{stderr}\n{problem}" if stderr else problem
    return result


def merge_cells(metrics: dict) -> tuple[str, str]:
    """Merge seconds of the slowest worker (lowest speed) and the number of merges; n/a without a scheduler entry."""
    scheduler = metrics.get("scheduler")
    if not isinstance(scheduler, dict) or not scheduler.get("workers"):
        return "n/a", "n/a"
    slowest = min(scheduler["workers"], key=lambda worker: float(worker["speed"]))
    return f"{float(slowest['merge_s']):.2f}", str(scheduler.get("merges", "n/a"))


def error_note(result: Result) -> str:
    """One line for the table: the last line of the stderr tail that names an error, else its first line."""
    lines = result.error_tail.splitlines()
    note = next((line for line in reversed(lines) if ERROR_LINE.search(line)), lines[0])
    note = note.strip().replace("|", "\\|")
    return note if len(note) <= 120 else note[:117] + "..."


def table(results: list[Result]) -> list[str]:
    """The Markdown pass/fail table."""
    lines = ["| config | devices | backend | trainer | model | result | images/s | test acc % "
             "| merge s (slowest worker) | merges | run s | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        cells = [r.config, ", ".join(r.devices), choose_backend(r.devices), r.trainer, r.model]
        if r.passed:
            cells += ["PASS", f"{r.images_per_s:.1f}", f"{r.accuracy:.2f}", r.merge_s, r.merges, f"{r.seconds:.0f}", ""]
        else:
            cells += ["**FAIL**", "", "", "", "", f"{r.seconds:.0f}", error_note(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def failures(results: list[Result]) -> list[str]:
    """The stderr tail of every failed run."""
    lines: list[str] = []
    for r in results:
        if not r.passed:
            lines += ["", f"### FAIL: {r.config} [{', '.join(r.devices)}] trainer={r.trainer} model={r.model}",
                      "```", r.error_tail, "```"]
    return lines


def main() -> int:
    args = parse_args()
    gpus = torch.cuda.device_count()
    if gpus == 0 and not args.cpu_stand_in:
        print("no CUDA device visible: nothing to check "
              "(--cpu-stand-in runs the check on the CPU, to test this script)")
        return 0
    configs, skipped = device_configs(args.configs, gpus, args.cpu_stand_in)
    runs = [(c, devices, t, m) for c, devices in configs.items() for t in args.trainers for m in args.models]
    head = header(args.cpu_stand_in, args.set)
    print("\n".join(head), flush=True)
    started = time.perf_counter()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for index, (config, devices, trainer, model) in enumerate(runs, 1):
            result = check(config, devices, trainer, model, args, Path(tmp))
            results.append(result)
            print(f"[{index}/{len(runs)}] {config} [{', '.join(devices)}] {trainer} {model}: "
                  f"{'PASS' if result.passed else 'FAIL'} ({result.seconds:.0f} s)", flush=True)
    failed = sum(not r.passed for r in results)
    body = [f"{args.backbone} (pretrained=false), {args.epochs} epoch(s), "
            f"image size {args.image_size or 'from the dataset config'}, timeout {args.timeout} s per run", ""]
    body += table(results) + failures(results) + [""]
    body += [f"skipped: {note}" for note in skipped]
    body.append(f"{len(results) - failed} passed, {failed} failed ({time.perf_counter() - started:.0f} s)")
    print("\n" + "\n".join(body))
    if args.out:
        args.out.write_text("\n".join(head + body) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
