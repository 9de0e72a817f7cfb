"""Simulated scale: the adaptive scheduler against sync (DDP), a static split and the fastest device alone, for 2 to
64 workers.

Runs the discrete-event simulator of benchmarks/simulator/ (the scheduler's real claiming, tail rule and Schedule —
batch sizes, cadence, admission — with cost models for steps, store round trips and all-reduces) and prints Markdown
tables: per scenario samples/s of the strategies, adaptive's gain over the fastest device alone as a share of the
physical limit Σs/s_max, the ratios to sync, the idle fraction of the workers (mean / max), adaptive's update balance
(fewest / most updates of a worker), the workers it left out, the communication share of the wall time, and the merge
interval M above which its merges cost < 5 % of it.

    python benchmarks/sim_scheduler.py                   # every table (arithmetic: seconds)
    python benchmarks/sim_scheduler.py --quick           # fewer worker counts, shorter runs
    python benchmarks/sim_scheduler.py --validate outputs/bench_scheduler.jsonl   # simulated vs measured samples/s
                                                         # of the time-to-accuracy study's runs (bench_scheduler.py)
    python benchmarks/sim_scheduler.py --measure-cpu     # time the CPU profiles that benchmarks/simulator/ keeps
                                                         # (< 1 min)
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_scheduler  # noqa: E402 - a sibling script (benchmarks/ is on the path when this one runs)
from rsnet.commands import conf_folder  # noqa: E402
import simulator as sim  # noqa: E402 - benchmarks/simulator/, beside this script

# benchmarks/bench_scheduler.py's study: aid-dev at 64 px, 720 training images, baseline resnet18 (30 classes: 4.6 k
# parameters more than the 21-class spec, 0.04 % of the all-reduce), batch 32.
RESTART_S = 1.3  # seconds from a lost worker to the survivors' state loaded again: bench_lost_worker.py (CPU)
STUDY = {"samples": 720, "batch": 32, "model": sim.RESNET18_21}
# The strategies the simulator models, as the study runs them: trainer=static trains its first epoch at the equal
# split while it measures the speeds.
SIMULATORS = {"sync": sim.simulate_sync, "adaptive": sim.simulate_adaptive, "local_sgd": sim.simulate_local_sgd,
              "static": functools.partial(sim.simulate_static, measuring_epochs=1)}


def conf_yaml(*parts: str) -> dict:
    """One yaml file of conf/ (e.g. ``conf_yaml("trainer", "adaptive.yaml")``) as a dict."""
    folder = conf_folder()
    for part in parts:
        folder = folder.joinpath(part)
    return OmegaConf.to_container(OmegaConf.create(folder.read_text()))


SETTINGS = sim.SimSettings.from_configs(conf_yaml("trainer", "adaptive.yaml"), conf_yaml("trainer", "sync.yaml"),
                                        conf_yaml("trainer", "static.yaml"), conf_yaml("config.yaml")["batch_size"],
                                        conf_yaml("trainer", "local_sgd.yaml"))


# ----------------------------------------------------------------------------------------------- scenarios


def cpu_sweep(worlds: list[int], intervals: int) -> list[sim.Scenario]:
    """CPU workers (one per host, 10 GbE), every second one at 1/2 speed; 16 samples per worker and step."""
    return [sim.build_scenario(f"CPU x {w}, every 2nd at 1/2", _alternate(sim.CPU_RESNET18_64,
                               sim.CPU_RESNET18_64.slowed(2), w), sim.RESNET18_21, sim.ETHERNET_10G, 16, SETTINGS,
                               intervals)
            for w in worlds]


def gpu_sweep(worlds: list[int], intervals: int) -> list[sim.Scenario]:
    """Half A100, half V100 (nodes joined by InfiniBand), resnet50, 256 samples per worker and step."""
    return [sim.build_scenario(f"A100 + V100 x {w // 2} each", _alternate(sim.A100, sim.V100, w), sim.RESNET50,
                               sim.INFINIBAND, 256, SETTINGS, intervals) for w in worlds]


def mixes(intervals: int) -> list[sim.Scenario]:
    """Identical GPUs, two generations, a CPU among GPUs, one straggler: resnet50, 256 samples per worker."""
    cases = [("8 x A100 (identical)", [sim.A100] * 8, sim.NVLINK),
             ("4 x A100 + 4 x V100", [sim.A100] * 4 + [sim.V100] * 4, sim.INFINIBAND),
             ("8 x A100 + 1 CPU (16 cores)", [sim.A100] * 8 + [cpu16()], sim.LOOPBACK),
             ("8 x A100, one at 1/4", [sim.A100] * 7 + [sim.A100.slowed(4)], sim.NVLINK)]
    return [sim.build_scenario(name, devices, sim.RESNET50, link, 256, SETTINGS, intervals)
            for name, devices, link in cases]


def cpu_cores(profile: sim.DeviceProfile, count: int, efficiency: float) -> sim.DeviceProfile:
    """A one-thread CPU profile spread over ``count`` cores at parallel ``efficiency`` (an assumption)."""
    scale = 1.0 / (count * efficiency)
    return replace(profile, name=f"{profile.name} x{count} cores", a=profile.a * scale, c=profile.c * scale,
                   source=f"{profile.source}; {count} cores at {efficiency:.0%} parallel efficiency (assumed)")


def cpu16() -> sim.DeviceProfile:
    """The CPU worker of the GPU mix: a host's 16 cores training resnet50 at 224 px."""
    return cpu_cores(sim.CPU_RESNET50_224, 16, 0.75)


