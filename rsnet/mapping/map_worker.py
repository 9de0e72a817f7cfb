"""One device's part of a map: for every scene in turn, claim chunks of windows while worth it, read them ahead on
the reader threads, classify them, store their probabilities in the scene's partial map; the worker that completes
a scene's last chunk writes its outputs on a writer thread while it goes on with the next scene."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from rsnet.integrity import file_digest
from rsnet.mapping.assemble import SceneSummary, assemble_scene
from rsnet.mapping.claims import ClaimBoard
from rsnet.mapping.forward import WindowClassifier
from rsnet.mapping.partial import MapLock, PartialMap, partial_folder
from rsnet.mapping.plan import RESTYLED_SUFFIXES, ScenePlan
from rsnet.mapping.reader import ChunkReader, block_cache
from rsnet.progress import progress_bar

if TYPE_CHECKING:
    from rsnet.inference import Predictor
    from rsnet.parallel.worker_setup import WorkerContext

PROBE_WINDOWS = 4  # windows a device classifies to measure its speed before its first claim (several devices)


@dataclass(frozen=True)
class PredictorSpec:
    """How each worker loads the model onto its own device."""

    checkpoint: str
    head: str | None = None
    tta: str = "none"
    max_pixels: int | None = None

    def load(self, device: torch.device) -> Predictor:
        from rsnet.inference import load_predictor

        return load_predictor(self.checkpoint, device, self.head, self.tta, max_pixels=self.max_pixels)


@dataclass(frozen=True)
class MapOptions:
    """``readers``: reader threads per worker; ``settings``: per scene, what its map depends on (a partial map or a
    complete one made with other settings is made again); ``progress``: a progress bar on stderr (the first
    worker's); ``amp``: a GPU's forward precision (none: float32, as on a CPU)."""

    readers: int
    settings: list[dict[str, Any]]
    progress: bool = True
    amp: str = "none"


@dataclass(frozen=True)
class SceneResult:
    """A scene's map as a worker reports it: complete already (verified) or made now, with its summary."""

    index: int
    skipped: bool
    summary: SceneSummary
    seconds: float


def map_worker(ctx: WorkerContext, source: Predictor | PredictorSpec, plans: list[ScenePlan],
               options: MapOptions) -> list[SceneResult]:
    """Map ``plans`` together with the other workers of ``ctx``; the first worker returns every scene's result."""
    store = dist.PrefixStore("rsnet_map", ctx.store)
    predictor = source.load(ctx.device) if isinstance(source, PredictorSpec) else source
    classifier = WindowClassifier(predictor, options.amp)
    board = ClaimBoard(store, ctx.rank, ctx.world_size, sum(plan.grid.windows for plan in plans))
    lanes = _ForwardLanes(ctx, store)
    meter = _Meter(_probe(ctx, classifier, board, plans[0].grid.batch_size) if ctx.world_size > 1 else 0.0)
    lanes.join()
    names, rgb = predictor.class_names, None if predictor.bands is None else list(predictor.bands.rgb)
    started = time.perf_counter()
    held: dict[int, MapLock] = {}  # the scenes this worker prepared, until they are written
    with ThreadPoolExecutor(1, thread_name_prefix="rsnet-map-writer") as writer, \
            progress_bar(total=board.total, unit="window", desc="mapping", leave=False, dynamic_ncols=True,
                         disable=not (options.progress and ctx.rank == 0)) as bar, _releasing(held):
        written: list[Future] = []
        for index, plan in enumerate(plans):
            if board.left_out:
                break
            settings = options.settings[index]
            if _prepare(store, board, index, plan, settings, len(names), rgb, held):
                continue
            partial = PartialMap(partial_folder(plan.out_dir, plan.stem), plan.grid, len(names), plan.canvas(rgb),
                                 ctx.device.type)
            _classify_scene(ctx, store, board, classifier, lanes, index, plan, partial, options.readers, meter, bar)
            if int(store.add(f"map/{index}/done", 0)) == plan.grid.chunks and _elected(store, f"map/{index}/write"):
                written.append(writer.submit(_write_scene, store, index, plan, partial, names, settings))
            else:
                partial.close()
            for future in written:
                if future.done():
                    future.result()  # a failed write stops this worker now
            for mapped in [mapped for mapped in held if store.check([f"map/{mapped}/result"])]:
                held.pop(mapped).release()
        lanes.leave()
        for future in written:
            future.result()
    if ctx.world_size > 1:
        print(f"worker {ctx.rank} ({ctx.device}): {meter.windows} windows classified in {meter.busy:.1f} s of "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    lanes.close()
    _finish(store, ctx.world_size)
    if ctx.rank != 0:
        return []
    return [_result(store, index) for index in range(len(plans))] if plans else []


class _Meter:
    """A worker's windows/s (the probe's until it has classified a chunk): windows classified over the seconds it
    spent classifying scenes (its lanes at work together), read on ``clock`` (seconds; a test feeds its own)."""

    def __init__(self, speed: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.speed, self.windows, self.busy = speed, 0, 0.0
        self._clock = clock
        self._since: float | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._since = self._clock()

    def stop(self) -> None:
        if self._since is not None:
            self.busy += self._clock() - self._since
            self._since = None

    def add(self, windows: int) -> None:
        with self._lock:
            self.windows += windows
            seconds = self.busy + (self._clock() - self._since if self._since is not None else 0.0)
            self.speed = self.windows / max(seconds, 1e-9)


def _classify_scene(ctx: WorkerContext, store: Any, board: ClaimBoard, classifier: WindowClassifier,
                    lanes: _ForwardLanes, index: int, plan: ScenePlan, partial: PartialMap, readers: int, meter: _Meter,
                    bar: Any) -> None:
    """Claim chunks of ``plan`` and classify them on this worker's lanes until the scene has none left or this worker
    is left out; ``readers`` chunks are read ahead of the lanes."""
    grid = plan.grid
    in_flight: deque[tuple[int, Future]] = deque()
    exhausted = False
    meter.start()
    with block_cache(plan, readers), \
            ChunkReader(classifier.predictor, plan, partial.canvas, readers) as reader:
        while True:
            while not exhausted and len(in_flight) < lanes.count + readers:
                held = sum(len(grid.chunk_windows(chunk)) for chunk, _ in in_flight)
                if not board.worth_claiming(meter.speed, held, grid.batch_size):
                    lanes.leave()
                    exhausted = True
                    break
                chunk = board.claim(index, grid.chunks)
                if chunk is None:
                    exhausted = True
                    break
                board.count_claimed(len(grid.chunk_windows(chunk)))
                if partial.is_done(chunk):  # classified before the map was interrupted, and proven
                    store.add(f"map/{index}/done", 1)
                    continue
                pixels = reader.submit(chunk)
                in_flight.append((chunk, lanes.submit(_classify_chunk, ctx, store, classifier, lanes, index, plan,
                                                      partial, chunk, pixels, meter, board)))
            if not in_flight:
                meter.stop()
                store.add(f"map/{index}/done", partial.commit())  # the records of this worker's last chunks
                return
            in_flight.popleft()[1].result()
            bar.update(int(store.add("map/classified", 0)) - bar.n)


def _classify_chunk(ctx: WorkerContext, store: Any, classifier: WindowClassifier, lanes: _ForwardLanes, index: int,
                    plan: ScenePlan, partial: PartialMap, chunk: int, reading: Future, meter: _Meter,
                    board: ClaimBoard) -> None:
    """On a lane: classify ``chunk`` once read, store its probabilities, count the chunks whose records are
    written done."""
    pixels = reading.result()
    tick = time.perf_counter()
    probabilities = np.full((len(pixels.kept), len(classifier.predictor.class_names)), np.nan, np.float32)
    with lanes.lane():
        probabilities[pixels.kept] = classifier(pixels.images)
    _simulated_delay(ctx, time.perf_counter() - tick)
    if committed := partial.write_chunk(chunk, probabilities, pixels.canvas):
        store.add(f"map/{index}/done", committed)
    store.add("map/classified", len(pixels.kept))
    meter.add(len(pixels.kept))
    board.publish_speed(meter.speed)


def _simulated_delay(ctx: WorkerContext, seconds: float, board: ClaimBoard | None = None,
                     clock: Callable[[], float] = time.perf_counter,
                     sleep: Callable[[float], None] = time.sleep) -> None:
    """A SIMULATED slow device (``slowdown``): sleep (slowdown - 1) × ``seconds``; a probe's sleep ends early once
    every window of the map is claimed (``board``). ``clock`` and ``sleep``: the time it is served on (a test feeds
    its own)."""
    until = clock() + (ctx.slowdown - 1.0) * seconds
    while clock() < until:
        if board is not None and board.remaining() <= 0:
            return
        sleep(min(0.02, max(until - clock(), 0.0)))


def _probe(ctx: WorkerContext, classifier: WindowClassifier, board: ClaimBoard, batch: int,
           delay: Callable[[WorkerContext, float, ClaimBoard | None], None] = _simulated_delay) -> float:
    """This device's windows/s on random windows (``classifier.probe``'s seconds, stretched by the SIMULATED
    ``slowdown``), published before its first claim (several devices). ``delay``: how the slowdown is served
    (a test feeds its own)."""
    windows = min(PROBE_WINDOWS, batch)
    seconds = classifier.probe(windows)
    delay(ctx, seconds, board)
    speed = windows / (seconds * ctx.slowdown)
    board.publish_speed(speed)
    return speed


def _prepare(store: Any, board: ClaimBoard, index: int, plan: ScenePlan, settings: dict[str, Any],
             classes: int, rgb: list[int] | None, held: dict[int, MapLock]) -> bool:
    """Whether scene ``index`` is complete already; one worker (the first to get here) holds the scene's lock
    (``held``), checks the scene against its record and, if not complete, opens (or starts afresh) its partial map,
    saying what it found wrong there; the others wait for its answer."""
    key = f"map/{index}/ready"
    if _elected(store, f"map/{index}/prepare"):
        held[index] = MapLock(plan.out_dir, plan.stem).acquire()
        started = time.perf_counter()
        record = verified_record(plan, settings)
        complete = record is not None
        if complete:
            board.count_claimed(plan.grid.windows)
            _publish(store, index, True, record, started)
            print(f"{plan.path}\tcomplete already (its files match {plan.outputs['map.json'].name}): skipped",
                  flush=True)
        else:
            partial, found = PartialMap.prepare(partial_folder(plan.out_dir, plan.stem), settings, plan.grid, classes,
                                                plan.canvas(rgb))
            partial.close()
            if found:
                print(found, file=sys.stderr, flush=True)
        store.set(key, "complete" if complete else "partial")
    return store.get(key) == b"complete"


def verified_record(plan: ScenePlan, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The record of ``plan``'s complete map where every output is on disk as it says (those GIS software rewrites:
    on disk), made with ``settings``; else None."""
    try:
        record = json.loads(plan.outputs["map.json"].read_text())
        complete = record["settings"] == settings and all(
            file_digest(plan.outputs[suffix]) == digest for suffix, digest in record["files"].items()) and all(
            plan.outputs[suffix].is_file() for suffix in RESTYLED_SUFFIXES)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if complete else None


def _write_scene(store: Any, index: int, plan: ScenePlan, partial: PartialMap, names: list[str],
                 settings: dict[str, Any]) -> None:
    started = time.perf_counter()
    try:
        partial.prove()  # every chunk's bytes match its record, else the folder is kept
        summary = assemble_scene(plan, partial, names, settings)
    finally:
        partial.close()
    partial.remove()
    record = {"grid": list(summary.grid), "windows": summary.windows, "shares": list(summary.shares)}
    _publish(store, index, False, record, started)
    rows, cols = summary.grid
    print(f"{plan.path}\twrote {plan.outputs['classes.tif']} (.aux.xml, .qml), _probabilities.tif, _preview.png, "
          f"_areas.csv: {rows} x {cols} cells, window {plan.grid.size} px ({plan.window_rule}), "
          f"stride {plan.grid.step} px, {summary.windows} windows", flush=True)


def _publish(store: Any, index: int, skipped: bool, record: dict[str, Any], started: float) -> None:
    shares = record.get("shares", [])
    store.set(f"map/{index}/result", json.dumps({"skipped": skipped, "grid": record["grid"],
                                                  "windows": record["windows"], "shares": shares,
                                                  "seconds": time.perf_counter() - started}))


def _result(store: Any, index: int) -> SceneResult:
    value = json.loads(store.get(f"map/{index}/result"))
    return SceneResult(index, value["skipped"], SceneSummary(tuple(value["grid"]), value["windows"],
                                                             tuple(value["shares"])), value["seconds"])


@contextmanager
def _releasing(held: dict[int, MapLock]) -> Iterator[None]:
    """Release the scenes' locks left in ``held`` when the block ends, however it ends."""
    try:
        yield
    finally:
        for lock in held.values():
            lock.release()


def _elected(store: Any, key: str) -> bool:
    """Whether this worker is the first to ask for ``key`` (one worker does each such job)."""
    return int(store.add(key, 1)) == 1


def _finish(store: Any, world_size: int) -> None:
    """Wait until every worker has finished (its scenes written), so the first one can report them all."""
    store.add("map/finished", 1)
    while int(store.add("map/finished", 0)) < world_size:
        time.sleep(0.02)


class _ForwardLanes:
    """Where a worker's chunks are classified: on a GPU one lane; on a CPU one lane per core this worker has, each
    forward on one thread (so a window's probabilities are the same bits on every CPU worker, whatever the number of
    workers and cores), the cores the launcher gave this host's CPU workers shared among those that classify (a
    worker still measuring its speed, or left out, lends its cores to the others)."""

    def __init__(self, ctx: WorkerContext, store: Any) -> None:
        self.store, self.on_cpu = store, ctx.device.type == "cpu"
        local_cpu = sum(1 for device in ctx.devices if str(device).split(":")[0] == "cpu") or 1
        self.cores = torch.get_num_threads() * local_cpu if self.on_cpu else 1
        self.key = f"map/cpu_workers/{socket.gethostname()}"
        self.joined = False
        self._threads = torch.get_num_threads()
        if self.on_cpu:
            torch.set_num_threads(1)
        self._pool = ThreadPoolExecutor(self.cores, thread_name_prefix="rsnet-map-lane")
        self._free, self._busy = threading.Condition(), 0

    @property
    def count(self) -> int:
        """The lanes this worker uses now."""
        if not self.on_cpu:
            return 1
        return max(1, self.cores // max(1, int(self.store.add(self.key, 0))))

    def submit(self, *args: Any) -> Future:
        return self._pool.submit(*args)

    @contextmanager
    def lane(self) -> Iterator[None]:
        """Hold one of the :attr:`count` lanes while classifying."""
        with self._free:
            while self._busy >= self.count:
                self._free.wait(0.05)
            self._busy += 1
        try:
            yield
        finally:
            with self._free:
                self._busy -= 1
                self._free.notify()

    def join(self) -> None:
        if self.on_cpu:
            self.store.add(self.key, 1)
            self.joined = True

    def leave(self) -> None:
        if self.joined:
            self.store.add(self.key, -1)
            self.joined = False

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.on_cpu:
            torch.set_num_threads(self._threads)
