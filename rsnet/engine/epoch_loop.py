"""One worker's epoch of training: the loop over the batches its strategy hands it (:func:`train_one_epoch`), each
optimizer step with its out-of-memory retry and NaN/inf check (:class:`_StepRunner`), the speed probe's step, the
epoch's training sums (:class:`EpochMeter`, :class:`EpochTotals`), the lr schedule it follows and the per-epoch
seeding of the random generators."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

from rsnet.checkpoint import last_checkpoint
from rsnet.data import BatchPrefetcher, DataBundle, PreparedBatch, augments_on_device
from rsnet.engine.acceleration import compiled_forward, memory_format, use_channels_last
from rsnet.engine.background_writer import BackgroundWriter
from rsnet.engine.lr_schedule import learning_rate
from rsnet.engine.optim import build_optimizer
from rsnet.engine.step_timer import StepTimer
from rsnet.losses import MultiBranchLoss
from rsnet.parallel import WorkerContext
from rsnet.parallel.strategies import Claim, Strategy
from rsnet.precision import StepPrecision
from rsnet.progress import progress_bar


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stops and keeps its last good checkpoint."""


@dataclass
class EpochMeter:
    """Running sums of one worker's epoch, kept on the device (no host sync per step) until :meth:`totals`."""

    samples: int = 0
    steps: int = 0
    data_seconds: float = 0.0
    compute_seconds: float = 0.0
    last_lr: float = 0.0
    correct: torch.Tensor | int = 0
    loss_sums: dict[str, torch.Tensor] = field(default_factory=dict)

    def update(self, terms: dict[str, torch.Tensor], logits: torch.Tensor, labels: torch.Tensor, lr: float) -> None:
        size = len(labels)
        self.samples += size
        self.steps += 1
        self.last_lr = lr
        self.correct = self.correct + (logits.detach().argmax(1) == labels).sum()
        for name, value in terms.items():
            self.loss_sums[name] = self.loss_sums.get(name, 0.0) + value.detach().float() * size

    def totals(self) -> EpochTotals:
        """The sums on the host (one sync), as one worker's :class:`EpochTotals`."""
        busy = self.data_seconds + self.compute_seconds
        return EpochTotals(samples=self.samples, steps=self.steps, correct=int(self.correct),
                           loss_sums={name: float(total) for name, total in self.loss_sums.items()},
                           data_seconds=self.data_seconds, busy_seconds=busy, slowest_busy_seconds=busy,
                           lr=self.last_lr if self.steps else None)


@dataclass(frozen=True)
class EpochTotals:
    """An epoch's training sums, of one worker or of the whole group (:meth:`combined`)."""

    samples: int
    steps: int
    correct: int
    loss_sums: dict[str, float]
    data_seconds: float
    busy_seconds: float
    slowest_busy_seconds: float
    lr: float | None

    @classmethod
    def combined(cls, parts: Sequence[EpochTotals]) -> EpochTotals:
        """The group's totals from every worker's, in rank order: samples, steps, correct answers, loss sums and
        data and busy seconds add up; the workers train at the same time, so the group's epoch lasts as long as its
        slowest worker is busy (``slowest_busy_seconds``, the max), over which ``images_per_s`` counts every
        worker's samples; ``lr`` is the lowest rank's that stepped (a worker's lr scales with its batch size)."""
        names = list(dict.fromkeys(name for part in parts for name in part.loss_sums))
        return cls(samples=sum(part.samples for part in parts), steps=sum(part.steps for part in parts),
                   correct=sum(part.correct for part in parts),
                   loss_sums={name: sum(part.loss_sums.get(name, 0.0) for part in parts) for name in names},
                   data_seconds=sum(part.data_seconds for part in parts),
                   busy_seconds=sum(part.busy_seconds for part in parts),
                   slowest_busy_seconds=max((part.slowest_busy_seconds for part in parts), default=0.0),
                   lr=next((part.lr for part in parts if part.lr is not None), None))

    def summary(self) -> dict[str, float]:
        """Mean loss terms, main-branch accuracy, throughput, the fraction of busy time spent waiting for data, lr;
        without a sample the means are 0."""
        samples = max(self.samples, 1)
        scalars = {f"train/loss/{name}": total / samples for name, total in self.loss_sums.items()}
        scalars["train/oa_main"] = 100.0 * self.correct / samples
        scalars["train/samples"] = self.samples
        slowest = self.slowest_busy_seconds
        scalars["train/images_per_s"] = self.samples / slowest if slowest else 0.0
        scalars["train/data_stall"] = self.data_seconds / self.busy_seconds if self.busy_seconds else 0.0
        scalars["train/lr"] = self.lr or 0.0
        return scalars


