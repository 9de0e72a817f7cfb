"""Unit tests of the training loop's pure parts: lr schedule, config checks, atomic checkpoints."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from helpers import training_config

from rsnet.checkpoint import load_checkpoint, save_checkpoint
from rsnet.engine.config_checks import ConfigError, check_resume_identity, check_run_dir, check_training_config
from rsnet.engine.fresh_start import SET_ASIDE, put_back_or_drop_an_unfinished_set_aside, set_aside_earlier_run
from rsnet.engine.lr_schedule import learning_rate

CONFIG = training_config("model=baseline", "backbone=test_resnet", "dataset.train_ratio=0.8", "dataset.image_size=64",
                         "batch_size=16", "trainer.devices=[cpu,cpu]")


def test_warmup_then_cosine_reaches_floor() -> None:
    kwargs = dict(base_lr=0.1, epochs=10, warmup_epochs=2, min_lr_ratio=0.01)
    assert learning_rate(0.0, **kwargs) < learning_rate(1.0, **kwargs) < learning_rate(2.0, **kwargs)
    assert learning_rate(2.0, **kwargs) == pytest.approx(0.1)
    assert learning_rate(10.0, **kwargs) == pytest.approx(0.001)
    values = [learning_rate(2 + e / 4, **kwargs) for e in range(33)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_step_schedule_decays_at_milestones() -> None:
    kwargs = dict(base_lr=1.0, epochs=10, name="step", milestones=[0.5, 0.8], gamma=0.1)
    assert [learning_rate(e, **kwargs) for e in (4.9, 5.0, 8.0)] == pytest.approx([1.0, 0.1, 0.01])
    with pytest.raises(ValueError, match=r"^lr_schedule.name='linear' is not known; use 'cosine' or 'step'$"):
        learning_rate(0.0, base_lr=1.0, epochs=1, name="linear")


def test_valid_config_passes() -> None:
    check_training_config(copy.deepcopy(CONFIG), num_workers=2)


@pytest.mark.parametrize("trainer", ["adaptive", "sync", "local_sgd"])
def test_shipped_configs_pass_the_checks(trainer: str) -> None:
    """Every default of conf/ passes the range checks."""
    check_training_config(training_config(f"trainer={trainer}", "trainer.devices=[cpu,cpu]"), num_workers=2)


@pytest.mark.parametrize("path, value, needle", [
    (("batch_size",), 0, "batch_size=0"),
    (("batch_size",), 1, "number of workers"),
    (("epochs",), -1, "epochs=-1"),
    (("dataset", "train_ratio"), 0.0, "dataset.train_ratio"),
    (("model", "arch"), "resnet_ensemble", "esd_mbenet"),
    (("dataset", "image_size"), 8, "dataset.image_size=8"),
    (("lr_schedule", "name"), "linear", "lr_schedule.name"),
    (("trainer", "batch_min"), 20, "trainer.batch_min"),  # 2 workers x batch_min 20 > B = 32
    (("trainer", "batch_max"), 4, "trainer.batch_m"),
    (("trainer", "batch_multiple"), "eight", "trainer.batch_multiple='eight': use auto"),
    (("trainer", "merge_rounds"), 0, "trainer.merge_rounds=0"),
    (("trainer", "elastic"), 0.0, "trainer.elastic=0.0"),
    (("trainer", "merge_weight"), "steps", "trainer.merge_weight='steps'"),
    (("trainer", "slowdown"), [1.0], "has 1 factor"),  # not padded with 1.0
    (("trainer", "slowdown"), [1.0, 2.0, 3.0], "has 3 factor"),  # not truncated
    (("trainer", "slowdown"), [1.0, 0.5], ">= 1.0"),
    (("trainer", "timeout_s"), 0, "trainer.timeout_s=0"),
    (("dataset", "image_size"), 32.5, "dataset.image_size=32.5"),  # not cut to 32
    (("epochs",), True, "epochs=True"),
    (("amp",), True, "amp=True: use bf16"),  # the old boolean: say which precision
    (("eval_amp",), "fp32", "eval_amp='fp32': use bf16"),
    (("trainer", "probe_timeout_s"), 0, "trainer.probe_timeout_s=0"),
    (("optimizer", "name"), "sgdd", "optimizer.name='sgdd' is not a timm optimizer \\(did you mean sgd"),
    (("trainer", "timeout_s"), None, "trainer.timeout_s=None"),
])
def test_bad_settings_name_what_to_fix(path: tuple[str, ...], value: object, needle: str) -> None:
    config = copy.deepcopy(CONFIG)
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        check_training_config(config, num_workers=2)


def test_devices_one_name_or_a_list_and_unknown_ones_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from rsnet.engine.trainer import resolve_devices

    assert resolve_devices("cpu") == ["cpu"]  # one device, not the letters 'c', 'p', 'u'
    assert resolve_devices(["cpu", "cpu"]) == ["cpu", "cpu"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_devices(["cuda", "cuda:1"]) == ["cuda:0", "cuda:1"]  # NCCL refused a bare 'cuda' on a GPU
    with pytest.raises(ConfigError, match="trainer.devices=tpu: not a device rsnet runs on"):
        resolve_devices(["tpu"])
    with pytest.raises(ConfigError, match="trainer.devices=cuda:99: no such CUDA device here"):
        resolve_devices(["cpu", "cuda:99"])


EARLIER = ("checkpoints/last.pt", "checkpoints/best.pt", "tensorboard/events.out.tfevents.1", "metrics.json",
           "curves.png", "confusion.pdf", ".hydra/config.yaml", "train.log", "notes.txt")


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def earlier_run(folder: Path) -> dict[str, bytes]:
    for name in EARLIER:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"earlier {name}")
    return files_of(folder)


def new_outputs(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"new {name}")


def test_starting_afresh_sets_aside_only_what_a_run_writes(tmp_path: Path) -> None:
    """In the block, only a run's outputs are out of the way (in .earlier-run/); train.log and a user's own files
    stay; a block that ends after the new run's checkpoint deletes the earlier run."""
    earlier_run(tmp_path)
    with set_aside_earlier_run(tmp_path) as names:
        assert names == ["checkpoints", "tensorboard", "metrics.json", ".hydra", "curves.png", "confusion.pdf"]
        assert sorted(files_of(tmp_path)) == sorted([*(f"{SET_ASIDE}/{name}" for name in EARLIER
                                                       if name not in ("train.log", "notes.txt")),
                                                     "notes.txt", "train.log"])
        new_outputs(tmp_path, "checkpoints/last.pt", "metrics.json")
    assert sorted(files_of(tmp_path)) == ["checkpoints/last.pt", "metrics.json", "notes.txt", "train.log"]
    with set_aside_earlier_run(tmp_path) as names:
        assert names == ["checkpoints", "metrics.json"]
    assert sorted(files_of(tmp_path)) == ["notes.txt", "train.log"]  # a new run that wrote nothing, and ended