def _alternate(first: sim.DeviceProfile, second: sim.DeviceProfile, world: int) -> list[sim.DeviceProfile]:
    return [first if rank % 2 == 0 else second for rank in range(world)]


# ----------------------------------------------------------------------------------------------- tables


def _pair(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.1f} / {100 * max(values):.1f}"


def comparison_table(title: str, rows: list[sim.Comparison]) -> None:
    print(f"\n### {title}\n")
    print("| scenario | W | B | rounds | limit Σs/s_max | single /s | adaptive /s | sync /s | static /s "
          "| adaptive ÷ single | share of the limit | adaptive ÷ sync | static ÷ sync | idle % adaptive (mean / max) "
          "| idle % sync | update balance adaptive | left out | merge % adaptive | all-reduce % sync "
          "| M for merges < 5 % |")
    print("|---" * 20 + "|")
    for row in rows:
        sc, a, s, st, one = row.scenario, row.adaptive, row.sync, row.static, row.single
        gain = a.samples_per_s / one.samples_per_s
        print(f"| {sc.name} | {sc.world} | {a.round_batch} | {a.rounds} | {row.limit:.2f} | {one.samples_per_s:,.0f} "
              f"| {a.samples_per_s:,.0f} | {s.samples_per_s:,.0f} | {st.samples_per_s:,.0f} | {gain:.2f} "
              f"| {gain / row.limit:.2f} | {a.samples_per_s / s.samples_per_s:.2f} "
              f"| {st.samples_per_s / s.samples_per_s:.2f} | {_pair(a.idle)} | {_pair(s.idle)} "
              f"| {a.update_balance:.2f} | {a.active.count(False)} | {100 * a.comm_share:.2f} "
              f"| {100 * s.comm_share:.2f} | {row.threshold:,} |")


def batch_table(rows: list[sim.Comparison]) -> None:
    """Adaptive's batch sizes at the end of the run against the static split's (both add up to B)."""
    print("\n### Batch sizes: adaptive after the last merge vs static split\n")
    print("| scenario | adaptive, last interval (distinct sizes in rank order) | static split |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row.scenario.name} | {_sizes(row.adaptive.sizes[-1])} | {_sizes(row.static.sizes[0])} |")


def _sizes(sizes: list[int]) -> str:
    return " / ".join(map(str, dict.fromkeys(sizes)))


