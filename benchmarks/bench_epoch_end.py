"""What an epoch's end holds training: the seconds of ``finish_epoch`` on the training path with
``log.background_writes=false`` (checkpoints, metrics.json, TensorBoard, history and figures written there, as before)
and ``true`` (a snapshot there, the writes on the writer thread while the next epoch trains).

The payload is real-size: ESD-MBENet (or ``--model baseline``) on ResNet-50 with SGD momentum (about 250 MB), the
bundled UC-Merced sample at ``--size`` px, the shipped config, a real strategy, evaluation and TensorBoard logger in
a one-worker world. Per round the two settings run one after the other (interleaved), each a fresh run folder of
``--epochs`` epoch ends, ``--train-seconds`` of real SGD steps on the model between them (so the background writes
overlap training, and what they cost training shows in its steps/s); the last epoch end draws the attention maps
and the projector (as every ``log.attention_every`` epochs). Prints, per setting, the seconds an epoch end held
training (median, range) for plain epoch ends and those with the pictures, the training steps/s, the wait for the
writes at the run's end, and the ratios; with ``--device cuda`` also what the snapshot's copy costs: a blocking
copy per tensor vs pinned memory, non-blocking copies and one wait.

    python benchmarks/bench_epoch_end.py          # a CPU: 64 px, 5 rounds of 4 epoch ends, 4 s of training between
    python benchmarks/bench_epoch_end.py --device cuda --size 224 --batch 64 --rounds 3 --epochs 3 --train-seconds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from rsnet.engine.background_writer import BackgroundWriter
from rsnet.engine.epoch_end import RunState, evaluate_epoch, finish_epoch
from rsnet.engine.snapshot import host_snapshot
from rsnet.engine.trainer import load_data
from rsnet.losses import MultiBranchLoss
from rsnet.models import build_model, options_for_size
from rsnet.parallel import WorkerContext, build_strategy, launch
from rsnet.viz.tensorboard import TensorBoardLogger, pick_attention_images

SETTINGS = {"synchronous (false)": False, "background (true)": True}


def training_config(args: argparse.Namespace) -> dict[str, Any]:
    """rsnet-train's shipped config for this benchmark's model, data and device."""
    from hydra import compose, initialize_config_dir

    from rsnet.commands import conf_folder
    from rsnet.config_schema import register_schemas

    register_schemas()
    overrides = [f"model={args.model}", f"backbone={args.backbone}", "backbone.pretrained=false",
                 f"dataset.image_size={args.size}", f"batch_size={args.batch}", f"epochs={args.epochs}",
                 f"log.attention_every={args.epochs}", f"trainer.devices=[{args.device}]", "log.progress_bar=false"]
    with initialize_config_dir(config_dir=str(conf_folder()), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="config", overrides=overrides))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(action: Callable[[], Any], device: torch.device) -> float:
    started = time.perf_counter()
    action()
    synchronize(device)
    return time.perf_counter() - started


def measure(ctx: WorkerContext, config: dict[str, Any], args: argparse.Namespace, folder: str) -> dict[str, Any]:
    """The one worker: build the run's parts once, then the rounds of both settings."""
    config["run_dir"] = str(Path(folder) / "data")
    data = load_data(ctx, config, Path(config["run_dir"]))
    model = build_model(args.model, args.backbone, len(data.class_names), pretrained=False,
                        **options_for_size(config["model"]["options"], args.size)).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    strategy = build_strategy(config["trainer"], ctx, model, len(data.train), args.batch, int(config["seed"]))
    criterion = MultiBranchLoss(**config["model"]["loss"])
    images, labels = data.train.get_batch(list(range(args.batch)))
    images, labels = images.to(ctx.device), labels.to(ctx.device)

    def train_for(seconds: float) -> int:
        """Real SGD steps for ``seconds``; their number."""
        model.train()
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            optimizer.zero_grad(set_to_none=True)
            criterion(model(images), labels, epoch=1.0).total.backward()
            optimizer.step()
            synchronize(ctx.device)
            steps += 1
        return steps

    train_for(0.1)  # the momentum buffers exist: the payload is the real-size one from the first epoch end
    evaluation = evaluate_epoch(ctx, config, data, model, args.epochs)
    attention_ids = pick_attention_images(data.test.labels, config["log"]["attention_images"])
    held: dict[str, dict[str, list[float]]] = {name: {"plain": [], "pictures": [], "drain": [], "steps_per_s": []}
                                               for name in SETTINGS}
    for round_number in range(args.rounds):
        for name, background in SETTINGS.items():  # interleaved: a noisy second hits both settings alike
            config["run_dir"] = str(Path(folder) / f"round{round_number}_{background}")
            state, figures = RunState(), held[name]
            steps, trained = 0, 0.0
            with TensorBoardLogger(Path(config["run_dir"]) / "tensorboard") as tb:
                writer = BackgroundWriter(background)
                for epoch in range(1, args.epochs + 1):
                    started = time.perf_counter()
                    steps += train_for(args.train_seconds)
                    trained += time.perf_counter() - started
                    state.epoch, state.wall_time_s = epoch, state.wall_time_s + args.train_seconds
                    seconds = timed(lambda: finish_epoch(config, data, model, optimizer, strategy,
                                                         {"train/loss/total": 1.0}, state, tb, attention_ids,
                                                         evaluation, writer), ctx.device)
                    figures["pictures" if epoch == args.epochs else "plain"].append(seconds)
                figures["drain"].append(timed(writer.close, ctx.device))
            figures["steps_per_s"].append(steps / trained)
    payload_mb = (Path(folder) / "round0_True" / "checkpoints" / "last.pt").stat().st_size / 1e6
    copies = snapshot_copies(model, optimizer, args.rounds) if ctx.device.type == "cuda" else None
    return {"held": held, "payload_mb": payload_mb, "copies": copies}


