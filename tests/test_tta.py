"""Test-time augmentation (tta=d4): the 8 dihedral views, logits averaged, in evaluate and predict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from helpers import (PREDICT_CLASSES, STAND_IN_CLASSES, PlainClassifier, StandInModel, TensorDataset,
                     checkpoint_payload, compose_command, load_predict_script, run_evaluate_script)
from torch import nn

from rsnet.data import to_float_chw
from rsnet.evaluation import TTAModel, compute_metrics, d4_views, evaluate
from rsnet.inference import read_image
from rsnet.models.output import MultiBranchOutput
from rsnet.commands.values import tta_setting
from rsnet.checkpoint import save_checkpoint


class InvariantModel(nn.Module):
    """1x1 conv -> global average pool -> two linear heads: the same logits for every rotation and flip."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.pointwise = nn.Conv2d(3, 6, 1)
        self.fc_main = nn.Linear(6, num_classes)
        self.fc_aux1 = nn.Linear(6, num_classes)

    def forward(self, x: torch.Tensor) -> MultiBranchOutput:
        pooled = torch.relu(self.pointwise(x)).mean(dim=(2, 3))
        logits = {"main": self.fc_main(pooled), "aux1": self.fc_aux1(pooled)}
        logits["ensemble"] = (logits["main"] + logits["aux1"]) / 2
        return MultiBranchOutput(logits=logits, ensemble="ensemble")


def _by_hand(x: torch.Tensor) -> list[torch.Tensor]:
    """The 8 views written out: rotations by 0/90/180/270 degrees, then each flipped left-right."""
    rotations = [x, x.rot90(1, (2, 3)), x.rot90(2, (2, 3)), x.rot90(3, (2, 3))]
    return rotations + [r.flip(3) for r in rotations]


def test_d4_views_are_distinct_and_invert() -> None:
    x = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).reshape(2, 3, 5, 5)
    views = d4_views(x)
    assert len(views) == 8 and torch.equal(views[0], x)
    assert all(not torch.equal(views[i], views[j]) for i in range(8) for j in range(i))
    for view, expected in zip(views, _by_hand(x)):
        assert torch.equal(view, expected)
    for k in range(4):  # undo: rotate back; for the flipped ones flip first
        assert torch.equal(views[k].rot90(-k, (2, 3)), x)
        assert torch.equal(views[4 + k].flip(3).rot90(-k, (2, 3)), x)
    for view in views:  # a group: the views of any view are the views of x
        assert {tuple(v.flatten().tolist()) for v in d4_views(view)} == {tuple(v.flatten().tolist()) for v in views}


def test_tta_of_an_invariant_model_equals_its_plain_logits() -> None:
    torch.manual_seed(0)
    model, x = InvariantModel().eval(), torch.randn(3, 3, 9, 9)
    with torch.no_grad():
        plain, tta = model(x), TTAModel(model)(x)
    assert isinstance(tta, MultiBranchOutput) and tta.ensemble == "ensemble" and tta.main == "main"
    assert set(tta.logits) == {"main", "aux1", "ensemble"}
    for head, logits in plain.logits.items():
        torch.testing.assert_close(tta.logits[head], logits)
    plain_model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4))
    with torch.no_grad():
        torch.testing.assert_close(TTAModel(plain_model)(x), plain_model(x))


def test_tta_averages_the_logits_of_the_8_views() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    model = StandInModel().eval()
    with torch.no_grad():
        tta = TTAModel(model)(x)
        views = [model(view) for view in _by_hand(x)]
    assert tta.ensemble == "ensemble"
    for head in ("main", "aux1", "ensemble"):
        expected = torch.stack([output.logits[head] for output in views]).mean(dim=0)
        torch.testing.assert_close(tta.logits[head], expected)
        assert not torch.allclose(tta.logits[head], views[0].logits[head])  # the model is not invariant
    plain = PlainClassifier().eval()
    with torch.no_grad():
        logits = TTAModel(plain)(x)
        expected = torch.stack([plain(view) for view in _by_hand(x)]).mean(dim=0)
    assert isinstance(logits, torch.Tensor)
    torch.testing.assert_close(logits, expected)


def test_tta_setting() -> None:
    assert tta_setting("none") == "none" and tta_setting("d4") == "d4"
    for bad in ("abc", "D4", None):
        with pytest.raises(ValueError, match=rf"^tta={bad!r}: must be none or d4 "):
            tta_setting(bad)


def test_evaluate_script_accepts_tta(monkeypatch, tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    model, out = StandInModel(), tmp_path / "eval.json"
    run_evaluate_script(model, monkeypatch, tmp_path, f"out={out}", "tta=d4")
    metrics = json.loads(out.read_text())
    expected = compute_metrics(evaluate(TTAModel(model), TensorDataset(n=8, size=16), "cpu"), STAND_IN_CLASSES)
    assert metrics["tta"] == "d4" and metrics["oa"] == pytest.approx(expected["oa"])
    assert metrics["confusion_matrix"] == expected["confusion_matrix"]
    heads = ", ".join(f"{head} {metrics['oa'][head]:.2f}" for head in ("main", "aux1", "ensemble"))
    assert (f"stand_in test split (8 images): accuracy {metrics['accuracy']:.2f} % [ensemble], "
            f"kappa {metrics['kappa']:.4f}; per head: {heads}; tta d4") in capsys.readouterr().out.splitlines()
    with pytest.raises(SystemExit) as stop:
        run_evaluate_script(model, monkeypatch, tmp_path, f"out={tmp_path / 'bad.json'}", "tta=abc")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: tta='abc': must be none or d4") and err.count("\n") == 1
    assert not (tmp_path / "bad.json").exists()


def test_predict_accepts_tta(tmp_path: Path, monkeypatch, capsys) -> None:
    import rsnet.model_loading

    predict_mod = load_predict_script()
    torch.manual_seed(0)
    model = StandInModel(num_classes=4)
    model.model_config = {"arch": "stand_in"}
    monkeypatch.setattr(rsnet.model_loading, "model_from_checkpoint", lambda ckpt, source=None: model)
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", checkpoint_payload({"arch": "stand_in"}, model.state_dict()))
    images = tmp_path / "imgs"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(images / name)
    rows = predict_mod.predict(compose_command("predict", f"checkpoint={ckpt}", f"images={images}", "head=main",
                                               "tta=d4"))
    pixels = np.stack([read_image(images / name, 32) for name in ("a.png", "b.png")])
    x = to_float_chw(pixels, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    with torch.no_grad():
        probs = torch.softmax(torch.stack([model(view).logits["main"] for view in _by_hand(x)]).mean(0), dim=1)
    assert [r["class"] for r in rows] == [PREDICT_CLASSES[i] for i in probs.argmax(1).tolist()]
    assert [r["probability"] for r in rows] == pytest.approx(probs.max(1).values.tolist(), abs=1e-5)
    assert f"checkpoint {ckpt}: stand_in (main head, epoch 1, tta d4): 4 classes, 32 px, 2 images" in \
        capsys.readouterr().err.splitlines()
    with pytest.raises(SystemExit) as stop:
        predict_mod.main(compose_command("predict", f"checkpoint={ckpt}", f"images={images}", "tta=abc"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: tta='abc': must be none or d4") and err.count("\n") == 1