def profile_table() -> None:
    print("\n### Device profiles t(b) = a + c·b\n")
    print("| device | a ms | c ms/sample | samples/s at b | source |")
    print("|---|---|---|---|---|")
    for profile, batch in [(sim.A100, 256), (sim.V100, 256), (cpu16(), 8), (sim.CPU_RESNET50_224, 4),
                           (sim.CPU_RESNET18_64, 16)]:
        print(f"| {profile.name} | {1000 * profile.a:.2f} | {1000 * profile.c:.4f} | {profile.speed(batch):,.1f} at "
              f"{batch} | {profile.source} |")
    print("\n| link (assumed, but the last: measured) | bandwidth GB/s | latency µs |\n|---|---|---|")
    for link in (sim.NVLINK, sim.INFINIBAND, sim.ETHERNET_10G, sim.LOOPBACK, sim.LOOPBACK_2_CORES):
        print(f"| {link.name} | {link.bandwidth / 1e9:g} | {link.latency * 1e6:g} |")
    print(f"\nstore round trip: {sim.STORE_RTT_LOCAL_S * 1e6:.0f} µs on one host (measured), "
          f"{sim.STORE_RTT_LAN_S * 1e6:.0f} µs across hosts (assumed)")


# ----------------------------------------------------------------------------------------------- validation


def bench_scenario(profile: sim.DeviceProfile, scenario: str, epochs: int, setup: dict,
                   link: sim.Link) -> sim.Scenario:
    """A study scenario of bench_scheduler.py (its slowdown factors): CPU workers on one host, gloo over ``link``,
    the store on the same host."""
    devices = tuple(profile.slowed(s) if s != 1 else profile for s in bench_scheduler.SCENARIOS[scenario])
    return sim.Scenario("bench", devices, setup["model"], link, setup["samples"], epochs,
                        SETTINGS.with_batch(setup["batch"]), sim.STORE_RTT_LOCAL_S)


def calibrated(profile: sim.DeviceProfile, epochs: int, samples_per_s: float, setup: dict,
               link: sim.Link) -> sim.DeviceProfile:
    """``profile`` with c set so that simulated sync at 1:1 trains ``samples_per_s`` (sync's wall time is linear
    in c, so two simulations give it)."""
    def wall(c: float) -> float:
        return sim.simulate_sync(bench_scenario(replace(profile, c=c), "1:1", epochs, setup, link)).wall_s

    target = setup["samples"] * epochs / samples_per_s
    first, second = wall(profile.c), wall(2 * profile.c)
    return replace(profile, c=profile.c * (1 + (target - first) / (second - first)))


