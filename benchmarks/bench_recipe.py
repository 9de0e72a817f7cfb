"""Recipe check on real data: a plain PyTorch/timm loop vs rsnet's baseline, ESD-MBENet and MGML-FENet.

On the AID development subset (``../shared/data/aid-dev``: 30 classes × 60 real images, 150 px), at 64 px,
train ratio 0.5 (900 train / 900 test images), resnet18 from scratch, the same epochs and seeds for every row:

* ``plain``: a 50-line timm loop written here (SGD Nesterov, OneCycle lr 0.05, label smoothing 0.1, batch 32,
  random flips + 90° rotations, no crop) on the same split and the same decoded 64 px images;
* ``baseline``, ``esd_mbenet``, ``mgml_fenet``: ``scripts/train.py`` as a user runs it, with the shipped
  defaults (only dataset, size, ratio, backbone, epochs and seed set; ``--set`` adds overrides for ablations).

Rows are interleaved (seed 0 of every row, then seed 1, ...). It prints the test overall accuracy of every row
(main branch and ensemble, mean ± std over the seeds), training images/s and the step-cost ratio of each model
to the baseline (baseline images/s ÷ model images/s, from the same runs), then one verdict line per target
(printed, not asserted). Figures on aid-dev are development-subset figures, never AID results.

    python benchmarks/bench_recipe.py                              # 3 seeds × 4 rows × 30 epochs, ~90 min on 2 cores
    python benchmarks/bench_recipe.py --seeds 0 --rows plain,baseline --epochs 5      # quick look
    python benchmarks/bench_recipe.py --rows baseline --set model.loss.label_smoothing=0.0   # an ablation
    python benchmarks/bench_recipe.py --step-cost                  # training step cost vs baseline at 64 and 224 px
    python benchmarks/bench_recipe.py --image-size 224 --require-cuda   # the check at 224 px, on a GPU (minutes)
    python benchmarks/bench_recipe.py --image-size 224 --require-cuda --lanes 6   # 6 runs at a time on one GPU
    # the same table in about half the time on 2 cores: two processes with one thread each, then one table
    OMP_NUM_THREADS=1 python benchmarks/bench_recipe.py --rows plain,baseline --set trainer.cpu_threads=1 \\
        --json a.json &
    OMP_NUM_THREADS=1 python benchmarks/bench_recipe.py --rows esd_mbenet,mgml_fenet --set trainer.cpu_threads=1 \\
        --json b.json
    python benchmarks/bench_recipe.py --report a.json b.json
    # eurosat-ms-dev (200 real Sentinel-2 patches, 13 bands, 64 px: dataset=image_folder dataset.bands=all), rsnet rows
    python benchmarks/bench_recipe.py --dataset eurosat-ms-dev --rows baseline,esd_mbenet,mgml_fenet --seeds 0,1,2,3,4
    # what a main branch averaging some of MGML-FENet's heads would score, from each run's checkpoint
    python benchmarks/bench_recipe.py --rows mgml_fenet --head-sets main+fem_s2_g4 main+fem_s4_g2+fem_s3_g2+fem_s2_g4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn.functional as F

from rsnet.commands.aggregate import mean_std

REPO = Path(__file__).resolve().parents[1]
AID_DEV = REPO.parent / "shared" / "data" / "aid-dev" / "AID"
EUROSAT_MS_DEV = REPO.parent / "shared" / "data" / "eurosat-ms-dev"
# the development sets: where each lies and the dataset settings a user would give for it
DATASETS = {"aid-dev": (AID_DEV, ["dataset=aid"]),
            "eurosat-ms-dev": (EUROSAT_MS_DEV, ["dataset=image_folder", "dataset.bands=all"])}
RSNET_ROWS = ("baseline", "esd_mbenet", "mgml_fenet")


def plain_loop(seed: int, args: argparse.Namespace) -> dict:
    """The reference recipe: timm model, SGD Nesterov + OneCycle, label smoothing, flips and 90° rotations."""
    from rsnet.data import build_datasets  # only for the identical split and decoded images

    data = build_datasets("aid", str(args.root), train_ratio=args.train_ratio, seed=seed, image_size=args.image_size,
                          check_counts=False)
    device = torch.device(args.device)
    mean = torch.tensor(data.mean).view(1, 3, 1, 1)  # ImageNet's, as rsnet's resnet18 uses
    std = torch.tensor(data.std).view(1, 3, 1, 1)

    def tensors(part) -> tuple[torch.Tensor, torch.Tensor]:
        images = np.stack([part.raw(i) for i in range(len(part))])
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255)
        return (x - mean) / std, torch.as_tensor(np.asarray(part.labels), dtype=torch.long)

    x_train, y_train = tensors(data.train)
    x_test, y_test = tensors(data.test)
    torch.manual_seed(seed)
    model = timm.create_model(args.backbone, num_classes=len(data.class_names)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps_per_epoch = -(-len(x_train) // args.batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, epochs=args.epochs,
                                                   steps_per_epoch=steps_per_epoch)
    generator = torch.Generator().manual_seed(seed)
    train_seconds = 0.0
    for _ in range(args.epochs):
        model.train()
        started = time.perf_counter()
        order = torch.randperm(len(x_train), generator=generator)
        for start in range(0, len(order), args.batch):
            batch = order[start:start + args.batch]
            x, y = x_train[batch].to(device, non_blocking=True), y_train[batch].to(device, non_blocking=True)
            if torch.rand(1, generator=generator) < 0.5:
                x = x.flip(3)
            x = torch.rot90(x, int(torch.randint(4, (1,), generator=generator)), dims=(2, 3))
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_seconds += time.perf_counter() - started
    model.eval()
    with torch.no_grad():
        predictions = torch.cat([model(x_test[i:i + 128].to(device)).argmax(1).cpu()
                                 for i in range(0, len(x_test), 128)])
    accuracy = 100.0 * float((predictions == y_test).float().mean())
    return {"main": accuracy, "ensemble": accuracy, "images_per_s": len(x_train) * args.epochs / train_seconds}


def rsnet_run(model: str, seed: int, args: argparse.Namespace, run_dir: Path) -> dict:
    """``scripts/train.py`` with the shipped defaults on aid-dev; test OA of the main branch and the ensemble."""
    overrides = [*DATASETS[args.dataset][1], f"dataset.root={args.root}", f"dataset.image_size={args.image_size}",
                 f"dataset.train_ratio={args.train_ratio}", f"backbone={args.backbone}", f"model={model}",
                 f"epochs={args.epochs}", f"seed={seed}", "log.progress_bar=false", f"hydra.run.dir={run_dir}",
                 # evaluation and TensorBoard images only at the end: they cost time and change no weight
                 f"eval_every={args.epochs}", f"log.attention_every={args.epochs}",
                 *([] if args.device == "cpu" else [f"trainer.devices=['{args.device}']"]), *args.set]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *overrides], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{model} seed {seed} failed:\n{done.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    figures = {"main": metrics["oa"]["main"], "ensemble": metrics["accuracy"], "images_per_s": metrics["images_per_s"],
               "heads": metrics["oa"]}
    if args.head_sets:
        figures["head_sets"] = head_set_accuracies(run_dir, args.head_sets)
    return figures


def head_set_accuracies(run_dir: Path, head_sets: list[str]) -> dict[str, float]:
    """Test OA of the logits' mean over each set of heads ("main+fem_s4_g2+..."; the heads a set names but this model
    lacks make it skipped) of the run's last checkpoint on the run's own test split: what a main branch that averaged
    those heads would score. The mean is taken of log-probabilities, whose arg-max is that of the logits' mean."""
    from rsnet.data.datasets import build_datasets_from_config
    from rsnet.data.raster import bands_from_metadata
    from rsnet.evaluation import evaluate
    from rsnet.model_loading import load_model

    loaded = load_model(run_dir / "checkpoints" / "last.pt")
    dataset = dict(loaded.train_config["dataset"], bands=bands_from_metadata(loaded.metadata.get("bands")))
    data = build_datasets_from_config(dataset, loaded.train_config["seed"], image_size=loaded.metadata["image_size"],
                                      split_file=run_dir / "split.json", mean=loaded.metadata["mean"],
                                      std=loaded.metadata["std"])
    result = evaluate(loaded.model, data.test, "cpu", batch_size=64)
    log_probabilities = {head: np.log(np.clip(p, 1e-12, None)) for head, p in result.probabilities.items()}
    accuracies = {}
    for head_set in head_sets:
        heads = head_set.split("+")
        if all(head in log_probabilities for head in heads):
            mean = sum(log_probabilities[head] for head in heads)
            accuracies[head_set] = 100.0 * float((mean.argmax(1) == result.targets).mean())
    return accuracies