@pytest.mark.parametrize("stop", [ConfigError("dataset.root=/nowhere does not exist"), KeyboardInterrupt()])
def test_a_new_run_that_stops_before_its_first_checkpoint_puts_every_byte_back(tmp_path: Path,
                                                                             stop: BaseException) -> None:
    before = earlier_run(tmp_path)
    with pytest.raises(type(stop)), set_aside_earlier_run(tmp_path):
        new_outputs(tmp_path, "split.json", ".hydra/config.yaml", "tensorboard/events.out.tfevents.2")
        raise stop
    assert files_of(tmp_path) == before  # the new run's split.json, record and events gone, the earlier run back


def test_a_new_run_that_stops_after_its_first_checkpoint_keeps_it_and_drops_the_earlier(tmp_path: Path) -> None:
    earlier_run(tmp_path)
    with pytest.raises(RuntimeError), set_aside_earlier_run(tmp_path):
        new_outputs(tmp_path, "checkpoints/last.pt")
        raise RuntimeError("a crash in epoch 2")
    assert files_of(tmp_path) == {"checkpoints/last.pt": b"new checkpoints/last.pt", "notes.txt": b"earlier notes.txt",
                                  "train.log": b"earlier train.log"}


@pytest.mark.parametrize("checkpoint_written", [False, True])
def test_a_set_aside_left_by_a_killed_run_is_put_back_or_dropped(tmp_path: Path, checkpoint_written: bool) -> None:
    """kill -9 in the block leaves .earlier-run/ behind: the next start in the run dir puts it back when the new run
    wrote no checkpoint, else deletes it."""
    before = earlier_run(tmp_path)
    with set_aside_earlier_run(tmp_path):
        new_outputs(tmp_path, "split.json", *(["checkpoints/last.pt"] if checkpoint_written else []))
        aside = files_of(tmp_path)  # what a kill here leaves
    for name, data in aside.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    put_back_or_drop_an_unfinished_set_aside(tmp_path)
    if checkpoint_written:
        assert sorted(files_of(tmp_path)) == ["checkpoints/last.pt", "notes.txt", "split.json", "train.log"]
    else:
        assert files_of(tmp_path) == before
    put_back_or_drop_an_unfinished_set_aside(tmp_path)  # nothing set aside: nothing changes
    assert not (tmp_path / SET_ASIDE).exists()