def validate(profile: sim.DeviceProfile, epochs: int, measured: dict[str, dict[str, float]],
             split: dict[str, list[float]], label: str, setup: dict, link: sim.Link = sim.LOOPBACK_2_CORES) -> None:
    """Simulated vs ``measured`` samples/s per scenario ("1:2", ...) and strategy, with ``profile`` as logged and
    with its c calibrated on sync at 1:1; how many runs are within 10 %; then adaptive's split of the samples and
    updates between the workers at 1:2 (per run) against ``split``."""
    fitted = calibrated(profile, epochs, measured["1:1"]["sync"], setup, link)
    print(f"\n### Validation: {label}\n")
    print(f"profile ({profile.source}): a = {1000 * profile.a:.2f} ms, c = {1000 * profile.c:.3f} ms/sample; "
          f"calibrated: c = {1000 * fitted.c:.3f} ms/sample; all-reduce: {link.name}, "
          f"{link.bandwidth / 1e9:.2g} GB/s, {link.latency * 1e6:.0f} µs; {epochs} epochs\n")
    print("| slowdown | strategy | measured /s | simulated /s | error % | simulated, calibrated /s | error % "
          "| ÷ sync: measured / simulated / calibrated |")
    print("|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"logged": [], "calibrated": []}
    adaptive_at_1_2 = None
    for scenario, strategies in measured.items():
        runs = {version: {name: SIMULATORS[name](bench_scenario(p, scenario, epochs, setup, link))
                          for name in strategies}
                for version, p in (("logged", profile), ("calibrated", fitted))}
        for name, real in strategies.items():
            speeds = {version: runs[version][name].samples_per_s for version in errors}
            error = {version: speed / real - 1 for version, speed in speeds.items()}
            for version in errors:
                errors[version].append(error[version])
            ratios = "n/a (no sync run)"
            if "sync" in strategies:
                ratios = " / ".join(f"{r:.2f}" for r in [real / strategies["sync"]]
                                    + [speeds[v] / runs[v]["sync"].samples_per_s for v in errors])
            print(f"| {scenario} | {name} | {real:.1f} | {speeds['logged']:.1f} | {100 * error['logged']:+.1f} "
                  f"| {speeds['calibrated']:.1f} | {100 * error['calibrated']:+.1f} | {ratios} |")
        if scenario == "1:2":
            adaptive_at_1_2 = runs["logged"]["adaptive"]
    print("\nwithin 10 % of measured: " + "; ".join(
        f"{sum(abs(e) <= 0.10 for e in errs)} of {len(errs)} runs {version}"
        for version, errs in (("as logged", errors["logged"]), ("calibrated", errors["calibrated"]))))
    print(f"\nadaptive at 1:2, per run, fast / slow worker: samples simulated "
          f"{_slash(adaptive_at_1_2.worker_samples)}, measured {_slash(split['samples'])}; updates simulated "
          f"{_slash(adaptive_at_1_2.updates)}, measured {_slash(split['updates'])}")


def _slash(values: list[float]) -> str:
    return " / ".join(f"{v:.0f}" for v in values)


def study_measurements(path: Path) -> tuple[dict[str, dict[str, float]], dict[str, list[float]], int]:
    """From bench_scheduler.py's JSON lines: per scenario, the mean samples/s over the seeds of each of sync,
    adaptive and static that ran (sync and adaptive at 1:2 and 1:1 are required); adaptive's mean samples and
    updates per worker at 1:2; and the runs' epochs."""
    records = list(bench_scheduler.load_results(path).values())
    measured: dict[str, dict[str, float]] = {}
    for scenario in bench_scheduler.SCENARIOS:
        for name in SIMULATORS:
            runs = [r for r in records if r["scenario"] == scenario and r["strategy"] == name]
            if runs:
                measured.setdefault(scenario, {})[name] = statistics.mean(map(bench_scheduler.samples_per_s, runs))
    for scenario in ("1:2", "1:1"):
        for name in ("sync", "adaptive"):
            if name not in measured.get(scenario, {}):
                raise SystemExit(f"{path}: no {name} run at {scenario} (run bench_scheduler.py --scenarios 1:2 1:1)")
    runs = [r for r in records if r["scenario"] == "1:2" and r["strategy"] == "adaptive"]
    split = {field: [statistics.mean(values) for values in zip(*(r[key] for r in runs))]
             for field, key in (("samples", "worker_samples"), ("updates", "updates"))}
    return measured, split, int(runs[0]["epochs"])


# ----------------------------------------------------------------------------------------------- measuring


def time_steps(backbone: str, image_size: int, batches: list[int], repeats: int) -> dict[int, float]:
    """Seconds of the real training step (rsnet baseline model, its loss, the configured timm optimizer) on random
    images, one torch thread, at each batch size: the fastest of ``repeats`` steps (as timeit does: the other
    work on a shared host only ever adds time)."""
    from rsnet.engine.optim import build_optimizer
    from rsnet.losses import MultiBranchLoss
    from rsnet.models import build_model

    torch.set_num_threads(1)
    config = OmegaConf.create(conf_yaml("config.yaml"))
    loss_conf = OmegaConf.create(conf_yaml("model", "baseline.yaml")).loss
    model = build_model("baseline", backbone, 21)
    criterion = MultiBranchLoss(**OmegaConf.to_container(loss_conf))
    optimizer = build_optimizer(model, OmegaConf.to_container(config.optimizer))
    fastest = {}
    for batch in batches:
        images, labels = torch.randn(batch, 3, image_size, image_size), torch.randint(0, 21, (batch,))
        seconds = []
        for _ in range(repeats + 1):  # the first step warms up
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            criterion(model(images), labels).total.backward()
            optimizer.step()
            seconds.append(time.perf_counter() - started)
        fastest[batch] = min(seconds[1:])
    return fastest


def measure_profile(name: str, backbone: str, image_size: int, batches: list[int], processes: int = 1,
                    repeats: int = 5) -> sim.DeviceProfile:
    """Least-squares a + c·b over the step times, averaged over ``processes`` timing at the same time."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        runs = pool.starmap(time_steps, [(backbone, image_size, batches, repeats)] * processes)
    times = [statistics.mean(run[b] for run in runs) for b in batches]
    profile = sim.fit_profile(name, batches, times)
    print(f"{name}: a={profile.a:.5f} c={profile.c:.6f}  (steps: "
          + ", ".join(f"t({b})={t:.3f}s" for b, t in zip(batches, times)) + f"; {processes} process(es))", flush=True)
    return profile


def store_round_trip(calls: int = 500) -> float:
    """Median seconds of TCPStore.add on 127.0.0.1."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, 1, True)
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        store.add("sim/rtt", 1)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _time_allreduce(ctx, sizes: list[int], repeats: int) -> dict[int, float]:
    """One worker of measure_loopback: the least seconds of a gloo all-reduce of each size (bytes of float32) over
    ``repeats`` (the least, as timeit does: a shared host only ever adds time, and a worker that arrives late
    from the barrier makes a median of a few repeats noisy)."""
    import torch.distributed as dist

    least = {}
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4)
        dist.all_reduce(tensor)  # warm-up: gloo sets up its buffers for this size
        seconds = []
        for _ in range(repeats):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor)
            seconds.append(time.perf_counter() - started)
        least[nbytes] = min(seconds)
    return least


