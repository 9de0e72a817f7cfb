"""The measurements a lent GPU session makes, in one device call that fits the lease (about 8 minutes of a 15-minute
device budget, so a failed start can be rerun): the steady-state step benchmark for ResNet-18 and ResNet-50 at
224 px (the issue's (b)/(c) target), ResNet-18 at 128 px, multi-epoch adaptive runs on aid-dev, and the compile
comparison. The full ``make gpu-check`` (18 training runs, 300-step benchmarks, three compile rounds) does not fit
one lease; this is its measurement half, sized to fit, most wanted first.

Every step runs in its own process group with a time limit (the smaller of its own and what is left of
``--budget``); its output goes to ``OUT/<step>.md`` (``$OUT`` on the device machine) and to stdout. Standard
library only: it runs before the wheels it installs are importable.

    bash benchmarks/prepare_gpu_lease.sh                  # here: wheels (.whl) and a copy of aid-dev (.aid-dev)
    run(command="python3 benchmarks/gpu_lease.py", carry=[".whl", ".aid-dev"], timeout_s=600)   # the device call
    python benchmarks/gpu_lease.py --stand-in --root DIR  # tiny CPU versions of every step (tests this script)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from process_group import run_in_group

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SITE = Path("/tmp/rsnet-lease-site")

# name, seconds at most, arguments on the GPU, arguments of the CPU stand-in; ROOT is replaced by --root
STEPS: list[tuple[str, int, list[str], list[str]]] = [
    ("bench_step_resnet18", 150,
     ["bench_step.py", "--require-cuda", "--sizes", "224", "128", "--batches", "128", "256", "--steps", "100",
      "--warmup", "20", "--rounds", "2"],
     ["bench_step.py", "--device", "cpu", "--backbone", "test_resnet", "--sizes", "48", "--batches", "8",
      "--steps", "2", "--warmup", "1", "--rounds", "1"]),
    ("bench_step_resnet50", 110,
     ["bench_step.py", "--require-cuda", "--backbone", "resnet50", "--sizes", "224", "--batches", "128", "256",
      "--steps", "50", "--warmup", "10", "--rounds", "2"],
     ["bench_step.py", "--device", "cpu", "--backbone", "test_resnet", "--sizes", "32", "--batches", "8",
      "--steps", "2", "--warmup", "1", "--rounds", "1"]),
    ("gpu_throughput", 120,  # 2 runs of at most 50 s each: a run is killed by the script, not left behind
     ["gpu_throughput.py", "--root", "ROOT", "--sizes", "128", "224", "--configs", "1gpu", "--epochs", "4",
      "--timeout", "50"],
     ["gpu_throughput.py", "--cpu-stand-in", "--root", "ROOT", "--sizes", "32", "--configs", "1gpu", "--epochs",
      "2", "--backbone", "test_resnet", "--batch-size", "16", "--timeout", "120"]),
    ("bench_compile", 200,
     ["bench_compile.py", "--require-cuda", "--rounds", "1", "--steps", "50", "--warmup", "5", "--modes", "static",
      "dynamic", "eager"],  # the comparison wanted first, should the limit stop it
     ["bench_compile.py", "--device", "cpu", "--backbone", "test_resnet", "--size", "32", "--batch", "4",
      "--steps", "2", "--warmup", "1", "--rounds", "1", "--modes", "eager", "--amp", "none"]),
]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", REPO / "gpu-lease-out")))
    parser.add_argument("--root", type=Path, default=REPO / ".aid-dev" / "AID", help="aid-dev's class folders")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="wheels to install first, if any")
    parser.add_argument("--budget", type=float, default=480, help="seconds for all steps together")
    parser.add_argument("--steps", nargs="+", choices=[step[0] for step in STEPS], default=[step[0] for step in STEPS])
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
    failed = 0
    for name, limit, on_gpu, stand_in in STEPS:
        if name not in args.steps:
            continue
        arguments = [str(args.root.resolve()) if a == "ROOT" else a for a in (stand_in if args.stand_in else on_gpu)]
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
