"""rsnet.inference, the Python API under rsnet-predict: the same predictions as the command, from a checkpoint and
from an export; and the command modules, which import it (and torch) only when they run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import PREDICT_CLASSES, REPO, checkpoint_payload, compose_command, load_predict_script
from PIL import Image

from rsnet.export import export_checkpoint
from rsnet.inference import list_images, load_predictor
from rsnet.models import build_model
from rsnet.checkpoint import save_checkpoint


@pytest.fixture
def scenes(tmp_path: Path) -> Path:
    folder = tmp_path / "scenes"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for name in ("x.png", "y.jpg", "z.tif"):
        Image.fromarray(rng.integers(0, 256, (45, 45, 3), dtype=np.uint8)).save(folder / name)
    return folder


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = build_model("esd_mbenet", "test_resnet", num_classes=len(PREDICT_CLASSES)).eval()
    return save_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt",
                           checkpoint_payload(model.model_config, model.state_dict()))


def test_the_python_api_gives_the_commands_predictions(checkpoint: Path, scenes: Path) -> None:
    predictor = load_predictor(checkpoint.parent.parent, device="cpu")  # a run folder, as the command takes it
    paths = list_images(scenes)
    images = predictor.read_images(paths)
    assert images.shape == (3, 32, 32, 3) and images.dtype == np.uint8
    top = predictor.top_k(images, k=2)
    probabilities = predictor.probabilities(images)
    assert probabilities.shape == (3, len(PREDICT_CLASSES))
    assert probabilities.sum(1).tolist() == pytest.approx([1.0] * 3)
    assert [[name for name, _ in row] for row in top] == \
        [[PREDICT_CLASSES[i] for i in row] for row in probabilities.topk(2, dim=1).indices.tolist()]
    rows = load_predict_script().predict(compose_command("predict", f"checkpoint={checkpoint}", f"images={scenes}",
                                                         "topk=2", "progress_bar=false"))
    assert [row["file"] for row in rows] == [str(path) for path in paths]
    assert [row["class"] for row in rows] == [names[0][0] for names in top]
    assert [row["probability"] for row in rows] == pytest.approx([names[0][1] for names in top], abs=1e-6)


def test_an_export_predicts_like_its_checkpoints_main_head(checkpoint: Path, scenes: Path, tmp_path: Path) -> None:
    export_checkpoint(checkpoint, tmp_path / "exported", format="timm")
    exported = load_predictor(tmp_path / "exported", device=torch.device("cpu"))
    full = load_predictor(checkpoint, device="cpu", head="main")
    images = full.read_images(list_images(scenes))
    assert exported.class_names == full.class_names and exported.full_model is None
    torch.testing.assert_close(exported.probabilities(images), full.probabilities(images), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="has no head 'nope'; heads: "):
        load_predictor(checkpoint, device="cpu", head="nope")


@pytest.mark.parametrize("command", ["train", "evaluate", "export", "predict", "aggregate"])
def test_a_command_module_imports_neither_torch_nor_the_model_code(command: str) -> None:
    """--help and a refused setting must not pay for torch and timm (seconds on a busy machine)."""
    probe = (f"import sys, rsnet.commands.{command}; "
             "print(sorted(m for m in ('torch', 'timm', 'albumentations', 'rsnet.inference', 'rsnet.models') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
