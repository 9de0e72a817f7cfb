"""Map a region: every scene of a list on every device given, each scene checked first, the work shared out by
speed, resumable, a mosaic of a folder's class maps at the end (docs/usage.md, Mapping a scene)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rsnet.mapping.mosaic import write_mosaics
from rsnet.mapping.partial import MapLock
from rsnet.mapping.plan import ScenePlan, plan_scene, whole_number
from rsnet.mapping.map_worker import MapOptions, PredictorSpec, SceneResult, map_worker
from rsnet.precision import check_amp

if TYPE_CHECKING:
    from rsnet.inference import Predictor

log = logging.getLogger("rsnet.map")


@dataclass(frozen=True)
class SceneMap:
    """A scene's map: its files, the window and stride in raster pixels and the rule that chose the window, the grid
    of cells, the windows classified, the share of the mapped area per class, whether it was complete already
    (verified, not made again) and the seconds its outputs took to write."""

    raster: Path
    classes_path: Path
    probabilities_path: Path
    preview_path: Path
    areas_path: Path
    record_path: Path
    window: int
    stride: int
    window_rule: str
    grid: tuple[int, int]
    windows: int
    shares: tuple[float, ...]
    skipped: bool
    seconds: float

    @property
    def classes(self) -> np.ndarray:
        """The class of every cell (read from the class map; :attr:`nodata` where no window was classified)."""
        from rsnet.data.raster import open_raster

        with open_raster(self.classes_path) as src:
            return src.read(1)

    @property
    def nodata(self) -> int:
        from rsnet.data.raster import open_raster

        with open_raster(self.classes_path) as src:
            return int(src.nodata)


def map_scenes(model: Predictor | str | os.PathLike, rasters: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
               window: int | None = None, stride: int | None = None, batch_size: int = 32,
               devices: Sequence[str] | None = None, readers: int | None = None, progress: bool = True,
               model_id: str | None = None, launch_options: dict[str, Any] | None = None,
               head: str | None = None, tta: str = "none", max_pixels: int | None = None,
               amp: str = "none") -> list[SceneMap]:
    """Map ``rasters`` into ``out_dir`` with ``model`` (a loaded :class:`~rsnet.inference.Predictor`, or a
    checkpoint or export, loaded with ``head``, ``tta`` and ``max_pixels`` on each device) on ``devices`` (default:
    the predictor's device, else the best one here); ``readers`` reader threads per device (default 2). Every scene
    is checked before any window is classified; a scene complete already (its record and files agree, same
    settings) is skipped, one interrupted continues where it stopped (from the chunks its partial map proves), one
    that another process maps into ``out_dir`` now is refused (ValueError). ``model_id`` names the model in the
    settings a map is resumed with (default: its description; the command line adds a digest of the model's file).
    ``launch_options``: the launcher's ``timeout_s``, ``slowdown``, ``backend``, ``cpu_threads``; ``amp``: a GPU's
    forward precision (none: float32; bf16, fp16: faster, and a cell may differ where two classes nearly tie).
    Returns the maps in the order of ``rasters``; a folder of several georeferenced scenes also gets
    ``mosaic_classes.vrt``."""
    from rsnet.devices import resolve_device
    from rsnet.inference import Predictor, load_predictor
    from rsnet.parallel.launcher import WorkerError, launch

    out_dir = Path(out_dir)
    batch_size = whole_number("batch_size", batch_size)
    readers = 2 if readers is None else whole_number("readers", readers)
    check_amp(amp)
    if isinstance(model, Predictor):
        predictor, spec = model, None
        devices = [str(predictor.device)] if devices is None else list(devices)
        if len(devices) > 1:
            raise ValueError(f"devices={devices}: each device loads the model itself; pass the checkpoint's path, "
                             "not a loaded predictor")
    else:
        devices = [str(resolve_device("auto"))] if devices is None else list(devices)
        spec = PredictorSpec(str(model), head, tta, max_pixels)
        if len(devices) == 1:
            predictor = load_predictor(model, devices[0], head, tta, max_pixels=max_pixels)
        else:
            predictor = _planning_predictor(spec)
    plans = [plan_scene(predictor, raster, out_dir, window, stride, batch_size) for raster in rasters]
    _check_distinct(plans)
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 alone: the ranks' checks would meet
        for plan in plans:  # a scene another process maps now: refused before any work (the workers hold the locks)
            MapLock(plan.out_dir, plan.stem).acquire().release()
    identity = model_id or predictor.description
    settings = [_settings(plan, predictor, identity, amp) for plan in plans]
    started = time.perf_counter()
    source = predictor if len(devices) == 1 else spec
    try:
        results = launch(map_worker, devices, source, plans, MapOptions(readers, settings, progress, amp),
                         **(launch_options or {}))
    except WorkerError as error:
        if isinstance(error.cause, ValueError):  # a map that cannot be proved, bad input: one line, as on one device
            raise error.cause from None
        raise
    maps = [_scene_map(plan, result) for plan, result in zip(plans, results)]
    if len(plans) > 1:
        for mosaic in write_mosaics([scene.classes_path for scene in maps], out_dir):
            print(f"wrote {mosaic}: a mosaic of the class maps", flush=True)
    log.info("mapped %d scene(s) in %.1f s", len(plans), time.perf_counter() - started)
    return maps


def map_scene(predictor: Predictor, raster: str | os.PathLike, out_dir: str | os.PathLike, window: int | None = None,
              stride: int | None = None, batch_size: int = 32, progress: bool = True,
              readers: int | None = None) -> SceneMap:
    """Map one scene on the predictor's device (see :func:`map_scenes`)."""
    return map_scenes(predictor, [raster], out_dir, window, stride, batch_size, readers=readers,
                      progress=progress)[0]


def _planning_predictor(spec: PredictorSpec) -> Predictor:
    """The model on the CPU for planning the scenes: its image size, footprint, bands and classes (no window is
    classified here). Each worker loads the model itself on its device; the workers are started from a fork server
    (a fresh single-threaded interpreter), never forked from this process, so none inherits its thread pools and the
    model loads here as it does anywhere else."""
    import torch

    return spec.load(torch.device("cpu"))


def _settings(plan: ScenePlan, predictor: Predictor, model_id: str, amp: str) -> dict[str, Any]:
    """What a scene's map depends on: the raster (path, size, time), the model, the window, stride and chunks, and a
    GPU's forward precision."""
    stat = plan.path.stat()
    return {"scene": str(plan.path.resolve()), "scene_bytes": stat.st_size, "scene_mtime_ns": stat.st_mtime_ns,
            "model": model_id, "classes": list(predictor.class_names), "bands": list(plan.indexes),
            "window": plan.grid.size, "stride": plan.grid.step, "batch_size": plan.grid.batch_size, "amp": amp}


def _check_distinct(plans: Sequence[ScenePlan]) -> None:
    seen: dict[str, Path] = {}
    for plan in plans:
        if plan.stem in seen:
            raise ValueError(f"{seen[plan.stem]} and {plan.path} would both be mapped to "
                             f"{plan.out_dir / plan.stem}_*: rename one, or map them into separate folders")
        seen[plan.stem] = plan.path


def _scene_map(plan: ScenePlan, result: SceneResult) -> SceneMap:
    outputs = plan.outputs
    return SceneMap(plan.path, outputs["classes.tif"], outputs["probabilities.tif"], outputs["preview.png"],
                    outputs["areas.csv"], outputs["map.json"], plan.grid.size, plan.grid.step, plan.window_rule,
                    tuple(result.summary.grid), result.summary.windows, result.summary.shares, result.skipped,
                    result.seconds)
