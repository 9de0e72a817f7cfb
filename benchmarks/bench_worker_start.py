"""How workers start: many launches in a row of 3 and 4 CPU workers, each timed from the launch to the end of the
first training step, with the workers forked from the launcher (``fork``) and from the fork server
(``forkserver``, what rsnet uses), interleaved, beside busy processes.

A worker forked from the launcher inherits whatever lock another of its threads held at the moment of the fork
(the elastic agent's store, the watchdog, torch's pools): most starts are fast, a few may hang for ever. A start
that has not finished its first step after ``--deadline`` seconds is counted as a hang (the launch's timeout stops
it). Each start is one ``rsnet.parallel.launch`` in this process (as the test suite launches them); the first start
of ``forkserver`` includes starting the fork server, and is reported apart.

    python benchmarks/bench_worker_start.py                          # 200 starts of each kind beside 2 busy processes
    python benchmarks/bench_worker_start.py --starts 20 --busy 0
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsnet.parallel import elastic  # noqa: E402
from rsnet.parallel.launcher import launch  # noqa: E402
from rsnet.parallel.worker_setup import WorkerContext  # noqa: E402


def first_step(ctx: WorkerContext) -> float:
    """One training step of a small CNN, its gradients averaged over the workers; returns when every worker has
    taken it (the all-reduce waits for all)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 10))
    loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 3, 32, 32)), torch.randint(0, 10, (8,)))
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return time.time()


def one_start(workers: int, method: str, deadline_s: float) -> float | None:
    """Seconds from the launch to the end of the first step, or None when the start hung past ``deadline_s``."""
    chosen = elastic.start_method
    elastic.start_method = (lambda fn: "fork") if method == "fork" else chosen
    started = time.time()
    try:
        finished = launch(first_step, ["cpu"] * workers, timeout_s=deadline_s, cpu_threads=1)
        return finished - started
    except elastic.WorkerError as error:
        print(f"  {workers} workers, {method}: no first step after {time.time() - started:.0f} s: "
              f"{str(error).splitlines()[0]}", flush=True)
        return None
    finally:
        elastic.start_method = chosen


def _busy() -> None:
    while True:
        pass


def summary(times: list[float | None]) -> str:
    done = sorted(t for t in times if t is not None)
    hangs = len(times) - len(done)
    if not done:
        return f"| {len(times)} | {hangs} | – | – | – |"
    p95 = done[min(len(done) - 1, int(0.95 * len(done)))]
    return f"| {len(times)} | {hangs} | {statistics.median(done):.2f} | {p95:.2f} | {done[-1]:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=200, help="starts of each kind (workers × method)")
    parser.add_argument("--workers", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--methods", nargs="+", default=["fork", "forkserver"], choices=["fork", "forkserver"])
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the launches")
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds after which a start counts as hung")
    args = parser.parse_args()
    busy = [multiprocessing.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    kinds = [(w, m) for w in args.workers for m in args.methods]
    times: dict[tuple[int, str], list[float | None]] = {kind: [] for kind in kinds}
    first: dict[tuple[int, str], float | None] = {}
    began = time.time()
    try:
        for index in range(args.starts + 1):  # interleaved: a noisy minute hits every kind alike
            for kind in kinds:
                seconds = one_start(*kind, args.deadline)
                if index == 0:
                    first[kind] = seconds  # the fork server's own start-up is in forkserver's first
                else:
                    times[kind].append(seconds)
            if index % 20 == 0:
                print(f"{index}/{args.starts} rounds, {time.time() - began:.0f} s", flush=True)
    finally:
        for process in busy:
            process.terminate()
    print(f"\n{args.starts} starts of each kind beside {args.busy} busy processes on {multiprocessing.cpu_count()} "
          f"cores; seconds from launch to the end of the first step (first start apart)\n")
    print("| workers | start method | starts | hangs | median s | p95 s | worst s | first start s |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, values in times.items():
        head = first[kind]
        print(f"| {kind[0]} | {kind[1]} {summary(values)} {'hung' if head is None else f'{head:.2f}'} |")


if __name__ == "__main__":
    main()