def snapshot_copies(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rounds: int) -> dict[str, list[float]]:
    """Seconds to copy the checkpoint's tensors to the host: a blocking copy per tensor vs :func:`host_snapshot`."""
    state = {"model_state": model.state_dict(), "optimizer_state": optimizer.state_dict()}
    device = next(model.parameters()).device
    cases = {"blocking copy per tensor": lambda: blocking_copy(state),
             "pinned, non-blocking, one wait": lambda: host_snapshot(state)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds + 1):
        for name, action in cases.items():
            times[name].append(timed(action, device))
    return {name: values[1:] for name, values in times.items()}  # the first: allocations (pinned pool)


def blocking_copy(tree: Any) -> Any:
    """``tree`` with every tensor copied to the host one after the other, each copy waited for."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {key: blocking_copy(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [blocking_copy(value) for value in tree]
    return tree


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} | {min(values):.3f}–{max(values):.3f}"


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    held = result["held"]
    print(f"{args.model}/{args.backbone}, {args.size} px, SGD momentum: last.pt {result['payload_mb']:.0f} MB; device "
          f"{args.device}; {args.rounds} rounds x {args.epochs} epoch ends a setting, {args.train_seconds} s of "
          "training between them")
    print("| log.background_writes | epoch end held, s (median) | range | with attention maps + projector, s | "
          "range | training steps/s (median) | run end waits for the writes, s |\n|---|---|---|---|---|---|---|")
    for name, figures in held.items():
        print(f"| {name} | {spread(figures['plain'])} | {spread(figures['pictures'])} | "
              f"{statistics.median(figures['steps_per_s']):.3f} | {statistics.median(figures['drain']):.3f} |")
    sync, background = held["synchronous (false)"], held["background (true)"]
    ratio = {kind: statistics.median(background[kind]) / statistics.median(sync[kind])
             for kind in ("plain", "pictures")}
    speed = statistics.median(background["steps_per_s"]) / statistics.median(sync["steps_per_s"])
    print(f"background / synchronous, seconds held: {ratio['plain']:.2f} (plain epoch end), {ratio['pictures']:.2f} "
          f"(with the pictures); training steps/s: {speed:.2f}")
    # the writes share the host with training: the steps they cost count as training time too
    print(f"training time a plain epoch end costs: synchronous {statistics.median(sync['plain']):.3f} s held; "
          f"background {statistics.median(background['plain']):.3f} s held {args.train_seconds * (1 - speed):+.3f} s "
          "of steps the writes slowed")
    if result["copies"]:
        print("| snapshot copy to the host | median s | range s |\n|---|---|---|")
        for name, values in result["copies"].items():
            print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}–{max(values):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:0) for a GPU run")
    parser.add_argument("--model", default="esd_mbenet", choices=["esd_mbenet", "baseline"])
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--size", type=int, default=64, help="image size (px) of the data, steps and pictures")
    parser.add_argument("--batch", type=int, default=8, help="the training steps' batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epoch ends a setting per round; the last draws pictures")
    parser.add_argument("--train-seconds", type=float, default=4.0, help="training between two epoch ends")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible: no GPU epoch end to measure")
        return
    device = "cuda:0" if args.device == "cuda" else args.device
    args.device = device
    config = training_config(args)
    with tempfile.TemporaryDirectory(prefix="bench_epoch_end_") as folder:
        result = launch(measure, [device], config, args, folder)
    report(args, result)


if __name__ == "__main__":
    main()
