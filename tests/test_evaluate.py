"""Evaluation metrics; also defines the stand-in models the viz and predict tests share."""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image
from torch import nn

from rsnet.evaluation import (
    EvalResult,
    cohen_kappa,
    compute_metrics,
    confusion_matrix,
    evaluate,
    precision_recall_f1,
    write_confusion_csv,
    write_confusion_png,
)
from rsnet.trained_model import LoadedModel, ModelSource
from rsnet.models.output import MultiBranchOutput


class StandInModel(nn.Module):
    """conv trunk -> two branches (main, aux1), each GAP -> Linear; ensemble = mean of their logits."""

    def __init__(self, num_classes: int = 4, width: int = 8) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                   nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU())
        self.main_block = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.aux_block = nn.Sequential(nn.Conv2d(width, width, 3, padding=2, dilation=2), nn.ReLU())
        self.fc_main = nn.Linear(width, num_classes)
        self.fc_aux1 = nn.Linear(width, num_classes)

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        return {"main": self.fc_main, "aux1": self.fc_aux1}

    def forward(self, x: torch.Tensor) -> MultiBranchOutput:
        shared = self.trunk(x)
        features = {"main": self.main_block(shared), "aux1": self.aux_block(shared)}
        logits = {k: self.cam_classifiers()[k](f.mean(dim=(2, 3))) for k, f in features.items()}
        logits["ensemble"] = (logits["main"] + logits["aux1"]) / 2
        return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble")


class PlainClassifier(nn.Module):
    """An exported-style model: returns a logits Tensor."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TensorDataset(torch.utils.data.Dataset):
    def __init__(self, n: int = 10, num_classes: int = 4, size: int = 32, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.labels = (torch.arange(n) % num_classes).numpy()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.x[i], int(self.labels[i])


CLASSES = list("abcd")
EVALUATE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "evaluate.py"


def run_evaluate_script(model: nn.Module, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *overrides: str) -> None:
    """scripts/evaluate.py in-process, its command line ``overrides`` parsed by Hydra from conf/evaluate.yaml; the
    checkpoint is ``model`` (classes a-d, 16 px) and its test split ``TensorDataset(n=8, size=16)``."""
    script = importlib.import_module("rsnet.commands.evaluate")  # the code of scripts/evaluate.py (a thin wrapper)
    loaded = LoadedModel(model, ModelSource(tmp_path / "run" / "checkpoints" / "best.pt", "checkpoint"),
                         {"class_names": CLASSES, "image_size": 16, "mean": [0.5] * 3, "std": [0.5] * 3},
                         {"dataset": {"name": "stand_in", "train_ratio": 0.5}, "seed": 0})
    monkeypatch.setattr(script, "load_model", lambda path, device: loaded)
    monkeypatch.setattr(script, "build_datasets_from_config", lambda *args, **kwargs: SimpleNamespace(
        test=TensorDataset(n=8, size=16), class_names=CLASSES))
    with initialize_config_dir(config_dir=str(EVALUATE_SCRIPT.parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=["checkpoint=stand_in", *overrides])
    script.main(cfg)


# --------------------------------------------------------------------------------------------- tests


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
    with pytest.raises(ValueError):
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
    with pytest.raises(ValueError, match="empty"):
        evaluate(StandInModel(), TensorDataset(n=0), "cpu")


def test_evaluate_real_model_when_available() -> None:
    models = pytest.importorskip("rsnet.models")
    net = models.build_model("esd_mbenet", "test_resnet", num_classes=4)
    result = evaluate(net, TensorDataset(n=6, size=64), "cpu", batch_size=4)
    assert {"main", result.reported_head} <= set(result.predictions)
    metrics = compute_metrics(result, list("abcd"))
    assert set(metrics["oa"]) == set(result.predictions) and metrics["num_samples"] == 6


def test_evaluate_list_of_batches() -> None:
    data = TensorDataset(n=6)
    batches = [(data.x[:4], torch.as_tensor(data.labels[:4])), (data.x[4:], torch.as_tensor(data.labels[4:]))]
    result = evaluate(PlainClassifier(), batches, "cpu")
    np.testing.assert_array_equal(result.targets, data.labels)


def test_inference_settings_name_themselves(tmp_path) -> None:
    from rsnet.settings import check_writable, int_setting, resolve_device

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


def test_evaluate_script_writes_metrics_table_and_confusion_files(monkeypatch, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results" / "eval.v1.json"
    run_evaluate_script(StandInModel(), monkeypatch, tmp_path, f"out={out}")
    metrics = json.loads(out.read_text())
    assert metrics["tta"] == "none" and metrics["dataset"] == "stand_in" and metrics["num_samples"] == 8
    assert set(metrics["per_class_f1"]) == set(CLASSES) and "macro_f1" in metrics
    assert sorted(p.name for p in out.parent.iterdir()) == ["eval.v1.json", "eval.v1_confusion.csv",
                                                            "eval.v1_confusion.png"]
    with (out.parent / "eval.v1_confusion.csv").open() as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["true/predicted", *CLASSES]
    assert [[int(n) for n in row[1:]] for row in table[1:]] == metrics["confusion_matrix"]
    printed = capsys.readouterr().out
    assert "tta none" in printed
    assert f"macro average        8  {metrics['macro_precision']:>9.2f}" in printed
