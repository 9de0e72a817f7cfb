"""Evaluation metrics, evaluate() on stand-in and real models, and scripts/evaluate.py in-process."""

from __future__ import annotations

import csv
import json
import logging
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (CONF, STAND_IN_CLASSES, PlainClassifier, StandInModel, TensorDataset, compose_command,
                     run_evaluate_script)
from omegaconf import OmegaConf
from PIL import Image

from rsnet.data import IMAGENET_MEAN, IMAGENET_STD, SceneDataset, build_datasets
from rsnet.data.loader import eval_prefetcher, gather_stored_batch, index_chunks
from rsnet.evaluation import (
    EvalFeed,
    EvalResult,
    cohen_kappa,
    compute_metrics,
    confusion_matrix,
    eval_batch_size,
    evaluate,
    precision_recall_f1,
    rounded_numbers,
    write_confusion_csv,
    write_confusion_png,
)
from rsnet.models import build_model


def _result(preds: dict[str, list[int]], targets: list[int], reported: str = "main") -> EvalResult:
    return EvalResult(predictions={k: np.array(v) for k, v in preds.items()}, probabilities={},
                      targets=np.array(targets), reported_head=reported)


def test_metrics_by_hand() -> None:
    targets = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    main = [0, 0, 1, 0, 1, 1, 2, 2, 2, 0]  # 7/10 right
    ens = [0, 0, 0, 0, 1, 1, 1, 2, 2, 1]  # 9/10 right
    metrics = compute_metrics(_result({"main": main, "ensemble": ens}, targets, "ensemble"), ["a", "b", "c"])
    json.dumps(metrics)  # JSON-safe
    assert metrics["oa"] == pytest.approx({"main": 70.0, "ensemble": 90.0})
    assert metrics["oa/main"] == pytest.approx(70.0)
    assert metrics["reported_head"] == "ensemble" and metrics["accuracy"] == pytest.approx(90.0)
    assert metrics["num_samples"] == 10
    assert metrics["confusion_matrix"] == [[4, 0, 0], [0, 3, 0], [0, 1, 2]]
    assert metrics["per_class_accuracy"] == pytest.approx({"a": 100.0, "b": 100.0, "c": 200 / 3})
    assert metrics["average_accuracy"] == pytest.approx((100 + 100 + 200 / 3) / 3)
    # kappa by hand: p_o = 0.9; rows (4,3,3), cols (4,4,2): p_e = (16 + 12 + 6) / 100 = 0.34
    assert metrics["kappa"] == pytest.approx((0.9 - 0.34) / (1 - 0.34))
    # main head: cm [[3,1,0],[0,2,1],[1,0,2]]; p_o = .7; rows (4,3,3) cols (4,3,3): p_e = .34
    assert metrics["kappa/main"] == pytest.approx((0.7 - 0.34) / (1 - 0.34))


def test_metrics_files_hold_rounded_numbers(tmp_path: Path) -> None:
    """Was: kappa written as 0.6000000000000001. eval_*.json rounds every float to 6 places (numpy's too, in
    nested dicts and lists); the metrics in memory keep full precision."""
    from rsnet.commands.evaluate import write_outputs

    metrics = compute_metrics(_result({"main": [0, 0, 0, 0, 1, 1, 1, 1, 1, 0]}, [0] * 5 + [1] * 5), ["a", "b"])
    assert metrics["kappa"] == 0.6000000000000001  # p_o 0.8, p_e 0.5: (0.8 - 0.5) / 0.5 in floats
    write_outputs(tmp_path / "eval.json", metrics, ["a", "b"], "a title")
    written = json.loads((tmp_path / "eval.json").read_text())
    assert (written["kappa"], written["kappa/main"], written["oa/main"]) == (0.6, 0.6, 80.0)
    write_outputs(tmp_path / "eval.json", compute_metrics(_result({"main": [0, 1, 1]}, [0, 0, 1]), ["a", "b"]),
                  ["a", "b"], "a title")
    assert json.loads((tmp_path / "eval.json").read_text())["accuracy"] == 66.666667
    assert rounded_numbers({"a": [np.float32(0.1), (1 / 3, 2)], "b": True}) == {"a": [0.1, [0.333333, 2]], "b": True}