def group_train_scalars(ctx: WorkerContext, meter: EpochMeter, merged_before: int = 0) -> dict[str, float] | None:
    """The epoch's training scalars of every worker together (:meth:`EpochTotals.combined`), on the primary; None
    on the others. ``merged_before``: the epoch's samples trained before a resume (they count in ``train/samples``
    only). A collective: every worker calls it."""
    own = meter.totals()
    if ctx.world_size == 1:
        scalars = own.summary()
    else:
        parts: list[Any] | None = [None] * ctx.world_size if ctx.is_primary else None
        dist.gather_object(own, parts, dst=0)
        if parts is None:
            return None
        scalars = EpochTotals.combined(parts).summary()
    scalars["train/samples"] += merged_before
    return scalars


def train_one_epoch(ctx: WorkerContext, config: dict[str, Any], epoch: int, data: DataBundle, strategy: Strategy,
                    criterion: MultiBranchLoss, optimizer: torch.optim.Optimizer,
                    writer: BackgroundWriter | None = None, on_merge: Callable[[], None] | None = None) -> EpochMeter:
    """Train one epoch on the batches the strategy hands this worker, interval by interval (one host wait per interval);
    a batch that runs out of CUDA memory is retried at ``strategy.on_out_of_memory()``'s size. ``writer``: the
    previous epoch's background writes, whose failure stops the epoch at the next step; ``on_merge``: called after
    each interval's end (the primary's commit)."""
    model = strategy.model
    model.train()
    if strategy.wants_probe:
        strategy.probe_speed(probe_step(ctx, config, model, criterion, data))
    meter = EpochMeter()
    step = _StepRunner(ctx, config, strategy, criterion, optimizer, meter)
    prefetcher = train_prefetcher(ctx, config, epoch, data)
    # with several workers the primary sees only the images it claims: a count without a total, not a wrong estimate
    shown = progress_bar(total=len(data.train) if ctx.world_size == 1 else None, unit="img",
                         desc=f"epoch {epoch + 1}", disable=not (ctx.is_primary and config["log"]["progress_bar"]),
                         leave=False, dynamic_ncols=True)
    with closing(prefetcher), shown as bar:
        for interval in strategy.intervals(epoch):
            for batch in prefetcher.batches(strategy.claims(interval), on_stop=strategy.stop_claiming):
                step.run(batch)
                bar.update(len(batch))
                if writer is not None:
                    writer.raise_if_failed()
            step.check_finite(epoch)  # the interval's one wait for the device
            meter.compute_seconds += (compute := step.timer.pop_total())
            meter.data_seconds = prefetcher.wait_s
            with record_function("rsnet.interval_end"):  # merge and schedule
                strategy.end_interval(compute)
            if on_merge is not None:
                on_merge()
            bar.set_postfix(loss=f"{float(meter.loss_sums.get('total', 0.0)) / max(meter.samples, 1):.3f}",
                            acc=f"{100 * float(meter.correct) / max(meter.samples, 1):.1f}",
                            img_s=f"{meter.samples / max(meter.data_seconds + meter.compute_seconds, 1e-9):.0f}",
                            lr=f"{meter.last_lr:.2g}")
    strategy.end_epoch()
    return meter