def test_run_dir_guards_earlier_runs(tmp_path: Path) -> None:
    assert check_run_dir(tmp_path, resume=False, overwrite=False) is None
    last = tmp_path / "checkpoints" / "last.pt"
    with pytest.raises(ConfigError, match=re.escape(f"resume=true but {last} does not exist; start without resume, "
                                                    "or point hydra.run.dir at the run to continue")):
        check_run_dir(tmp_path, resume=True, overwrite=False)
    last.parent.mkdir()
    last.write_bytes(b"x")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path} already holds a run ({last}); pass resume=true to "
                                                    "continue it, overwrite=true to start afresh there")):
        check_run_dir(tmp_path, resume=False, overwrite=False)
    assert check_run_dir(tmp_path, resume=False, overwrite=True) is None
    assert check_run_dir(tmp_path, resume=True, overwrite=False) == last
    with pytest.raises(ConfigError, match="^resume=true and overwrite=true contradict each other: pass resume to "
                                          "continue the run in this run dir, overwrite to start afresh there$"):
        check_run_dir(tmp_path, resume=True, overwrite=True)


def test_resume_keeps_the_settings_that_define_the_run() -> None:
    saved = copy.deepcopy(CONFIG)
    check_resume_identity({**copy.deepcopy(CONFIG), "epochs": 9}, saved, Path("last.pt"))  # epochs may change
    for key, value in (("dataset", {**CONFIG["dataset"], "image_size": 128}), ("backbone", {"name": "resnet18"})):
        with pytest.raises(ConfigError, match=rf"{key}\.\w+=.* but the run in last\.pt has"):
            check_resume_identity({**copy.deepcopy(CONFIG), key: value}, saved, Path("last.pt"))


def _checkpoint_payload() -> dict:
    return {"model_config": {"arch": "baseline"}, "model_state": {"w": torch.ones(2)}, "class_names": ["a"],
            "image_size": 64, "mean": [0.0] * 3, "std": [1.0] * 3}


def test_checkpoint_write_is_atomic_and_validated(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "ck" / "last.pt", _checkpoint_payload())
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left behind
    loaded = load_checkpoint(path)
    assert loaded["format_version"] == 2 and len(loaded["sha256"]) == 64
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an rsnet training checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


class _ChunkedStrategy:
    """A one-worker strategy double: one claimed batch of 8, halves the batch on out-of-memory."""

    needs_step_seconds = False
    fixed_batch_sizes = True
    wants_probe = False  # alone: no speed probe

    def times_step(self, batch_size: int) -> bool:
        return False

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.steps: list[int] = []
        self.out_of_memory_calls = 0
        self.intervals_ended = 0

    def intervals(self, epoch: int):
        yield 0

    def claims(self, interval: int):
        from rsnet.parallel.strategies import Claim

        yield Claim(torch.arange(8), 0.0)

    def stop_claiming(self) -> None:  # its claims never wait for a step
        pass

    def lr_scale(self, batch_size: int) -> float:
        return 1.0

    def on_out_of_memory(self) -> int:
        self.out_of_memory_calls += 1
        return 4

    def after_step(self, batch_size: int, seconds: float | None) -> None:
        self.steps.append(batch_size)

    def end_interval(self, compute_seconds: float) -> None:
        self.intervals_ended += 1

    def end_epoch(self) -> None:
        pass