def test_kappa_edge_cases() -> None:
    assert cohen_kappa(np.diag([3, 4, 5])) == pytest.approx(1.0)
    assert cohen_kappa(np.array([[5, 0], [0, 0]])) == pytest.approx(1.0)
    # predictions independent of targets -> kappa 0
    assert cohen_kappa(np.array([[2, 2], [2, 2]])) == pytest.approx(0.0)
    # systematically wrong -> negative
    assert cohen_kappa(np.array([[0, 5], [5, 0]])) == pytest.approx(-1.0)


def test_class_without_samples_and_bad_labels() -> None:
    metrics = compute_metrics(_result({"main": [0, 1]}, [0, 1]), ["a", "b", "c"])
    assert metrics["per_class_accuracy"]["c"] is None
    assert metrics["average_accuracy"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match=re.escape("labels outside [0, 3) for 3 classes")):
        confusion_matrix(np.array([0, 3]), np.array([0, 0]), 3)


def test_evaluate_multibranch_model() -> None:
    torch.manual_seed(0)
    model = StandInModel(num_classes=4)
    model.train()
    data = TensorDataset(n=10, num_classes=4)
    result = evaluate(model, data, "cpu", batch_size=3)
    assert model.training and model.trunk[1].training  # mode restored
    assert set(result.predictions) == {"main", "aux1", "ensemble"}
    assert result.reported_head == "ensemble"
    np.testing.assert_array_equal(result.targets, data.labels)
    with torch.no_grad():
        model.eval()
        expected = model(data.x).logits["main"].argmax(1).numpy()
    np.testing.assert_array_equal(result.predictions["main"], expected)
    assert result.probabilities["aux1"].shape == (10, 4)
    metrics = compute_metrics(result, ["a", "b", "c", "d"])
    assert metrics["oa/main"] == pytest.approx(float((expected == data.labels).mean() * 100))
    assert sum(map(sum, metrics["confusion_matrix"])) == 10


def test_evaluate_plain_classifier_and_loader() -> None:
    model = PlainClassifier(num_classes=4)
    data = TensorDataset(n=6)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    result = evaluate(model, loader, "cpu")
    assert list(result.predictions) == ["main"] and result.reported_head == "main"
    assert compute_metrics(result, list("abcd"))["num_samples"] == 6


def test_evaluate_empty_dataset() -> None:
    with pytest.raises(ValueError, match=r"^evaluate\(\) got an empty dataset$"):
        evaluate(StandInModel(), TensorDataset(n=0), "cpu")


def test_evaluate_real_model() -> None:
    net = build_model("esd_mbenet", "test_resnet", num_classes=4)
    result = evaluate(net, TensorDataset(n=6, size=64), "cpu", batch_size=4)
    assert result.reported_head == "ensemble"
    assert list(result.predictions) == ["main", "aux1", "aux2", "gate_ensemble", "feature_ensemble", "ensemble"]
    metrics = compute_metrics(result, list("abcd"))
    assert set(metrics["oa"]) == set(result.predictions) and metrics["num_samples"] == 6


def test_evaluate_list_of_batches() -> None:
    data = TensorDataset(n=6)
    batches = [(data.x[:4], torch.as_tensor(data.labels[:4])), (data.x[4:], torch.as_tensor(data.labels[4:]))]
    result = evaluate(PlainClassifier(), batches, "cpu")
    np.testing.assert_array_equal(result.targets, data.labels)


def test_inference_settings_name_themselves(tmp_path) -> None:
    from rsnet.commands.values import check_writable, int_setting
    from rsnet.devices import resolve_device

    assert resolve_device("cpu") == torch.device("cpu") and resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ValueError, match=r"^device=tpu: not a device rsnet runs on; .*this machine has: cpu"):
        resolve_device("tpu")
    absent = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=rf"^device={absent}: no such CUDA device here"):
        resolve_device(absent)
    assert int_setting("topk", "3", 1) == 3 and int_setting("seed", -1) == -1
    for bad in ("abc", "2.5", True, 0):
        with pytest.raises(ValueError, match=r"^topk=.*: must be a whole number >= 1$"):
            int_setting("topk", bad, 1)
    assert check_writable(tmp_path / "new" / "m.json", "out") == tmp_path / "new" / "m.json"
    assert (tmp_path / "new").is_dir() and list((tmp_path / "new").iterdir()) == []
    with pytest.raises(ValueError, match="out=.* is a folder"):
        check_writable(tmp_path, "out")


