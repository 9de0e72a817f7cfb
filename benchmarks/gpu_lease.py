"""The measurements to make whenever a GPU machine is at hand for a few minutes, in one command of at most 8.5 minutes
(``--budget``), most wanted first: a real-size epoch (aid-dev repeated to 10,800 training images, ResNet-50 at 224 px,
batch 256, evaluated every epoch; the GPU alone and with the machine's CPU as a second worker: whole epochs against
training, and the pair against the GPU alone), rsnet's evaluation against a plain inference loop and the training
step, ``compile=true`` against eager for ResNet-50 and ResNet-18, what an epoch's end holds training, a profile of the
training step and of a real epoch, and the steady-state step benchmark. The full ``make gpu-check`` does not fit a
few minutes; this is its measurement half and more, sized to fit. One more step fills a lease alone and is run only
when named: ``recipe_224``, the recipe check of ``bench_recipe.py`` at 224 px (aid-dev, seeds 0-2, the plain loop and
the three models, 30 epochs), six runs at a time on the one GPU (``--lanes 6``: about 4 minutes on an H200, where one
run after the other took about 4.4 minutes a seed); ``recipe_224_no_heads`` before it, MGML-FENet without heads
(``model.options.main_heads=[]``) at 224 px (seeds 0-2, three runs at a time): the arm the default (auto: ``s2_g4``
on resnet18) is compared with.

What must lie beside the checkout on the GPU machine (it may reach no package index, and aid-dev lies outside the
checkout): ``.whl/``, the wheels of rsnet's dependencies that a CUDA PyTorch image lacks, and ``.aid-dev/``, a copy of
aid-dev; ``bash benchmarks/prepare_gpu_lease.sh`` makes both (git-ignored, about 37 MB). Then, on the GPU machine, in
the checkout: ``python3 benchmarks/gpu_lease.py``.

Every step runs in its own process group with a time limit (the smaller of its own and what is left of
``--budget``); its output goes to ``OUT/<step>.md`` (``--out``; default ``gpu-lease-out/``)
and to stdout, the machine's GPU, driver and libraries to ``OUT/machine.md`` (8 files in all). Standard library
only: it runs before the wheels it installs are importable.

    bash benchmarks/prepare_gpu_lease.sh                  # on a machine with the dev venv and a package index
    python3 benchmarks/gpu_lease.py                       # on the GPU machine, .whl and .aid-dev beside the checkout
    python3 benchmarks/gpu_lease.py --steps gpu_profile --budget 120      # one step again
    python3 benchmarks/gpu_lease.py --steps recipe_224_no_heads recipe_224 --budget 580   # the recipe check at 224 px
                                                   # (MGML-FENet without heads first; a lease alone)
    python benchmarks/gpu_lease.py --stand-in --root DIR  # tiny CPU versions of every step (tests this script)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_group import run_in_group
from real_size_set import build_real_size_set

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SITE = Path("/tmp/rsnet-lease-site")

# name, seconds at most, arguments on the GPU, arguments of the CPU stand-in; most wanted first. Placeholders: ROOT
# (--root, aid-dev), REAL (the real-size set built from it), OUT (--out)
STEPS: list[tuple[str, int, list[str], list[str]]] = [
    ("scene_map", 240,  # a map on the GPU vs its forward rate, then the GPU alone vs beside the CPU (whole runs)
     ["bench_scene_map.py", "--device", "cuda", "--size", "20000", "--window", "128", "--backbone", "resnet18",
      "--image-size", "128", "--batch", "256", "--rounds", "2", "--beside-cpu", "--no-memory"],
     ["bench_scene_map.py", "--size", "1024", "--window", "256", "--rounds", "1", "--forward-batches", "2",
      "--no-memory"]),
    ("real_size_epoch", 280,  # the GPU alone, then with the CPU beside it, evaluated every epoch; each run <= 130 s
     ["gpu_throughput.py", "--root", "REAL", "--backbone", "resnet50", "--batch-size", "256", "--sizes", "224",
      "--configs", "1gpu", "gpu+cpu", "--epochs", "4", "--eval-every", "1", "--timeout", "130"],
     ["gpu_throughput.py", "--cpu-stand-in", "--root", "REAL", "--backbone", "test_resnet", "--batch-size", "16",
      "--sizes", "32", "--configs", "1gpu", "gpu+cpu", "--epochs", "2", "--eval-every", "1", "--timeout", "150"]),
    ("bench_eval", 80,  # rsnet's evaluation vs a plain inference loop, and vs the training step
     ["bench_eval.py", "--require-cuda", "--backbone", "resnet50", "--size", "224", "--amp", "bf16", "--train-step",
      "--step-batch", "256", "--rounds", "3", "--steps", "30", "--warmup", "5"],
     ["bench_eval.py", "--device", "cpu", "--backbone", "test_resnet", "--size", "32", "--images", "64", "--rounds",
      "1", "--batch", "16"]),
    ("bench_compile_resnet50", 130,  # compile=true vs eager, steady steps and compile seconds
     ["bench_compile.py", "--require-cuda", "--backbone", "resnet50", "--batch", "256", "--rounds", "1", "--steps",
      "30", "--warmup", "5", "--modes", "static", "eager"],
     ["bench_compile.py", "--device", "cpu", "--backbone", "test_resnet", "--size", "32", "--batch", "4",
      "--steps", "2", "--warmup", "1", "--rounds", "1", "--modes", "eager", "--amp", "none"]),
    ("bench_compile_resnet18", 100,
     ["bench_compile.py", "--require-cuda", "--backbone", "resnet18", "--batch", "256", "--rounds", "1", "--steps",
      "50", "--warmup", "5", "--modes", "static", "eager"],
     ["bench_compile.py", "--device", "cpu", "--backbone", "test_resnet", "--size", "32", "--batch", "4",
      "--steps", "2", "--warmup", "1", "--rounds", "1", "--modes", "eager", "--amp", "none"]),
    ("bench_epoch_end", 70,  # the seconds an epoch's end holds training, writes on the path vs in the background
     ["bench_epoch_end.py", "--device", "cuda", "--size", "224", "--batch", "64", "--rounds", "2", "--epochs", "3",
      "--train-seconds", "3"],
     ["bench_epoch_end.py", "--device", "cpu", "--model", "baseline", "--backbone", "test_resnet", "--size", "32",
      "--rounds", "1", "--epochs", "2", "--train-seconds", "0.2"]),
    ("gpu_profile", 130,  # its trace stays on the machine: what comes back is 8 files at most
     ["gpu_profile.py", "--require-cuda", "--part", "step", "epoch", "--root", "REAL", "--epoch", "2",
      "--trace", "/tmp/rsnet-profile-trace.json.gz"],
     ["gpu_profile.py", "--device", "cpu", "--backbone", "test_resnet", "--size", "32", "--batch", "8", "--steps",
      "2", "--warmup", "1", "--part", "step", "epoch", "--root", "REAL", "--epoch", "2", "--top", "5",
      "--trace", "OUT/profile_trace.json.gz"]),
    ("bench_step_resnet50", 100,
     ["bench_step.py", "--require-cuda", "--backbone", "resnet50", "--sizes", "224", "--batches", "128", "256",
      "--steps", "50", "--warmup", "10", "--rounds", "2", "--input-steps", "10"],
     ["bench_step.py", "--device", "cpu", "--backbone", "test_resnet", "--sizes", "32", "--batches", "8",
      "--steps", "2", "--warmup", "1", "--rounds", "1"]),
    ("recipe_224_no_heads", 150,  # MGML-FENet without heads at 224 px, against recipe_224's default (auto), alone
     ["bench_recipe.py", "--require-cuda", "--root", "ROOT", "--image-size", "224", "--lanes", "3", "--rows",
      "mgml_fenet", "--set", "model.options.main_heads=[]", "--json", "OUT/recipe_224_no_heads.json"],
     ["bench_recipe.py", "--device", "cpu", "--root", "ROOT", "--image-size", "32", "--backbone", "test_resnet",
      "--epochs", "1", "--seeds", "0", "--rows", "mgml_fenet", "--set", "model.options.main_heads=[]"]),
    ("recipe_224", 570,  # run alone (--steps recipe_224 --budget 580): the recipe check at 224 px, not in the default
     ["bench_recipe.py", "--require-cuda", "--root", "ROOT", "--image-size", "224", "--lanes", "6",
      "--json", "OUT/recipe_224.json"],
     ["bench_recipe.py", "--device", "cpu", "--root", "ROOT", "--image-size", "32", "--backbone", "test_resnet",
      "--epochs", "1", "--seeds", "0", "--rows", "plain,mgml_fenet", "--lanes", "2"]),
]
# steps left out of the default list: the recipe check fills a lease of its own; the step benchmark was measured on
# an H200 (docs/benchmarks.md) and makes room for the map's (8 files come back at most)
ALONE = {"recipe_224_no_heads", "recipe_224", "bench_step_resnet50"}


def install_wheels(wheels: Path) -> str | None:
    """pip-install the carried wheels into SITE (no index, no dependency resolution); the folder to put on
    PYTHONPATH, or None when nothing was carried."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        return None
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, found)])
    if done.returncode != 0:
        raise SystemExit(f"gpu_lease: the wheels in {wheels} do not install on this Python ({sys.version.split()[0]}):"
                         " build them for it with LEASE_PYTHON=X.Y bash benchmarks/prepare_gpu_lease.sh")
    return str(SITE)