def measure_loopback(world: int = 2, sizes: tuple[int, ...] = (1 << 20, 4 << 20, 12 << 20, 25 << 20),
                     repeats: int = 9) -> sim.Link:
    """The all-reduce link of ``world`` gloo processes on this host, started by rsnet's launcher with one torch
    thread each (as the benchmarks' workers): the least seconds per size, least squares of
    t = 2(W - 1)/W · bytes / bandwidth + W · latency."""
    from rsnet.parallel import launch

    least = launch(_time_allreduce, ["cpu"] * world, list(sizes), repeats, backend="gloo", cpu_threads=1)
    volume = [2 * (world - 1) / world * nbytes for nbytes in sizes]
    fit = sim.fit_profile("link", volume, [least[n] for n in sizes])
    link = sim.Link(f"gloo, {world} processes on this host", 1.0 / fit.c, fit.a / world)
    print(f"loopback all-reduce ({world} gloo processes, 1 thread each): "
          + ", ".join(f"{n / 2**20:g} MiB {1000 * least[n]:.1f} ms" for n in sizes)
          + f" -> bandwidth {link.bandwidth / 1e9:.2f} GB/s, latency {link.latency * 1e6:.0f} µs", flush=True)
    return link


def measure_all() -> None:
    """The profiles benchmarks/simulator/costs.py keeps, and the study's step timed in 2 processes at once (as its 2
    workers share the host)."""
    started = time.perf_counter()
    measure_profile("CPU_RESNET18_64", "resnet18", 64, [8, 16, 24, 32])
    measure_profile("CPU_RESNET50_224", "resnet50", 224, [1, 2, 3, 4], repeats=3)
    measure_profile("resnet18 64px, 2 processes", "resnet18", 64, [8, 16, 24, 32], processes=2)
    print(f"STORE_RTT_LOCAL_S: {store_round_trip():.2e}")
    measure_loopback()
    print(f"(measured in {time.perf_counter() - started:.0f} s)")