class _MemoryBoundModel(torch.nn.Module):
    """Raises CUDA's out-of-memory error for batches larger than 4."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, images: torch.Tensor):
        from rsnet.models.output import MultiBranchOutput

        if images.shape[0] > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return MultiBranchOutput(logits={"main": self.fc(images.mean(dim=(2, 3)))})


def test_out_of_memory_batch_is_retried_in_the_strategys_smaller_size() -> None:
    from types import SimpleNamespace

    from rsnet.engine.epoch_loop import train_one_epoch
    from rsnet.losses import MultiBranchLoss

    model = _MemoryBoundModel()
    strategy = _ChunkedStrategy(model)
    data = SimpleNamespace(train=_RandomImages(8), train_augment=None)  # the host path: _RandomImages.get_batch
    ctx = SimpleNamespace(world_size=1, device=torch.device("cpu"), is_primary=True)
    config = training_config("epochs=1", "optimizer.lr=0.1", "run_dir=.", "log.progress_bar=false",
                             "lr_schedule.warmup_epochs=0", "lr_schedule.min_lr_ratio=0.0")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.fc.weight.detach().clone()
    meter = train_one_epoch(ctx, config, 0, data, strategy, MultiBranchLoss(), optimizer)
    assert strategy.out_of_memory_calls == 1 and strategy.intervals_ended == 1
    assert strategy.steps == [4, 4] and meter.samples == 8 and meter.steps == 2
    assert not torch.equal(before, model.fc.weight)


def test_the_speed_probe_draws_nothing_from_the_runs_random_streams() -> None:
    """A probe step (dropout at 0.5 in the model) between seeding and the first batch leaves the run's draws as
    they were: the same first batch order and dropout mask with and without a probe."""
    from types import SimpleNamespace

    from rsnet.engine.epoch_loop import probe_step
    from rsnet.losses import MultiBranchLoss
    from rsnet.models import build_model

    model = build_model("esd_mbenet", "test_resnet", 4, drop_rate=0.5)
    ctx = SimpleNamespace(device=torch.device("cpu"))
    data = SimpleNamespace(channels=3, image_size=32, class_names=list("abcd"))
    step = probe_step(ctx, training_config(), model, MultiBranchLoss(), data)

    def first_draws(probe: bool) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        if probe:
            assert step(4) is None  # a CPU step is timed by the wall clock
        order = torch.randperm(16)
        logits = model.train()(torch.ones(2, 3, 32, 32)).logits["main"]
        return order, logits

    without, with_probe = first_draws(False), first_draws(True)
    assert torch.equal(without[0], with_probe[0]) and torch.equal(without[1], with_probe[1])
    assert any(m.p == 0.5 for m in model.modules() if isinstance(m, torch.nn.Dropout))  # the run's model keeps its rate


class _RandomImages:
    """A train set double: ``size`` random 8 px images of class 0."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def get_batch(self, indices: list[int], seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.rand(len(indices), 3, 8, 8), torch.zeros(len(indices), dtype=torch.long)


class _ThreeClaims(_ChunkedStrategy):
    def claims(self, interval: int):
        from rsnet.parallel.strategies import Claim

        for start in (0, 4, 8):
            yield Claim(torch.arange(start, start + 4), 0.0)


class _FailingWriter:
    """The previous epoch's background writes, found failed at the ``fails_at``-th check."""

    def __init__(self, fails_at: int) -> None:
        self.checks, self.fails_at = 0, fails_at

    def raise_if_failed(self) -> None:
        self.checks += 1
        if self.checks >= self.fails_at:
            raise OSError(28, "No space left on device")