def train_prefetcher(ctx: WorkerContext, config: dict[str, Any], epoch: int, data: DataBundle
                     ) -> BatchPrefetcher[Claim]:
    """The epoch's claimed batches, prepared one ahead and augmented on the worker's device or on the host."""
    enabled = bool(config["prefetch"])
    augment = data.train_augment
    seed = int(config["seed"])
    if augment is None or not augments_on_device(config["augment"]["on_device"], ctx.device):
        return BatchPrefetcher(lambda claim: data.train.get_batch(claim.indices, seed, epoch), ctx.device,
                               enabled=enabled)
    layout = memory_format(config, ctx.device)

    def finish(images: torch.Tensor, claim: Claim) -> torch.Tensor:
        return augment.apply(images, claim.indices, seed, epoch, layout)

    return BatchPrefetcher(lambda claim: data.train.stored_batch(claim.indices), ctx.device, enabled, finish)


def probe_step(ctx: WorkerContext, config: dict[str, Any], model: torch.nn.Module, criterion: MultiBranchLoss,
               data: DataBundle) -> Callable[[int], float | None]:
    """A training step as :class:`_StepRunner` runs it (precision, memory format, loss, optimizer), on synthetic
    batches and a private copy of ``model`` with its own optimizer: the worker's speed probe, which may run on a
    background thread while the model itself is merged. Eager, also with ``compile=true``. It draws nothing from the
    run's random streams (its own generator; dropout off in the copy), and on a GPU it runs on a CUDA stream of its
    own and returns the seconds between events on that stream: a merge the worker waits in meanwhile is not timed."""
    replica = without_random_layers(copy.deepcopy(model))
    optimizer = build_optimizer(replica, config["optimizer"])
    precision = StepPrecision.for_device(config["amp"], ctx.device)
    layout = memory_format(config, ctx.device)
    shape = (data.channels, data.image_size, data.image_size)
    generator = torch.Generator(device=ctx.device).manual_seed(0)
    stream = torch.cuda.Stream(ctx.device) if ctx.device.type == "cuda" else None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(ctx.device))  # the copy of the model is made

    def train_step(batch_size: int) -> None:
        images = torch.randn(batch_size, *shape, device=ctx.device, generator=generator)
        labels = torch.randint(0, len(data.class_names), (batch_size,), device=ctx.device, generator=generator)
        with precision.autocast():
            losses = criterion(replica(images.contiguous(memory_format=layout)), labels, epoch=0.0)
        optimizer.zero_grad(set_to_none=True)
        precision.backward_and_step(losses.total, optimizer, replica.parameters(), config["max_grad_norm"])

    def step(batch_size: int) -> float | None:
        if stream is None:
            train_step(batch_size)
            return None  # timed by the wall clock (SpeedProbe)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            train_step(batch_size)
            end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    return step