def machine_facts(env: dict[str, str]) -> str:
    """GPU, driver, torch and the libraries rsnet runs under, as the device machine reports them."""
    probe = ("import torch, timm, albumentations, hydra, cv2, numpy; "
             "print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version()); "
             "print('GPU:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'); "
             "print('timm', timm.__version__, 'albumentations', albumentations.__version__, 'hydra', "
             "hydra.__version__, 'opencv', cv2.__version__, 'numpy', numpy.__version__); "
             "print('CPU cores:', __import__('os').cpu_count())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                          "--format=csv"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    return done.stdout + done.stderr[-2000:] + (smi.stdout if smi else "nvidia-smi: not found\n")


def run_step(name: str, arguments: list[str], limit: float, out: Path, env: dict[str, str]) -> int | None:
    """One benchmark in its own process group, killed with its group after ``limit`` seconds; its exit status
    (None: timed out). The output lands in out/<name>.md."""
    with open(out / f"{name}.md", "w") as sink:
        command = [sys.executable, str(BENCH / arguments[0]), *arguments[1:]]
        return run_in_group(command, REPO, limit, sink, subprocess.STDOUT, env)


def placeholders(arguments: list[str], values: dict[str, str]) -> list[str]:
    """``arguments`` with ROOT, REAL and a leading OUT/ replaced by their values."""
    return [values[a] if a in values else values["OUT"] + a[3:] if a.startswith("OUT/") else a for a in arguments]


def real_size_set(root: Path, min_train: int, folder: Path) -> Path:
    """The real-size set (aid-dev repeated through links, at least ``min_train`` training images at AID's train
    ratio) in ``folder``/AID."""
    target = folder / "AID"
    made = build_real_size_set(root, target, min_train, train_ratio=0.5)
    print(f"real-size set: {made} images ({made // 2} for training) linked from {root} into {target}", flush=True)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "gpu-lease-out")
    parser.add_argument("--root", type=Path, default=REPO / ".aid-dev" / "AID", help="aid-dev's class folders")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="wheels to install first, if any")
    parser.add_argument("--budget", type=float, default=510, help="seconds for all steps together")
    parser.add_argument("--steps", nargs="+", choices=[step[0] for step in STEPS],
                        default=[step[0] for step in STEPS if step[0] not in ALONE],
                        help=f"default: every step but {', '.join(sorted(ALONE))}, which fills a lease alone")
    parser.add_argument("--real-min-train", type=int, help="training images per epoch of the real-size set "
                        "(default: 10,000; 200 with --stand-in)")
    parser.add_argument("--stand-in", action="store_true", help="tiny CPU versions of every step (tests this script)")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    site = install_wheels(args.wheels)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), site, os.environ.get("PYTHONPATH")]))}
    facts = machine_facts(env)
    (args.out / "machine.md").write_text(facts)
    print(facts, flush=True)
    chosen = [step for step in STEPS if step[0] in args.steps]
    values = {"ROOT": str(args.root.resolve()), "OUT": str(args.out.resolve())}
    needs_real_size = any("REAL" in (stand_in if args.stand_in else on_gpu) for _, _, on_gpu, stand_in in chosen)
    if needs_real_size and not args.root.is_dir():
        print(f"gpu_lease: --root {args.root} is not a folder: point it at aid-dev's class folders (.aid-dev/AID "
              "beside the checkout, made by benchmarks/prepare_gpu_lease.sh)")
        return 2
    # this run's own folder: two leases (or two test processes) at once never read or replace each other's set
    with tempfile.TemporaryDirectory(prefix="rsnet-real-size-") as folder:
        if needs_real_size:
            min_train = args.real_min_train or (200 if args.stand_in else 10_000)
            values["REAL"] = str(real_size_set(args.root.resolve(), min_train, Path(folder)))
        return run_steps(chosen, values, args, deadline, env)


def run_steps(chosen: list[tuple[str, int, list[str], list[str]]], values: dict[str, str], args: argparse.Namespace,
              deadline: float, env: dict[str, str]) -> int:
    """Run each chosen step within its limit and what is left of the budget; 1 if any failed or timed out."""
    failed = 0
    for name, limit, on_gpu, stand_in in chosen:
        arguments = placeholders(stand_in if args.stand_in else on_gpu, values)
        allowed = min(limit, deadline - time.monotonic())
        if allowed < 20:
            print(f"== {name}: skipped, {allowed:.0f} s of the budget left", flush=True)
            continue
        started = time.monotonic()
        status = run_step(name, arguments, allowed, args.out, env)
        outcome = "timed out" if status is None else f"exit {status}"
        failed += status != 0
        print(f"== {name}: {outcome} after {time.monotonic() - started:.0f} s (limit {allowed:.0f} s)\n"
              f"{(args.out / f'{name}.md').read_text()[-3000:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