def test_a_failed_background_write_stops_the_epoch_at_the_next_step() -> None:
    """Not at the end of the epoch that follows the write: the step after the failure is known is the last."""
    from types import SimpleNamespace

    from rsnet.engine.epoch_loop import train_one_epoch
    from rsnet.losses import MultiBranchLoss

    model = _MemoryBoundModel()
    strategy = _ThreeClaims(model)
    ctx = SimpleNamespace(world_size=1, device=torch.device("cpu"), is_primary=True)
    config = training_config("epochs=1", "optimizer.lr=0.1", "run_dir=.", "log.progress_bar=false",
                             "lr_schedule.warmup_epochs=0", "lr_schedule.min_lr_ratio=0.0")
    data = SimpleNamespace(train=_RandomImages(12), train_augment=None)
    writer = _FailingWriter(fails_at=2)
    with pytest.raises(OSError, match="No space left"):
        train_one_epoch(ctx, config, 0, data, strategy, MultiBranchLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                        writer)
    assert strategy.steps == [4, 4] and strategy.intervals_ended == 0 and writer.checks == 2


class _DivergedModel(_MemoryBoundModel):
    """Gives NaN logits for every batch."""

    def forward(self, images: torch.Tensor):
        output = super().forward(images[:4])
        output.logits["main"] = output.logits["main"].repeat(2, 1)[: len(images)] * float("nan")
        return output


@pytest.mark.parametrize("checkpoint_epoch", [None, 3])
def test_nan_stop_names_the_last_good_checkpoint_only_when_one_exists(tmp_path: Path,
                                                                      checkpoint_epoch: int | None) -> None:
    """The NaN stop names last.pt and its epoch when one was written, and says that none was when the first epoch
    diverged: it never names a checkpoint that does not exist."""
    from types import SimpleNamespace

    from rsnet.engine.epoch_loop import NonFiniteLossError, train_one_epoch
    from rsnet.losses import MultiBranchLoss

    if checkpoint_epoch is not None:
        save_checkpoint(tmp_path / "checkpoints" / "last.pt", {**_checkpoint_payload(), "epoch": checkpoint_epoch})
    model = _DivergedModel()
    ctx = SimpleNamespace(world_size=1, device=torch.device("cpu"), is_primary=True)
    config = training_config("epochs=1", "optimizer.lr=0.1", f"run_dir={tmp_path}", "log.progress_bar=false",
                             "lr_schedule.warmup_epochs=0", "lr_schedule.min_lr_ratio=0.0")
    data = SimpleNamespace(train=_RandomImages(4), train_augment=None)
    with pytest.raises(NonFiniteLossError) as caught:
        train_one_epoch(ctx, config, 0, data, _ChunkedStrategy(model),
                        MultiBranchLoss(), torch.optim.SGD(model.parameters(), lr=0.1))
    message = str(caught.value)
    if checkpoint_epoch is None:
        assert "No checkpoint was written" in message and "last good" not in message
    else:
        assert f"last good checkpoint is {tmp_path / 'checkpoints' / 'last.pt'} (after epoch 3)" in message