def without_random_layers(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every dropout and drop-path rate set to 0 (they then draw no random numbers); for a probe's
    copy, whose draws would otherwise come from, and shift, the run's global random stream."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for rate in ("drop_prob", "drop_rate"):  # timm's DropPath / DropBlock; a head's functional dropout
            if isinstance(getattr(module, rate, None), float):
                setattr(module, rate, 0.0)
    return model


class _StepRunner:
    """One optimizer step on a prepared batch, with the out-of-memory retry and a running NaN/inf flag."""

    def __init__(self, ctx: WorkerContext, config: dict[str, Any], strategy: Strategy, criterion: MultiBranchLoss,
                 optimizer: torch.optim.Optimizer, meter: EpochMeter) -> None:
        self.ctx, self.config, self.strategy = ctx, config, strategy
        self.criterion, self.optimizer, self.meter = criterion, optimizer, meter
        self.timer = StepTimer(ctx.device, every_step=strategy.needs_step_seconds)
        self.precision = StepPrecision.for_device(config["amp"], ctx.device)
        self.channels_last = use_channels_last(config, ctx.device)
        self.forward = compiled_forward(strategy.model, config, strategy.fixed_batch_sizes)
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=ctx.device)
        self.last_terms: dict[str, torch.Tensor] = {}
        self.first_unchecked = 1

    def run(self, batch: PreparedBatch) -> None:
        """Train on ``batch`` (in smaller pieces after an out-of-memory error)."""
        pending = [(batch.images, batch.labels)]
        while pending:
            images, labels = pending.pop(0)
            try:
                self._step(images, labels, batch.request.position)
            except torch.cuda.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)
                if self.ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
                size = self.strategy.on_out_of_memory()
                pending[:0] = list(zip(images.split(size), labels.split(size)))

    @record_function("rsnet.step")
    def _step(self, images: torch.Tensor, labels: torch.Tensor, position: float) -> None:
        lr = _lr(self.config, position) * self.strategy.lr_scale(len(labels))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        # adaptive: while it measures a worker's speed, and a batch size's first step (one-time costs)
        self.timer.every_step = self.strategy.times_step(len(labels))
        self.timer.start()
        try:
            with self.precision.autocast():
                output = self.forward(images)
                losses = self.criterion(output, labels, epoch=position)
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.backward_and_step(losses.total, self.optimizer, self.strategy.model.parameters(),
                                             self.config["max_grad_norm"])
        finally:
            seconds = self.timer.stop()
        self.nonfinite |= ~torch.isfinite(losses.total.detach())
        self.last_terms = losses.terms
        self.meter.update(losses.terms, output.main_logits, labels, lr)
        self.strategy.after_step(len(labels), seconds)

    def check_finite(self, epoch: int) -> None:
        """Stop the run if a loss since the last check was not finite, naming the last good checkpoint."""
        first, self.first_unchecked = self.first_unchecked, self.meter.steps + 1
        with record_function("rsnet.sync"):
            finite = not bool(self.nonfinite)
        if finite:
            return
        terms = ", ".join(f"{name}={float(value):.4g}" for name, value in self.last_terms.items())
        raise NonFiniteLossError(
            f"the loss became NaN or infinite at epoch {epoch + 1}, within steps {first}-{self.meter.steps} (last "
            f"step: {terms}); the run stops. {_last_good_checkpoint(Path(self.config['run_dir']))} "
            "Try a lower optimizer.lr or max_grad_norm=5")


def _last_good_checkpoint(run_dir: Path) -> str:
    """Where the run's last good state is, or that none was written (never claim a file that does not exist)."""
    saved = last_checkpoint(run_dir)
    if saved is None:
        return "No checkpoint was written before it diverged (nothing to resume)."
    return f"Its last good checkpoint is {saved[0]} (after epoch {saved[1]})."


def _lr_ratio(config: dict[str, Any], epoch: float) -> float:
    """The scheduled lr at ``epoch`` over its peak, 1 during the warm-up (the decay the merge cadence follows)."""
    return _lr(config, max(epoch, float(config["lr_schedule"]["warmup_epochs"])), base_lr=1.0)


def _lr(config: dict[str, Any], epoch: float, base_lr: float | None = None) -> float:
    """The scheduled lr at ``epoch`` for ``optimizer.lr`` (or ``base_lr``)."""
    schedule = config["lr_schedule"]
    base_lr = config["optimizer"]["lr"] if base_lr is None else base_lr
    return learning_rate(epoch, base_lr=base_lr, epochs=config["epochs"], name=schedule["name"],
                         warmup_epochs=schedule["warmup_epochs"], milestones=schedule["milestones"],
                         gamma=schedule["gamma"], min_lr_ratio=schedule["min_lr_ratio"])


def worker_seed(seed: int, rank: int, epoch: int) -> int:
    """A 64-bit seed for worker ``rank`` at ``epoch`` of a run seeded ``seed``: numpy's ``SeedSequence`` hashes the
    three together, so distinct triples collide only as 64-bit hashes do (an arithmetic mix such as
    ``seed * 1000 + rank * 100 + epoch`` gave rank 1 at epoch 0 the seed of rank 0 at epoch 100)."""
    low, high = np.random.SeedSequence([seed, rank, epoch]).generate_state(2, dtype=np.uint32)
    return int(low) | int(high) << 32


def _seed_generators(seed: int, rank: int, epoch: int) -> None:
    """Python's, numpy's and torch's global generators for worker ``rank`` at ``epoch`` (:func:`worker_seed`)."""
    mixed = worker_seed(seed, rank, epoch)
    random.seed(mixed)
    np.random.seed([mixed & 0xFFFFFFFF, mixed >> 32])
    torch.manual_seed(mixed)