def membership_table(intervals: int, restart_s: float) -> None:
    """A device lost at 30 % of the run's samples, and one more joining at 50 %: the time to train every sample (the
    same samples as the undisturbed run) against that run and against the survivors alone from the start."""
    cases = [("4 x A100 + 4 x V100 (resnet50): an A100 lost, a V100 joining", [sim.A100] * 4 + [sim.V100] * 4,
              sim.A100, sim.V100, sim.RESNET50, sim.INFINIBAND, 256),
             ("CPU x 4, every 2nd at 1/2 (resnet18, 64 px): a full-speed one lost, a half-speed one joining",
              _alternate(sim.CPU_RESNET18_64, sim.CPU_RESNET18_64.slowed(2), 4), sim.CPU_RESNET18_64,
              sim.CPU_RESNET18_64.slowed(2), sim.RESNET18_21, sim.ETHERNET_10G, 16)]
    print(f"\n## Devices that come and go: a device lost at 30 % of the run, one joining at 50 % ({restart_s:g} s a "
          "restart)\n")
    print("| run | undisturbed s | lost at 30 % | lost at 30 %, one joining at 50 % "
          "| the survivors alone from the start | samples trained again |\n|---|---|---|---|---|---|")
    for name, devices, lost, joining, model, link, batch in cases:
        scenario = sim.build_scenario(name, devices, model, link, batch, SETTINGS, intervals)
        whole = sim.simulate_adaptive(scenario).wall_s
        departed = sim.simulate_membership(scenario, [sim.Change(0.3, lost)], restart_s)
        both = sim.simulate_membership(scenario, [sim.Change(0.3, lost), sim.Change(0.5, joining, joins=True)],
                                       restart_s)
        survivors = list(devices)
        survivors.remove(lost)
        alone = sim.simulate_adaptive(replace(scenario, devices=tuple(survivors))).wall_s
        print(f"| {name} | {whole:.1f} | {departed.wall_s:.1f} ({departed.wall_s / whole:.2f}x) | {both.wall_s:.1f} "
              f"({both.wall_s / whole:.2f}x) | {alone:.1f} ({alone / whole:.2f}x) | {departed.retrained} of "
              f"{scenario.samples * scenario.epochs} |")


# ----------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="W = 2, 8 and 10 merge intervals per run")
    parser.add_argument("--intervals", type=int, default=100, help="merge intervals per simulated run")
    parser.add_argument("--validate", type=Path, default=None, metavar="STUDY",
                        help="simulated vs measured samples/s of the runs of bench_scheduler.py in this JSON-lines "
                             "file (sync, adaptive and static; sync and adaptive at 1:2 and 1:1 required)")
    parser.add_argument("--measure-cpu", action="store_true",
                        help="time the CPU profiles kept in benchmarks/simulator/costs.py")
    parser.add_argument("--membership", action="store_true",
                        help="only the table of a run that loses and gains a device")
    parser.add_argument("--restart-s", type=float, default=RESTART_S, help="seconds a change of devices costs")
    args = parser.parse_args()
    if args.membership:
        membership_table(10 * (10 if args.quick else args.intervals), args.restart_s)
        return
    if args.measure_cpu:
        measure_all()
        return
    if args.validate:
        measured, split, epochs = study_measurements(args.validate)
        validate(sim.CPU_RESNET18_64, epochs, measured, split, f"the time-to-accuracy study ({args.validate})", STUDY)
        return
    started = time.perf_counter()
    worlds, intervals = ([2, 8], 10) if args.quick else ([2, 4, 8, 16, 64], args.intervals)
    profile_table()
    cpu, gpu, mixed = cpu_sweep(worlds, intervals), gpu_sweep(worlds, intervals), mixes(intervals)
    rows = {title: [sim.compare(s) for s in scenarios] for title, scenarios in
            [("CPU workers (baseline resnet18, 64 px), every second one at 1/2 speed", cpu),
             ("GPUs: half A100, half V100 (resnet50)", gpu), ("Mixes (resnet50)", mixed)]}
    for title, comparisons in rows.items():
        comparison_table(title, comparisons)
    batch_table([row for comparisons in rows.values() for row in comparisons if row.scenario.world <= 9])
    membership_table(10 * intervals, args.restart_s)  # long enough runs for a change to pay off
    print(f"\n({intervals} merge intervals per run; simulated in {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