def test_precision_recall_f1_by_hand() -> None:
    """c is never predicted, d is predicted once but has no samples, e has neither."""
    targets = [0, 0, 0, 0, 1, 1, 1, 2, 2]
    preds = [0, 0, 0, 1, 0, 1, 1, 0, 3]  # cm rows a [3,1,0,0,0], b [1,2,0,0,0], c [1,0,0,1,0]
    with np.errstate(all="raise"):  # no 0/0 anywhere
        precision, recall, f1 = precision_recall_f1(confusion_matrix(np.array(targets), np.array(preds), 5))
        metrics = compute_metrics(_result({"main": preds}, targets), list("abcde"))
    np.testing.assert_allclose(precision, [3 / 5, 2 / 3, 0, 0, 0])
    np.testing.assert_allclose(recall, [3 / 4, 2 / 3, 0, 0, 0])
    np.testing.assert_allclose(f1, [2 * 0.6 * 0.75 / 1.35, 2 / 3, 0, 0, 0])
    json.dumps(metrics, allow_nan=False)
    assert metrics["per_class_precision"] == pytest.approx({"a": 60.0, "b": 200 / 3, "c": 0.0, "d": 0.0, "e": 0.0})
    assert metrics["per_class_recall"] == pytest.approx({"a": 75.0, "b": 200 / 3, "c": 0.0, "d": 0.0, "e": 0.0})
    assert metrics["per_class_f1"]["a"] == pytest.approx(200 / 3) and metrics["per_class_f1"]["c"] == 0.0
    # macro over a-d (in the targets or the predictions), not e
    assert metrics["macro_precision"] == pytest.approx((60 + 200 / 3) / 4)
    assert metrics["macro_recall"] == pytest.approx((75 + 200 / 3) / 4)
    assert metrics["macro_f1"] == pytest.approx((200 / 3 + 200 / 3) / 4)


def test_confusion_matrix_files(tmp_path: Path) -> None:
    cm = np.array([[4, 0, 1], [0, 3, 0], [2, 1, 2]])
    write_confusion_csv(tmp_path / "cm.csv", cm, ["forest", "river", "beach"])
    with (tmp_path / "cm.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows == [["true/predicted", "forest", "river", "beach"], ["forest", "4", "0", "1"],
                    ["river", "0", "3", "0"], ["beach", "2", "1", "2"]]
    write_confusion_png(tmp_path / "cm.png", cm, ["forest", "river", "beach"])
    image = Image.open(tmp_path / "cm.png")
    assert image.format == "PNG" and image.mode == "RGB" and min(image.size) > 3 * 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cm.csv", "cm.png"]  # no temporary file left


def test_evaluate_shows_progress_only_when_asked(capsys) -> None:
    """With ``progress`` a bar of images done and images/s is drawn on stderr; without it nothing is."""
    data = TensorDataset(n=10, num_classes=4)
    evaluate(StandInModel(num_classes=4), data, "cpu", batch_size=3, progress="evaluating x test")
    shown = capsys.readouterr().err
    assert "evaluating x test" in shown and "0/10" in shown and "img/s" in shown, shown  # redrawn at most every 0.1 s
    evaluate(StandInModel(num_classes=4), data, "cpu", batch_size=3)
    assert capsys.readouterr().err == ""


class _LoggingModel(StandInModel):
    """A StandInModel that logs a warning at every batch, while the progress bar is drawn."""

    def forward(self, x: torch.Tensor):
        logging.getLogger("rsnet.test").warning("a line logged under the bar")
        return super().forward(x)


@contextmanager
def console_and_file_log(log_file: Path) -> Iterator[logging.StreamHandler]:
    """The root logger with a console handler on stderr (its own format) and a log file, as Hydra sets them up."""
    root = logging.getLogger()
    handlers = [logging.StreamHandler(sys.stderr), logging.FileHandler(log_file)]
    handlers[0].setFormatter(logging.Formatter("[console] %(message)s"))
    for handler in handlers:
        root.addHandler(handler)
    try:
        yield handlers[0]
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()


