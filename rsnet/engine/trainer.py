"""The training run: checks, worker launch, and each worker's run (data, model, strategy, resume, the epochs, the
divergence message); one epoch's loop is in :mod:`rsnet.engine.epoch_loop`."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from rsnet.checkpoint import load_checkpoint, run_checkpoint_path
from rsnet.data import DataBundle, build_datasets_from_config
from rsnet.data.shared_decode import load_decoded_once
from rsnet.engine.acceleration import set_deterministic, tune_convolutions, use_channels_last
from rsnet.engine.background_writer import BackgroundWriter, writes_in_background
from rsnet.engine.config_checks import check_devices, check_resume_identity, check_run_dir, check_training_config
from rsnet.engine.epoch_end import (TORCHRUN_JOB_KEY, RunState, checkpoint_payload, evaluate_epoch,
                                    finish_epoch)
from rsnet.engine.epoch_loop import (NonFiniteLossError, _last_good_checkpoint, _lr_ratio, _seed_generators,
                                     group_train_scalars, train_one_epoch)
from rsnet.engine.membership import launch_through_losses
from rsnet.engine.merge_commit import COMMIT_NAME, POSITION_KEY, MergeCommits, committed_position, resume_point
from rsnet.engine.fresh_start import SET_ASIDE, put_back_or_drop_an_unfinished_set_aside, set_aside_earlier_run
from rsnet.engine.optim import build_optimizer
from rsnet.engine.run_lock import hold_run_dir, share_run_dir
from rsnet.files import disk_full_named
from rsnet.losses import MultiBranchLoss
from rsnet.models import backbone_data_config, build_model, options_for_size
from rsnet.parallel import WorkerContext, build_strategy, launch, launch_options
from rsnet.parallel.strategies import Strategy
from rsnet.parallel.launcher import started_by_torchrun
from rsnet.parallel.worker_setup import sigterm_ignored
from rsnet.viz.tensorboard import TensorBoardLogger, pick_attention_images

log = logging.getLogger(__name__)



def train(config: dict[str, Any], on_accepted: Callable[[Path], None] | None = None) -> dict[str, Any] | None:
    """Run a whole training job from a resolved config; return the final metrics (None on a torchrun rank other than 0).
    ``on_accepted(run_dir)`` runs on the primary once every check has passed and the run dir is held."""
    trainer = config["trainer"]
    devices = resolve_devices(trainer["devices"])
    workers = int(os.environ["WORLD_SIZE"]) if started_by_torchrun() else len(devices)
    check_training_config(config, num_workers=workers)
    run_dir = Path(config["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    primary = os.environ.get("RANK", "0") == "0" or not started_by_torchrun()
    point = _this_torchrun_jobs_point(run_dir)
    with hold_run_dir(run_dir) if primary and not point else nullcontext():
        if point:  # torchrun started this worker again (a worker lost, a node that left or joined): go on from it
            change = {"torchrun_restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), "workers": workers,
                      "resumed_from": point.name}
            config = {**config, "trainer": {**trainer, "lose_worker": None}}  # a simulated loss happened
            return launch(run_worker, devices, config, str(point), change, **launch_options(trainer))
        if primary:
            put_back_or_drop_an_unfinished_set_aside(run_dir)
        resume_from = check_run_dir(run_dir, bool(config["resume"]), bool(config["overwrite"]))
        if resume_from:
            # checked here, before any worker starts (a damaged file is refused, not trained on): its SHA-256
            saved = load_checkpoint(resume_from, mmap=True, verify=True)
            check_resume_identity(config, saved["config"], resume_from)
            if int(saved["epoch"]) >= int(config["epochs"]):
                log.warning("resume=true: the run in %s has trained %d of epochs=%d, so nothing is left to train; "
                            "its figures follow (pass a larger epochs= to train on)", resume_from, saved["epoch"],
                            config["epochs"])
                return json.loads((run_dir / "metrics.json").read_text()) if primary else None
        with set_aside_earlier_run(run_dir) if primary and not resume_from else nullcontext() as set_aside:
            if set_aside:
                log.info("starting afresh in %s: the earlier run's %s are set aside in %s/ until this run's first "
                         "checkpoint (put back if it stops before)", run_dir, ", ".join(set_aside), SET_ASIDE)
            if primary and on_accepted is not None:
                on_accepted(run_dir)
            return launch_through_losses(run_worker, devices, config, str(resume_from) if resume_from else None,
                                         launch_options(trainer))


def _this_torchrun_jobs_point(run_dir: Path) -> Path | None:
    """Under torchrun, the run dir's newest resume point where this torchrun job (``TORCHELASTIC_RUN_ID``, the
    ``--rdzv-id``) wrote it: torchrun has started this worker again, after a failure (``--max-restarts``) or for a node
    that joined or left (``--nnodes=MIN:MAX``, which counts no restart); else None."""
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    point = resume_point(run_dir) if started_by_torchrun() and job else None
    if point is None or load_checkpoint(point, mmap=True).get(TORCHRUN_JOB_KEY) != job:
        return None
    load_checkpoint(point, mmap=True, verify=True)  # its SHA-256, as a resume's: the workers load it unverified
    return point


def resolve_devices(devices: list[str] | str | None) -> list[str]:
    """``auto``/None: every visible GPU, else one CPU worker; a name or a list as given (:func:`check_devices`), a
    bare ``cuda`` as ``cuda:0`` (NCCL wants each worker's device with its index)."""
    if devices in (None, "auto"):
        count = torch.cuda.device_count()
        return [f"cuda:{index}" for index in range(count)] or ["cpu"]
    names = [str(devices)] if isinstance(devices, str) else [str(device) for device in devices]
    check_devices(names)
    return ["cuda:0" if name == "cuda" else name for name in names]


def run_worker(ctx: WorkerContext, config: dict[str, Any], resume_from: str | None,
               change: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """One worker's whole run (:func:`_train`), holding the run dir's workers' lock until it ends: a new run there
    is refused until the last worker is gone, even when the launcher was killed before them. ``change``: the
    membership change this launch follows (a lost worker, a torchrun restart), for the run's history."""
    with share_run_dir(Path(config["run_dir"])):
        return _train(ctx, config, resume_from, change)


def _train(ctx: WorkerContext, config: dict[str, Any], resume_from: str | None,
           change: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Data, model, strategy, epochs; the primary evaluates, saves, and commits the merges."""
    run_dir = Path(config["run_dir"])
    seed = int(config["seed"])
    if ctx.world_size > 1:  # tqdm's default lock is a multiprocessing semaphore, leaked when a worker is stopped
        tqdm.set_lock(threading.RLock())
    set_deterministic(config)
    tune_convolutions(config, ctx.device)
    torch.manual_seed(seed)  # identical initial replicas on every worker
    data = load_data(ctx, config, run_dir)
    model = build_model(config["model"]["arch"], config["backbone"]["name"], len(data.class_names),
                        pretrained=config["backbone"]["pretrained"], in_chans=data.channels,
                        **options_for_size(config["model"]["options"], config["dataset"]["image_size"])).to(ctx.device)
    if use_channels_last(config, ctx.device):
        model = model.to(memory_format=torch.channels_last)
    criterion = MultiBranchLoss(**config["model"]["loss"])
    optimizer = build_optimizer(model, config["optimizer"])
    strategy = build_strategy(config["trainer"], ctx, model, len(data.train), config["batch_size"], seed)
    strategy.follow_lr(lambda position: _lr_ratio(config, position), int(config["epochs"]))
    # merged_before: samples of the first epoch trained before the resume
    state, merged_before = _resume(ctx, resume_from, model, optimizer, strategy, len(data.train), change)
    tb = TensorBoardLogger(run_dir / "tensorboard", enabled=ctx.is_primary)
    attention_ids = pick_attention_images(data.test.labels, config["log"]["attention_images"])
    final: dict[str, Any] | None = None
    writer = BackgroundWriter(writes_in_background(config["log"]["background_writes"], ctx.device))
    commits = MergeCommits(run_dir) if ctx.is_primary and strategy.commits_merges else None
    # TensorBoard's writer thread reports a full disk as a bare OSError; leaving the block waits for the writes
    with disk_full_named(run_dir), tb, writer, _divergence_naming_the_written_checkpoint(writer, run_dir), \
            _closing_commits(commits, ctx.is_primary, run_dir):
        for epoch in range(state.epoch, config["epochs"]):
            _seed_generators(seed, ctx.rank, epoch)  # each epoch as in a run never stopped: a resumed one trains alike
            started, wall_before = time.perf_counter(), state.wall_time_s

            def commit() -> None:  # after each merge: the run as it stands, the epoch's merged samples with it
                state.wall_time_s = wall_before + time.perf_counter() - started
                commits.offer(lambda: {**checkpoint_payload(config, data, model, optimizer, strategy, state),
                                       POSITION_KEY: strategy.epoch_merged})

            meter = train_one_epoch(ctx, config, epoch, data, strategy, criterion, optimizer, writer,
                                    on_merge=commit if commits is not None else None)
            state.wall_time_s = wall_before + time.perf_counter() - started
            state.epoch = epoch + 1
            # every worker: its shard, in proportion to its measured speed
            evaluation = evaluate_epoch(ctx, config, data, model, state.epoch, strategy.work_shares())
            train_scalars = group_train_scalars(ctx, meter, merged_before)
            merged_before = 0
            if ctx.is_primary:
                final = finish_epoch(config, data, model, optimizer, strategy, train_scalars, state, tb,
                                     attention_ids, evaluation, writer) or final
            if ctx.world_size > 1:
                dist.barrier()  # no worker claims the next epoch's samples while the primary logs and saves
        if ctx.is_primary and ctx.world_size > 1:
            log.info("%s", strategy.summary())
    return final  # the last epoch is always evaluated (a resume with no epoch left is refused before launch)


def _resume(ctx: WorkerContext, resume_from: str | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            strategy: Strategy, samples: int, change: dict[str, Any] | None) -> tuple[RunState, int]:
    """The run's state from ``resume_from`` (a checkpoint or a merge's commit; None: a fresh one) loaded into the
    model, optimizer and strategy, with ``change`` (the membership change this launch follows) recorded; and the
    samples of its epoch already merged."""
    state, merged = RunState(), 0
    if resume_from:
        # train() checked its SHA-256 before any worker started: not hashed again per worker
        checkpoint = load_checkpoint(resume_from, map_location=ctx.device, verify=False)
        model.load_state_dict(checkpoint["model_state"])
        optimizer.load_state_dict(checkpoint["optimizer_state"])
        strategy.load_state_dict(checkpoint["strategy_state"])
        merged = committed_position(checkpoint)
        strategy.resume_within_epoch(merged)
        state = RunState.from_checkpoint(checkpoint)
        log.info("resumed from %s: %s", resume_from, _where(checkpoint, samples))
    if change is not None:
        lost_at = change.get("lost_at")  # seconds from the loss to the state loaded again
        state.changes.append({**{key: value for key, value in change.items() if key != "lost_at"},
                              **({"restart_s": round(time.time() - lost_at, 2)} if lost_at else {})})
    return state, merged


def load_data(ctx: WorkerContext, config: dict[str, Any], run_dir: Path) -> DataBundle:
    """Build the config's datasets (decoded once per machine; the run's split, saved by the primary, on resume)."""
    split_file = run_dir / "split.json"
    reuse_split = split_file.is_file() and config["resume"]
    weights = backbone_data_config(config["backbone"]["name"])  # the normalisation the backbone's weights expect

    def build(dataset: dict[str, Any]) -> DataBundle:
        return build_datasets_from_config(dataset, config["seed"], split_file=split_file if reuse_split else None,
                                          mean=weights["mean"], std=weights["std"], augment=config["augment"])

    local_rank, local_world = _local_rank_and_size(ctx)
    data = load_decoded_once(config["dataset"], build, store=ctx.store, rank=ctx.rank, local_rank=local_rank,
                             local_world=local_world)
    if ctx.is_primary:
        data.split.save(split_file)
    return data


def _local_rank_and_size(ctx: WorkerContext) -> tuple[int, int]:
    """This worker's rank among the workers of its machine, and their number."""
    if started_by_torchrun():
        return int(os.environ["LOCAL_RANK"]), int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    return ctx.rank, ctx.world_size


@contextmanager
def _closing_commits(commits: MergeCommits | None, primary: bool, run_dir: Path) -> Iterator[None]:
    """The merge commits of the block: on the way out with an error (a peer lost, the agent's SIGTERM, Ctrl-C) the
    newest is written before anything else; a run that finished drops its commit.pt (its last.pt holds more; also
    one written before a lost worker left this launch alone)."""
    try:
        yield
    except BaseException:
        if commits is not None:
            try:
                with sigterm_ignored():  # the agent's SIGTERM (a peer failed) must not cut the write short
                    commits.flush()
                    commits.close()
            except Exception as error:  # noqa: BLE001 - the commit's own error, second to the one in flight
                log.warning("a merge commit failed as well: %s: %s", type(error).__name__, error)
        raise
    if commits is not None:
        commits.close()
        log.info("%s", commits.cost())
    if primary:
        run_checkpoint_path(run_dir, COMMIT_NAME).unlink(missing_ok=True)


def _where(checkpoint: dict[str, Any], samples: int) -> str:
    """Where a checkpoint leaves the run: after an epoch, or within one (a merge's commit)."""
    position = committed_position(checkpoint)
    if not position:
        return f"after epoch {checkpoint['epoch']}"
    return f"epoch {checkpoint['epoch'] + 1}, {position} of its {samples} samples merged (the last merge's commit)"


_LAST_GOOD = re.compile(r"Its last good checkpoint is .+? \(after epoch \d+\)\.|"
                        r"No checkpoint was written before it diverged \(nothing to resume\)\.")


@contextmanager
def _divergence_naming_the_written_checkpoint(writer: BackgroundWriter, run_dir: Path) -> Iterator[None]:
    """A :class:`NonFiniteLossError` raised inside names the last good checkpoint as it is once ``writer`` is done
    (the loss may diverge while the previous epoch's ``last.pt`` is still being written)."""
    try:
        yield
    except NonFiniteLossError as error:
        writer.close()
        raise NonFiniteLossError(_LAST_GOOD.sub(lambda _: _last_good_checkpoint(run_dir), str(error), count=1)) \
            from None