# setting(s) -> the start of the one-line refusal; every one trained (or crashed) after decoding before
OUT_OF_RANGE = [
    ("optimizer.lr=nan", "optimizer.lr=nan: must be a finite number"),
    ("optimizer.lr=-1", "optimizer.lr=-1.0: must be a finite number > 0"),
    ("optimizer.momentum=1.5", "optimizer.momentum=1.5: must be in [0, 1)"),
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay=-0.1: must be a finite number >= 0"),
    ("lr_schedule.warmup_epochs=-1", "lr_schedule.warmup_epochs=-1.0: must be a finite number >= 0"),
    ("lr_schedule.gamma=inf", "lr_schedule.gamma=inf: must be a finite number"),
    ("lr_schedule.min_lr_ratio=2", "lr_schedule.min_lr_ratio=2.0: must be in [0, 1]"),
    ("max_grad_norm=-1", "max_grad_norm=-1.0: must be a finite number > 0, or null"),
    ("model.loss.alpha=-1", "model.loss.alpha=-1: must be a finite number >= 0"),
    ("model.loss.temperature=nan", "model.loss.temperature=nan: must be a finite number"),
    ("model.loss.label_smoothing=1.5", "model.loss.label_smoothing=1.5: must be in [0, 1)"),
    ("model.loss.teacher=nohead", "model.loss.teacher='nohead': not a head; the heads are main, aux1, aux2"),
    ("model.options.num_branches=0", "model.options (esd_mbenet on test_resnet): num_branches must be an int >= 2"),
    ("model.options.drop_rate=2", "model.options (esd_mbenet on test_resnet): dropout probability has to be between"),
    ("model=mgml_fenet model.options.grids=[0]", "model.options (mgml_fenet on test_resnet): grids must be positive"),
    ("model.options.image_size=large", "model.options (esd_mbenet on test_resnet): image_size must be auto, null or a "
     "positive int"),
    ("log.attention_every=0", "log.attention_every=0: must be >= 1"),
    ("trainer.timeout_s=nan", "trainer.timeout_s=nan: must be a finite number"),
    ("trainer=local_sgd trainer.average_every=0", "trainer.average_every must be >= 1"),
    ("trainer=sync trainer.interval_steps=0", "trainer.interval_steps must be >= 1"),
    ("augment.color_jitter=nan", "augment.color_jitter=nan: must be a finite number"),
    ("augment.color_jitter=1.5", "augment.color_jitter must be a number in [0, 1)"),
    ("seed=-1", "seed=-1: must be >= 0"),
]


@pytest.mark.parametrize("overrides, refusal", OUT_OF_RANGE, ids=[case for case, _ in OUT_OF_RANGE])
def test_out_of_range_and_non_finite_settings_are_refused_before_any_work(overrides: str, refusal: str) -> None:
    """Out-of-range and non-finite settings (optimizer.lr, model.loss.*, model.options.*) are refused by the
    up-front check, naming the setting, before any data is decoded. (The schema's float settings arrive as floats:
    optimizer.lr=-1 is -1.0.)"""
    config = training_config("backbone=test_resnet", *overrides.split())
    with pytest.raises(ConfigError) as refused:
        check_training_config(config, num_workers=1)
    assert str(refused.value).startswith(refusal), str(refused.value)


def test_the_run_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    from rsnet.engine.epoch_end import RunState

    state = RunState(epoch=3, history=[{"epoch": 3, "test_accuracy": 50.0}], wall_time_s=12.5,
                     last_metrics={"accuracy": 50.0}, selected=None)
    path = save_checkpoint(tmp_path / "last.pt", {**_checkpoint_payload(), **state.as_payload()})
    assert RunState.from_checkpoint(load_checkpoint(path)) == state
    assert RunState.from_checkpoint({"epoch": 2}) == RunState(epoch=2)  # a key a checkpoint lacks keeps its default
    assert set(state.as_payload()) == {"epoch", "history", "wall_time_s", "last_metrics", "selected", "changes"}


def _seeds_after_seeding(seed: int, rank: int, epoch: int) -> tuple[int, int, float]:
    """torch's seed and the first draws of numpy's and Python's global generators after the trainer seeded them."""
    import random

    import numpy as np

    from rsnet.engine.epoch_loop import _seed_generators

    _seed_generators(seed, rank, epoch)
    return torch.initial_seed(), int(np.random.randint(2**31)), random.random()


def test_every_worker_and_epoch_gets_its_own_augmentation_seeds() -> None:
    """No two (rank, epoch) of a run share a seed in any of the three generators (rank 1 at epoch 0 and rank 0 at
    epoch 100 included), nor do two runs' seeds; the same (seed, rank, epoch) always gives the same ones."""
    grid = [(seed, rank, epoch) for seed in (0, 1) for rank in range(8) for epoch in range(201)]
    seeds = [_seeds_after_seeding(*point) for point in grid]
    for generator in range(3):
        values = [drawn[generator] for drawn in seeds]
        assert len(set(values)) == len(grid), f"generator {generator}: seeds collide"
    assert _seeds_after_seeding(0, 1, 0) == seeds[grid.index((0, 1, 0))]
    assert _seeds_after_seeding(1, 7, 200) == seeds[-1]