def test_a_line_logged_while_a_bar_is_drawn_starts_its_own_line(capsys, tmp_path: Path) -> None:
    """Output to a file: a log line written under a live bar is not glued to the bar's text (tqdm.write clears the
    bar first) and keeps the console handler's format; the log file gets the plain lines; after the bar the root
    logger has its console handler back, writing to stderr."""
    with console_and_file_log(tmp_path / "run.log") as console:
        evaluate(_LoggingModel(num_classes=4), TensorDataset(n=6, num_classes=4), "cpu", batch_size=3,
                 progress="evaluating x test")
        assert console in logging.getLogger().handlers and console.stream is sys.stderr
    shown = capsys.readouterr().err
    lines = [line for line in shown.split("\n") if "a line logged under the bar" in line]
    assert len(lines) == 2 and all(line.split("\r")[-1] == "[console] a line logged under the bar"
                                   for line in lines), shown
    assert (tmp_path / "run.log").read_text() == "a line logged under the bar\n" * 2


def test_evaluate_script_writes_metrics_table_and_confusion_files(monkeypatch, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results" / "eval.v1.json"
    run_evaluate_script(StandInModel(), monkeypatch, tmp_path, f"out={out}")
    assert "evaluating stand_in test" in capsys.readouterr().err  # the progress bar (progress_bar=true)
    run_evaluate_script(StandInModel(), monkeypatch, tmp_path, f"out={out}", "progress_bar=false")
    metrics = json.loads(out.read_text())
    assert metrics["tta"] == "none" and metrics["dataset"] == "stand_in" and metrics["num_samples"] == 8
    assert set(metrics["per_class_f1"]) == set(STAND_IN_CLASSES) and "macro_f1" in metrics
    assert sorted(p.name for p in out.parent.iterdir()) == ["eval.v1.json", "eval.v1_confusion.csv",
                                                            "eval.v1_confusion.png"]
    assert Image.open(out.parent / "eval.v1_confusion.png").text["Title"].startswith("stand_in\ntest split, ensemble")
    with (out.parent / "eval.v1_confusion.csv").open() as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["true/predicted", *STAND_IN_CLASSES]
    assert [[int(n) for n in row[1:]] for row in table[1:]] == metrics["confusion_matrix"]
    captured = capsys.readouterr()
    assert "evaluating" not in captured.err  # progress_bar=false
    printed = captured.out
    heads = ", ".join(f"{head} {metrics['oa'][head]:.2f}" for head in ("main", "aux1", "ensemble"))
    assert (f"stand_in test split (8 images): accuracy {metrics['accuracy']:.2f} % [ensemble], "
            f"kappa {metrics['kappa']:.4f}; per head: {heads}; tta none") in printed.splitlines()
    assert f"macro average        8  {metrics['macro_precision']:>9.2f}" in printed


def test_evaluates_confusion_figure_is_titled_as_trainings(tmp_path: Path) -> None:
    """The PNG names the run (dataset, model, backbone), the split, the head and the epoch scored, as training's
    confusion.png does; an export names itself instead of an epoch; the title is drawn and kept as PNG text."""
    from rsnet.commands.evaluate import figure_title
    from rsnet.model_loading import LoadedModel, ModelSource

    metrics = {"dataset": "ucmerced_mini", "reported_head": "main", "epoch": 7, "tta": "none"}
    run = LoadedModel(StandInModel(), ModelSource(tmp_path / "best.pt", "checkpoint"), {},
                      {"model": {"arch": "esd_mbenet"}, "backbone": {"name": "resnet18"}}, epoch=7)
    assert figure_title(metrics, run) == ("ucmerced_mini: esd_mbenet on resnet18\n"
                                          "test split, main branch, epoch 7 (rsnet-evaluate)")
    export = LoadedModel(PlainClassifier(), ModelSource(tmp_path / "model.json", "export"),
                         {"arch": "baseline", "backbone": "resnet50"})
    assert figure_title({**metrics, "epoch": None, "reported_head": "ensemble", "tta": "d4"}, export) == \
        "ucmerced_mini: baseline on resnet50\ntest split, ensemble, exported model, tta d4 (rsnet-evaluate)"
    cm, names = np.array([[4, 1], [0, 3]]), ["forest", "river"]
    write_confusion_png(tmp_path / "plain.png", cm, names)
    write_confusion_png(tmp_path / "titled.png", cm, names, "ucmerced_mini: x\ntest split, main branch, epoch 7")
    plain, titled = Image.open(tmp_path / "plain.png"), Image.open(tmp_path / "titled.png")
    assert "Title" not in plain.text and titled.text["Title"].endswith("epoch 7")
    assert titled.size[1] > plain.size[1]  # drawn above the matrix


def test_an_older_runs_dataset_settings_are_completed_with_the_shared_defaults() -> None:
    """A run saved before dataset.val_ratio / high_bit_depth existed is scored with their defaults
    (conf/_base/dataset.yaml, the one place they are written), its own values kept."""
    from rsnet.commands.evaluate import dataset_settings

    older = {"dataset": {"name": "ucmerced_mini", "root": "/data/mini", "train_ratio": 0.8, "image_size": 64}}
    settings, runs_own = dataset_settings(compose_command("evaluate", "checkpoint=run"), older)
    shared = OmegaConf.to_container(OmegaConf.load(CONF / "_base" / "dataset.yaml"))
    assert runs_own and settings == {**shared, **older["dataset"]}
    assert settings["val_ratio"] == 0.0 and settings["high_bit_depth"] == "percentile"


@pytest.fixture(scope="module")
def mini_test() -> SceneDataset:
    """The bundled sample's test split at 32 px (210 images, 21 classes), cached in memory."""
    from conftest import MINI_ROOT

    return build_datasets("ucmerced_mini", MINI_ROOT, 0.5, 0, 32).test


def _esd_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("esd_mbenet", "test_resnet", num_classes=21).eval()


def _per_image_reference(model: torch.nn.Module, dataset: SceneDataset, batch_size: int) -> EvalResult:
    """What evaluate() computed before the cached path: the dataset's items one by one through a DataLoader (no
    workers), every head's softmax moved to the host batch by batch."""
    probabilities: dict[str, list[np.ndarray]] = {}
    targets = []
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(dataset, batch_size=batch_size):
            output = model(images)
            for head, logits in output.logits.items():
                probabilities.setdefault(head, []).append(torch.softmax(logits.float(), dim=1).numpy())
            targets.append(labels.numpy())
    joined = {head: np.concatenate(parts) for head, parts in probabilities.items()}
    return EvalResult({head: p.argmax(axis=1) for head, p in joined.items()}, joined, np.concatenate(targets),
                      output.ensemble)


def _assert_same_result(result: EvalResult, expected: EvalResult, atol: float = 1e-6) -> None:
    assert result.reported_head == expected.reported_head
    assert list(result.probabilities) == list(expected.probabilities)
    np.testing.assert_array_equal(result.targets, expected.targets)
    for head, probabilities in expected.probabilities.items():
        assert result.probabilities[head].dtype == np.float32
        np.testing.assert_allclose(result.probabilities[head], probabilities, rtol=0, atol=atol, err_msg=head)
        np.testing.assert_array_equal(result.predictions[head], expected.predictions[head], err_msg=head)


def test_cached_evaluation_predicts_as_the_per_image_path(mini_test: SceneDataset) -> None:
    """A SceneDataset is now read from its cache in whole batches: every head's predictions and probabilities are
    those of the per-image DataLoader it went through before."""
    model = _esd_model()
    expected = _per_image_reference(model, mini_test, batch_size=16)
    assert len(np.unique(expected.predictions["main"])) > 1  # a model that tells images apart
    _assert_same_result(evaluate(model, mini_test, "cpu", batch_size=16), expected)
    _assert_same_result(evaluate(model, mini_test, "cpu", batch_size=64), expected)  # another batching


def test_host_batched_transform_equals_the_per_image_items(mini_test: SceneDataset) -> None:
    """The host path (CPU workers, augment.on_device=false) gives exactly the per-image items' inputs and labels."""
    prefetcher = eval_prefetcher(mini_test, torch.device("cpu"), None)
    batches = list(prefetcher.batches(index_chunks(np.arange(len(mini_test)), 50)))
    prefetcher.close()
    assert [len(batch) for batch in batches] == [50, 50, 50, 50, 10]
    items = [mini_test[index] for index in range(len(mini_test))]
    assert torch.equal(torch.cat([batch.images for batch in batches]), torch.stack([image for image, _ in items]))
    assert torch.cat([batch.labels for batch in batches]).tolist() == [label for _, label in items]


def test_a_gpus_gather_into_pinned_memory_equals_the_stored_batch(mini_test: SceneDataset) -> None:
    """The one-copy gather a GPU's evaluation reads its uint8 batches with (here into unpinned memory): the pixels
    and labels of ``stored_batch``, in the order asked for."""
    chunk = np.array([200, 3, 77, 3, 150])
    images, labels = gather_stored_batch(mini_test, chunk, pin_memory=False)
    expected_images, expected_labels = mini_test.stored_batch(chunk)
    assert images.dtype == torch.uint8 and torch.equal(images, expected_images)
    assert torch.equal(labels, expected_labels)


def test_device_path_on_a_cpu_gives_the_host_paths_predictions(mini_test: SceneDataset) -> None:
    """The batches made the model's input by DeviceAugment (a GPU worker's path), here on the CPU: the same
    predictions, probabilities within float rounding of the host's normalisation."""
    from rsnet.data import DeviceAugment

    model = _esd_model()
    augment = DeviceAugment(32, IMAGENET_MEAN, IMAGENET_STD)
    feed = EvalFeed(on_device=augment, memory_format=torch.channels_last)
    _assert_same_result(evaluate(model, mini_test, "cpu", 32, feed=feed), evaluate(model, mini_test, "cpu", 32),
                        atol=1e-5)


def test_prefetching_evaluation_equals_the_inline_one(mini_test: SceneDataset, monkeypatch) -> None:
    """The next batch is read on the prefetch thread (or inline with prefetch=False): the same result, in order,
    also for a shard of the dataset."""
    threads: list[str] = []
    get_batch = mini_test.get_batch

    def recorded(indices):
        threads.append(threading.current_thread().name)
        return get_batch(indices)

    monkeypatch.setattr(mini_test, "get_batch", recorded)
    model, shard = _esd_model(), np.arange(37, 160)
    results = {}
    for prefetch in (True, False):
        threads.clear()
        results[prefetch] = evaluate(model, mini_test, "cpu", 16, indices=shard, feed=EvalFeed(prefetch=prefetch))
        assert len(threads) == 8 and all(name.startswith("rsnet-prefetch") == prefetch for name in threads), threads
    _assert_same_result(results[True], results[False], atol=0)
    np.testing.assert_array_equal(results[True].targets, mini_test.labels[shard])


def test_probabilities_reach_the_host_once_at_the_end(mini_test: SceneDataset, monkeypatch) -> None:
    """No host synchronisation per batch: 14 batches, 6 heads, and the host takes the probabilities in one transfer
    and the labels in another."""
    transfers = []
    cpu = torch.Tensor.cpu

    def counted(tensor, *args, **kwargs):
        transfers.append(tuple(tensor.shape))
        return cpu(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    result = evaluate(_esd_model(), mini_test, "cpu", batch_size=16)
    assert transfers == [(6 * 210 * 21,), (210,)]
    assert result.num_samples == 210


def test_eval_batch_size_auto_fills_a_gpu_and_keeps_64_on_a_cpu() -> None:
    assert eval_batch_size("auto", torch.device("cpu"), 256) == 64
    assert eval_batch_size("auto", "cuda:1", 32) == 256  # the floor: a small training batch
    assert eval_batch_size("auto", torch.device("cuda"), 256) == 512  # twice the training batch
    assert eval_batch_size("auto", "cuda") == 256
    assert eval_batch_size(100, "cuda", 256) == eval_batch_size(100, "cpu") == 100  # a number as given
    for bad in ("big", 0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match=r"^eval_batch_size=.*: use auto \(sized for each worker's device\) or "
                                             r"a whole number >= 1$"):
            eval_batch_size(bad, "cpu", 32)


def test_eval_batch_size_is_auto_by_default_and_a_bad_one_is_refused_in_one_line() -> None:
    from helpers import training_config

    from rsnet.engine.config_checks import ConfigError, check_training_config

    config = training_config("backbone=test_resnet")
    assert config["eval_batch_size"] == "auto"
    check_training_config(config)
    check_training_config(training_config("backbone=test_resnet", "eval_batch_size=300"))
    for bad in ("abc", "0", "2.5"):
        with pytest.raises(ConfigError, match=rf"^eval_batch_size={bad if bad != 'abc' else repr(bad)}: use auto"):
            check_training_config(training_config("backbone=test_resnet", f"eval_batch_size={bad}"))


def test_indices_select_items_of_a_dataset_only() -> None:
    data = TensorDataset(n=6)
    result = evaluate(PlainClassifier(), data, "cpu", batch_size=4, indices=[5, 1, 2])
    np.testing.assert_array_equal(result.targets, data.labels[[5, 1, 2]])
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(ValueError, match=r"^evaluate\(indices=\.\.\.\) selects items of a dataset, not of a "
                                         r"DataLoader$"):
        evaluate(PlainClassifier(), loader, "cpu", indices=[0])
