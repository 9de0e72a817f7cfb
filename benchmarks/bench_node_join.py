"""A node that joins a running torchrun job: one CPU node alone, against the same job with a second node started
``--late`` seconds after it (``--nnodes=1:2``), both as two torchrun agents on this machine, on real data (aid-dev).

Each run is ``scripts/train.py`` under torchrun: aid-dev at 64 px, train ratio 0.5, ``--backbone`` from scratch, batch
32, ``trainer=adaptive`` with one CPU worker of one torch thread per node. The second node joins at torchrun's next
rendezvous: both workers start again from the run's newest commit point, the newcomer is probed and gets work by its
speed. The arms alternate, seed after seed. Printed: the wall time of each (the first agent's start to the last
agent's end), the ratio alone / joined per seed, and what the run recorded of the join. torch's late join needs
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (set here).

    python benchmarks/bench_node_join.py     # test_resnet, 6 epochs, 2 seeds, the second node 20 s late
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AID_DEV = REPO.parent / "shared" / "data" / "aid-dev" / "AID"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="test_resnet")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--late", type=float, default=20.0, help="seconds between the two nodes' starts")
    parser.add_argument("--root", type=Path, default=AID_DEV)
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def job(run_dir: Path, seed: int, nodes: int, args: argparse.Namespace) -> dict:
    """One torchrun job of ``nodes`` agents (the second ``args.late`` s after the first); its wall time and record."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id=join-{seed}-{nodes}",
               "--rdzv-conf=last_call_timeout=1", str(REPO / "scripts" / "train.py"), "trainer=adaptive",
               "trainer.devices=[cpu]", "trainer.cpu_threads=1", "dataset=aid", f"dataset.root={args.root}",
               "dataset.image_size=64", "dataset.train_ratio=0.5", f"backbone={args.backbone}", "model=baseline",
               f"epochs={args.epochs}", f"eval_every={args.epochs}", "batch_size=32", f"seed={seed}",
               "log.progress_bar=false", f"log.attention_every={args.epochs + 1}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    started = time.perf_counter()
    agents = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)]
    if nodes == 2:
        time.sleep(args.late)  # the second node arrives late: what is measured, not a synchronisation
        agents.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True))
    errors = [agent.communicate()[1] for agent in agents]
    wall = time.perf_counter() - started
    if any(agent.returncode for agent in agents):
        raise SystemExit(f"seed {seed}, {nodes} node(s) failed:\n" + "\n".join(e[-2000:] for e in errors))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"seed": seed, "nodes": nodes, "wall_s": round(wall, 2), "accuracy": metrics["accuracy"],
            "workers_at_end": len(metrics["scheduler"]["workers"]), "changes": metrics.get("membership_changes", [])}


def main() -> None:
    args = parse_args()
    records = []
    for seed in range(args.seeds):
        for nodes in (1, 2):
            with tempfile.TemporaryDirectory(prefix="rsnet-join-") as tmp:
                records.append(job(Path(tmp) / "run", seed, nodes, args))
            print(json.dumps(records[-1]), flush=True)
    alone = [r for r in records if r["nodes"] == 1]
    joined = [r for r in records if r["nodes"] == 2]
    ratios = [a["wall_s"] / j["wall_s"] for a, j in zip(alone, joined)]
    print(f"\n{args.backbone}, aid-dev 64 px, {args.epochs} epochs; the second node {args.late:g} s late")
    print(f"one node alone: {statistics.mean(r['wall_s'] for r in alone):.1f} s; with the second joining: "
          f"{statistics.mean(r['wall_s'] for r in joined):.1f} s; alone / joined per seed: "
          + ", ".join(f"{ratio:.2f}" for ratio in ratios))


if __name__ == "__main__":
    main()