def lane_command(args: argparse.Namespace, row: str, seed: int, json_path: Path) -> list[str]:
    """This script for one run (one row, one seed), with the measuring settings of ``args``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--dataset", args.dataset, "--root", str(args.root),
               "--rows", row,
               "--seeds", str(seed), "--epochs", str(args.epochs), "--image-size", str(args.image_size),
               "--train-ratio", str(args.train_ratio), "--backbone", args.backbone, "--batch", str(args.batch),
               "--device", args.device, "--json", str(json_path),
               *(["--head-sets", *args.head_sets] if args.head_sets else [])]
    return command + [part for override in args.set for part in ("--set", override)]


def run_in_lanes(args: argparse.Namespace, rows: list[str], seeds: list[int], tmp: Path) -> dict[str, list[dict]]:
    """Every (seed, row) run as a process of its own, ``args.lanes`` at a time: one run at 224 px leaves most of a
    GPU idle (start-up, caching, a ResNet-18 at batch 32). Results in seed order; the json after every run."""
    results: dict[str, list[dict | None]] = {row: [None] * len(seeds) for row in rows}
    failures: list[str] = []
    lock = threading.Lock()

    def one_run(seed_index: int, row: str) -> None:
        seed = seeds[seed_index]
        json_path = tmp / f"{row}_seed{seed}.json"
        done = subprocess.run(lane_command(args, row, seed, json_path), capture_output=True, text=True)
        with lock:
            if done.returncode != 0 or not json_path.exists():
                failures.append(f"{row} seed {seed} failed:\n{done.stderr[-3000:]}")
                return
            results[row][seed_index] = json.loads(json_path.read_text())[row][0]
            print(next(line for line in done.stdout.splitlines() if line.startswith(f"{row} seed {seed}:")),
                  flush=True)
            if args.json:
                args.json.write_text(json.dumps(finished(results), indent=1))

    with ThreadPoolExecutor(max_workers=args.lanes) as pool:
        for future in [pool.submit(one_run, index, row) for index in range(len(seeds)) for row in rows]:
            future.result()
    if failures:
        raise SystemExit("\n".join(failures))
    return finished(results)


def finished(results: dict[str, list[dict | None]]) -> dict[str, list[dict]]:
    """The runs that have finished, row by row, in seed order."""
    return {row: [run for run in runs if run is not None] for row, runs in results.items()}


def step_cost(args: argparse.Namespace) -> None:
    """Training step time of each model relative to the baseline (forward, loss, backward, SGD step), at 64 and
    224 px, in interleaved rounds (every model once per round) so drifts in machine load hit all alike."""
    from omegaconf import OmegaConf

    from rsnet.losses import MultiBranchLoss
    from rsnet.models import build_model, options_for_size

    print("\n| image size | batch | model | step (ms, median of rounds) | × baseline |\n|---|---|---|---|---|")
    for size, batch in ((64, 32), (224, 16)):
        torch.manual_seed(0)
        images, labels = torch.randn(batch, 3, size, size), torch.randint(30, (batch,))
        runners = {}
        for row in RSNET_ROWS:
            shipped = OmegaConf.load(REPO / "conf" / "model" / f"{row}.yaml")
            model = build_model(row, args.backbone, 30, **options_for_size(shipped.get("options", {}), size))
            criterion = MultiBranchLoss(**shipped.get("loss", {}))
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
            runners[row] = (model, criterion, optimizer)
        times: dict[str, list[float]] = {row: [] for row in RSNET_ROWS}
        for round_index in range(args.cost_rounds + 1):  # round 0 warms up
            for row in RSNET_ROWS[round_index % 3:] + RSNET_ROWS[:round_index % 3]:
                model, criterion, optimizer = runners[row]
                started = time.perf_counter()
                for _ in range(3):
                    loss = criterion(model(images), labels, epoch=10.0).total
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                if round_index:
                    times[row].append((time.perf_counter() - started) / 3 * 1000)
        base = statistics.median(times["baseline"])
        for row in RSNET_ROWS:
            median = statistics.median(times[row])
            spread = f"{min(times[row]):.0f}-{max(times[row]):.0f}"
            print(f"| {size} | {batch} | {row} | {median:.0f} ({spread}) | {median / base:.2f}× |", flush=True)


def report(results: dict[str, list[dict]]) -> None:
    """The table and the verdict lines."""
    print("\n| row | seeds | main-branch OA (%) | ensemble OA (%) | images/s | step cost vs baseline |")
    print("|---|---|---|---|---|---|")
    base_speed = statistics.mean(r["images_per_s"] for r in results["baseline"]) if "baseline" in results else None
    for row, runs in results.items():
        speed = statistics.mean(r["images_per_s"] for r in runs)
        cost = f"{base_speed / speed:.2f}×" if base_speed else "-"
        print(f"| {row} | {len(runs)} | {mean_std([r['main'] for r in runs])} | "
              f"{mean_std([r['ensemble'] for r in runs])} | {speed:.1f} | {cost} |")
    mean = {row: {key: statistics.mean(r[key] for r in runs) for key in ("main", "ensemble", "images_per_s")}
            for row, runs in results.items()}
    verdicts = []
    if {"plain", "baseline"} <= mean.keys():
        verdicts.append(("baseline ≥ plain loop", mean["baseline"]["main"] >= mean["plain"]["main"],
                         f"{mean['baseline']['main'] - mean['plain']['main']:+.2f} points"))
        ratio = mean["baseline"]["images_per_s"] / mean["plain"]["images_per_s"]
        verdicts.append(("baseline images/s ≥ 0.95 × plain", ratio >= 0.95, f"{ratio:.2f}×"))
    if "baseline" in mean:
        base = mean["baseline"]["main"]
        for row, key, gain in (("esd_mbenet", "main", 2.0), ("mgml_fenet", "ensemble", 2.0),
                               ("mgml_fenet", "main", 1.0)):
            if row in mean:
                verdicts.append((f"{row} {key} ≥ baseline + {gain:g}", mean[row][key] >= base + gain,
                                 f"{mean[row][key] - base:+.2f} points"))
    for row in ("esd_mbenet", "mgml_fenet"):
        if row in mean:
            gap = mean[row]["ensemble"] - mean[row]["main"]
            verdicts.append((f"{row} main within 1 point of its ensemble", gap <= 1.0, f"gap {gap:+.2f} points"))
    for name, ok, figure in verdicts:
        print(f"{'PASS' if ok else 'MISS'}  {name}: {figure}")
    for row, runs in results.items():
        head_sets = [head_set for head_set in runs[0].get("head_sets", {})
                     if all(head_set in r["head_sets"] for r in runs)]
        if head_sets:
            print(f"\n| {row}: mean of the heads' logits | OA (%) | gap to the ensemble (per seed) |\n|---|---|---|")
        for head_set in head_sets:
            gaps = [r["ensemble"] - r["head_sets"][head_set] for r in runs]
            print(f"| {head_set} | {mean_std([r['head_sets'][head_set] for r in runs])} | "
                  f"{statistics.mean(gaps):.2f} ({', '.join(f'{gap:.2f}' for gap in gaps)}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="aid-dev",
                        help="aid-dev (RGB, 150 px) or eurosat-ms-dev (13 bands, 64 px: rsnet rows only)")
    parser.add_argument("--root", type=Path, help="the set's folder (default: its place beside the project)")
    parser.add_argument("--rows", default="plain," + ",".join(RSNET_ROWS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--train-ratio", type=float, default=0.5)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--batch", type=int, default=32, help="batch of the plain loop (rsnet uses its batch_size)")
    parser.add_argument("--set", action="append", default=[], help="extra override for the rsnet rows (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--head-sets", nargs="+", default=[], metavar="HEAD+HEAD",
                        help="also score the mean of each set of heads' logits on the test split (e.g. "
                        "main+fem_s4_g2+fem_s3_g2+fem_s2_g4): what a main branch averaging them would score")
    parser.add_argument("--lanes", type=int, default=1, help="runs at a time, each a process of its own (one GPU "
                        "takes several: 6 processes trained 3 seeds x 4 rows at 224 px in 4 min on an H200); "
                        "images/s are then shared, not a speed figure")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where every row trains (default: the GPU if there is one)")
    parser.add_argument("--require-cuda", action="store_true", help="do nothing without a GPU (gpu_lease.py)")
    parser.add_argument("--step-cost", action="store_true", help="only measure each model's training step cost "
                        "relative to the baseline at 64 and 224 px (a few minutes)")
    parser.add_argument("--cost-rounds", type=int, default=7)
    parser.add_argument("--report", type=Path, nargs="+", help="print the table of --json files (of runs made in "
                        "parallel, e.g. one process for plain,baseline and one for the two models) and stop")
    args = parser.parse_args()
    if args.require_cuda and not torch.cuda.is_available():
        print("bench_recipe: no CUDA device visible, nothing measured (run it without --require-cuda for the CPU)")
        return
    if args.step_cost:
        step_cost(args)
        return
    if args.report:
        merged: dict[str, list[dict]] = {}
        for path in args.report:
            merged.update(json.loads(path.read_text()))
        report(merged)
        return
    args.root = args.root or DATASETS[args.dataset][0]
    if not args.root.is_dir():
        raise SystemExit(f"skipped: the {args.dataset} development set is not at '{args.root}' (pass --root DIR)")
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    if "plain" in rows and args.dataset != "aid-dev":
        raise SystemExit(f"the plain loop reads RGB aid-dev only: pass --rows {','.join(RSNET_ROWS)} "
                         f"for {args.dataset}")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    if args.lanes > 1:
        with tempfile.TemporaryDirectory(prefix="bench_recipe_lanes_") as tmp:
            report(run_in_lanes(args, rows, seeds, Path(tmp)))
        return
    results: dict[str, list[dict]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory(prefix="bench_recipe_") as tmp:
        for seed in seeds:
            for row in rows:
                started = time.perf_counter()
                figures = plain_loop(seed, args) if row == "plain" else rsnet_run(row, seed, args,
                                                                                   Path(tmp) / f"{row}_seed{seed}")
                results[row].append(figures)
                heads = ", ".join(f"{head} {oa:.2f}" for head, oa in
                                  {**figures.get("heads", {}), **figures.get("head_sets", {})}.items())
                print(f"{row} seed {seed}: main {figures['main']:.2f} %, ensemble {figures['ensemble']:.2f} %, "
                      f"{figures['images_per_s']:.1f} img/s ({time.perf_counter() - started:.0f} s)"
                      + (f"; heads: {heads}" if heads else ""), flush=True)
                if args.json:  # after every run, so a run killed at a time limit keeps what it finished
                    args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
