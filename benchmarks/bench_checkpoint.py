"""What the checkpoint's SHA-256 costs: writing and reading a real-size training checkpoint with and without it.

The payload is what training writes each epoch (model weights and SGD momentum of ESD-MBENet on ResNet-50, 45
classes). Per round, interleaved: ``torch.save`` alone, ``save_checkpoint`` (hash + save), ``torch.load`` alone,
``load_checkpoint`` (load + verify), and ``content_digest`` alone. Prints median and range (seconds) and the
ratios with / without the hash.

    python benchmarks/bench_checkpoint.py [--backbone resnet50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rsnet.integrity import content_digest
from rsnet.models import build_model
from rsnet.checkpoint import load_checkpoint, save_checkpoint


def payload(backbone: str) -> dict:
    """A checkpoint's contents after one SGD step (so the optimizer holds its momentum buffers)."""
    model = build_model("esd_mbenet", backbone, 45)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).prediction_logits.sum().backward()
    optimizer.step()
    return {"model_config": model.model_config, "model_state": model.state_dict(),
            "optimizer_state": optimizer.state_dict(), "class_names": [f"c{i}" for i in range(45)],
            "image_size": 224, "mean": [0.5] * 3, "std": [0.5] * 3, "epoch": 1}


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    contents = payload(args.backbone)
    with tempfile.TemporaryDirectory() as folder:
        plain, hashed = Path(folder) / "plain.pt", Path(folder) / "hashed.pt"
        cases = {
            "torch.save": lambda: torch.save({"format_version": 2, **contents}, plain),
            "save_checkpoint (hash + save)": lambda: save_checkpoint(hashed, contents),
            "torch.load": lambda: torch.load(plain, weights_only=True),
            "load_checkpoint (load + verify)": lambda: load_checkpoint(hashed),
            "content_digest alone": lambda: content_digest(contents),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):  # interleaved: a noisy second hits every case alike
            for name, action in cases.items():
                times[name].append(timed(action))
        size_mb = hashed.stat().st_size / 1e6
    print(f"esd_mbenet/{args.backbone}, 45 classes, weights + SGD momentum: {size_mb:.0f} MB, {args.repeats} rounds")
    print("| case | median s | range s |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}–{max(values):.3f} |")
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"save with hash / without: {median['save_checkpoint (hash + save)'] / median['torch.save']:.2f}; "
          f"load with verify / without: {median['load_checkpoint (load + verify)'] / median['torch.load']:.2f}; "
          f"hash throughput {size_mb / median['content_digest alone']:.0f} MB/s")


if __name__ == "__main__":
    main()
