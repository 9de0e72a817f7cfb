"""scripts/predict.py: argument parsing, bad input, in-process with a stand-in, end-to-end as a subprocess."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from helpers import PREDICT_CLASSES, REPO, StandInModel, checkpoint_payload, compose_command, load_predict_script

import rsnet.export
import rsnet.exported_model
import rsnet.inference
import rsnet.model_loading
from rsnet.data import to_float_chw
from rsnet.checkpoint import save_checkpoint

SCRIPT = REPO / "scripts" / "predict.py"


@pytest.fixture(scope="module")
def predict_mod():
    return load_predict_script()


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, size in [("a.jpg", 40), ("b.png", 32), ("c.tif", 50)]:
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    return folder


def predict_command(arguments: list[str]):
    """rsnet-predict's settings for this command line (conf/predict.yaml)."""
    return compose_command("predict", *arguments)


def test_settings_come_from_conf_predict_yaml(predict_mod, capsys) -> None:
    args = compose_command("predict", "checkpoint=m.pt", "images=x", "topk=5", "out=p.csv")
    assert args.checkpoint == "m.pt" and args.topk == 5 and args.out == "p.csv"
    assert args.device == "auto" and args.tta == "none" and args.recursive is False  # the defaults of the config
    with pytest.raises(SystemExit) as stop:  # a required setting left out: one line naming it
        predict_mod.main(compose_command("predict", "checkpoint=m.pt"))
    assert stop.value.code == 2 and "images=... is required" in capsys.readouterr().err


def test_bad_inputs_name_the_path(predict_mod, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no images .* found in .*empty"):
        rsnet.inference.list_images(empty)
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=re.escape(f"images={missing}: no such image file or folder; pass an "
                                                          "image, or a folder of images")):
        rsnet.inference.list_images(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(f"images={missing}.jpg: no such image file; ")):
        rsnet.inference.list_images(f"{missing}.jpg")  # a missing file is not called a folder
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="cannot read image .*broken.jpg"):
        rsnet.inference.read_image(broken, 32)
    sample = sorted((REPO / "data/ucmerced-mini/Images/forest").glob("*.jpg"))[0]
    assert rsnet.inference.read_image(sample, 48).shape == (48, 48, 3)


def test_predict_in_process_with_stand_in(predict_mod, image_dir: Path, tmp_path: Path, monkeypatch,
                                          capsys) -> None:
    torch.manual_seed(0)
    model = StandInModel(num_classes=4)
    model.model_config = {"arch": "stand_in"}

    monkeypatch.setattr(rsnet.model_loading, "model_from_checkpoint", lambda ckpt, source=None: model)
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", checkpoint_payload({"arch": "stand_in"}, model.state_dict()))
    out, attn = tmp_path / "preds.csv", tmp_path / "attn"
    rows = predict_mod.predict(predict_command(
        [f"checkpoint={ckpt}", f"images={image_dir}", f"out={out}", f"attention_dir={attn}", "topk=2"]))
    assert [Path(r["file"]).name for r in rows] == ["a.jpg", "b.png", "c.tif"]
    with out.open() as handle:
        table = list(csv.DictReader(handle))
    assert table == [{**r, "probability": f"{r['probability']:.6f}"} for r in rows]  # the CSV holds the rows
    images = np.stack([rsnet.inference.read_image(image_dir / n, 32) for n in ("a.jpg", "b.png", "c.tif")])
    with torch.no_grad():
        expected = model(to_float_chw(images, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]))
    # by default the ensemble scores: its top 2 classes and their probabilities
    top_p, top_i = torch.softmax(expected.logits["ensemble"], dim=1).topk(2, dim=1)
    assert [r["class"] for r in rows] == [PREDICT_CLASSES[i] for i in top_i[:, 0].tolist()]
    assert [r["probability"] for r in rows] == pytest.approx(top_p[:, 0].tolist(), abs=1e-6)
    assert [[part.split(" ")[0] for part in r["top_k"].split("; ")] for r in rows] == \
        [[PREDICT_CLASSES[i] for i in pair] for pair in top_i.tolist()]
    written = sorted(p.name for p in attn.iterdir())
    assert written == sorted(f"{s}_{t}.png" for s in "abc" for t in ("cam_main", "cam_aux1"))
    shown = capsys.readouterr()
    assert "classifying" in shown.err and "/3 " in shown.err  # the progress bar, on stderr
    assert shown.out.splitlines() == [f"{r['file']}\t{r['class']}\t{r['probability']:.4f}\t[{r['top_k']}]"
                                      for r in rows]  # stdout: the predictions only
    predict_mod.predict(predict_command([f"checkpoint={ckpt}", f"images={image_dir}", "progress_bar=false"]))
    assert "classifying" not in capsys.readouterr().err
    # was a bare 32 x 32 overlay: now the image beside it, each enlarged to 256 px, a caption and a colour bar
    picture = np.asarray(Image.open(attn / "a_cam_main.png").convert("RGB"))
    assert picture.shape[0] >= 256 + 36 and picture.shape[1] > 2 * 256  # at least 512 px wide
    assert (picture[22:22 + 256, 4:4 + 256] != 255).any()  # the enlarged image, below the title
    # head=main scores the main branch
    rows_main = predict_mod.predict(predict_command([f"checkpoint={ckpt}", f"images={image_dir}", "head=main"]))
    assert [r["class"] for r in rows_main] == [PREDICT_CLASSES[i] for i in expected.logits["main"].argmax(1).tolist()]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_predict_end_to_end_subprocess(image_dir: Path, tmp_path: Path) -> None:
    from rsnet.models import build_model

    torch.manual_seed(0)
    model = build_model("esd_mbenet", "test_resnet", num_classes=len(PREDICT_CLASSES))
    ckpt = save_checkpoint(tmp_path / "best.pt", checkpoint_payload(model.model_config, model.state_dict()))
    out, attn = tmp_path / "preds.csv", tmp_path / "attn"
    result = _run(f"checkpoint={ckpt}", f"images={image_dir}", f"out={out}", f"attention_dir={attn}")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 3
    with out.open() as handle:
        assert [Path(r["file"]).name for r in csv.DictReader(handle)] == ["a.jpg", "b.png", "c.tif"]
    heads = model.cam_classifiers()
    assert {p.name for p in attn.iterdir()} == {f"{s}_{t}.png" for s in "abc" for t in (f"cam_{h}" for h in heads)}



def test_main_reports_bad_input_in_one_line(predict_mod, image_dir: Path, tmp_path: Path, capsys) -> None:
    (image_dir / "zz_broken.png").write_bytes(b"garbage")
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", checkpoint_payload({"arch": "stand_in"}, {}))
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv, needle in [([f"checkpoint={tmp_path / 'nope.pt'}", f"images={image_dir}"], "nope.pt"),
                         ([f"checkpoint={ckpt}", f"images={empty}"],
                          f"no images (.tif, .tiff, .jpg, .jpeg, .png, .bmp) found in {empty}"),
                         ([f"checkpoint={ckpt}", f"images={image_dir}", "topk=abc"], "topk='abc'")]:
        with pytest.raises(SystemExit) as stop:
            predict_mod.main(predict_command(argv))
        assert stop.value.code == 2 and needle in capsys.readouterr().err
    with pytest.raises(ValueError, match="zz_broken.png"):
        rsnet.inference.read_image(image_dir / "zz_broken.png", 32)


def test_skip_corrupt(predict_mod, image_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:

    model = StandInModel(num_classes=4)
    model.model_config = {"arch": "stand_in"}
    monkeypatch.setattr(rsnet.model_loading, "model_from_checkpoint", lambda ckpt, source=None: model)
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", checkpoint_payload({"arch": "stand_in"}, model.state_dict()))
    (image_dir / "b2_broken.png").write_bytes(b"garbage")
    (image_dir / "d_broken.jpg").write_bytes(b"garbage")
    args = [f"checkpoint={ckpt}", f"images={image_dir}", "batch_size=2"]
    listed = r"2 unreadable image\(s\): .*b2_broken.png, .*d_broken.jpg; .*skip_corrupt=true"
    with pytest.raises(ValueError, match=listed):
        predict_mod.predict(predict_command(args))
    assert len(capsys.readouterr().out.splitlines()) == 2  # stopped at the batch holding the first bad image
    rows = predict_mod.predict(predict_command([*args, "skip_corrupt=true"]))
    assert [Path(r["file"]).name for r in rows] == ["a.jpg", "b.png", "c.tif"]
    err = capsys.readouterr().err
    assert "skipped 2 unreadable image(s) (skip_corrupt=true): " in err and "d_broken.jpg" in err
    assert "dataset.skip_corrupt" not in err


def test_a_run_folder_without_best_pt_means_its_last(predict_mod, image_dir: Path, tmp_path: Path, monkeypatch,
                                                     capsys) -> None:

    model = StandInModel(num_classes=4)
    model.model_config = {"arch": "stand_in"}
    monkeypatch.setattr(rsnet.model_loading, "model_from_checkpoint", lambda ckpt, source=None: model)
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints" / "last.pt", checkpoint_payload({"arch": "stand_in"}, model.state_dict()))
    predict_mod.predict(predict_command([f"checkpoint={run}", f"images={image_dir}"]))
    assert f"checkpoint {run / 'checkpoints' / 'last.pt'} (the last checkpoint of {run})" in capsys.readouterr().err


def _image_names(folder: Path, tags: list[str]) -> set[str]:
    return {f"{stem}_{tag}.png" for stem in "abc" for tag in tags}


@pytest.fixture
def esd_checkpoint(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    from rsnet.models import build_model

    torch.manual_seed(0)
    model = build_model("esd_mbenet", "test_resnet", num_classes=len(PREDICT_CLASSES)).eval()
    return model, save_checkpoint(tmp_path / "best.pt", checkpoint_payload(model.model_config, model.state_dict()))


@pytest.mark.parametrize("fmt", ["torchscript", "state_dict", "timm"])
def test_an_export_predicts_like_the_main_branch_and_draws_its_attention(fmt, esd_checkpoint, image_dir: Path,
                                                                         tmp_path: Path, predict_mod) -> None:
    from rsnet.export import attention_model, export_checkpoint
    from rsnet.exported_model import load_exported
    from rsnet.viz.attention import grad_cam

    model, ckpt = esd_checkpoint
    export_checkpoint(ckpt, tmp_path / "exported", format=fmt)
    attn = tmp_path / "attn"
    exported_rows = predict_mod.predict(predict_command([f"checkpoint={tmp_path / 'exported'}", f"images={image_dir}",
                                                         f"attention_dir={attn}"]))
    full_rows = predict_mod.predict(predict_command([f"checkpoint={ckpt}", f"images={image_dir}", "head=main"]))
    assert [r["class"] for r in exported_rows] == [r["class"] for r in full_rows]
    for a, b in zip(exported_rows, full_rows):
        assert a["probability"] == pytest.approx(b["probability"], abs=1e-4)
    assert {p.name for p in attn.iterdir()} == _image_names(attn, ["cam_main"])
    # the maps are the main branch's own: Grad-CAM of the rebuilt export == the full model's main-head Grad-CAM
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(grad_cam(attention_model(load_exported(tmp_path / "exported")), x),
                               grad_cam(model, x, head="main"), atol=1e-5, rtol=1e-4)


def test_an_ensemble_export_draws_every_heads_attention(esd_checkpoint, image_dir: Path, tmp_path: Path,
                                                        predict_mod) -> None:
    from rsnet.export import export_checkpoint

    model, ckpt = esd_checkpoint
    export_checkpoint(ckpt, tmp_path / "exported", format="torchscript", head="ensemble")
    attn = tmp_path / "attn"
    predict_mod.predict(predict_command([f"checkpoint={tmp_path / 'exported'}", f"images={image_dir}",
                                         f"attention_dir={attn}"]))
    tags = [f"cam_{head}" for head in model.cam_classifiers()]
    assert {p.name for p in attn.iterdir()} == _image_names(attn, tags)


def test_attention_from_an_onnx_export_is_refused_before_any_image(esd_checkpoint, image_dir: Path, tmp_path: Path,
                                                                    predict_mod, capsys) -> None:
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx packages (pip install -e .[onnx])")
    pytest.importorskip("onnxruntime")
    from rsnet.export import export_checkpoint

    export_checkpoint(esd_checkpoint[1], tmp_path / "onnx", format="onnx")
    with pytest.raises(SystemExit) as stop:
        predict_mod.main(predict_command([f"checkpoint={tmp_path / 'onnx'}", f"images={image_dir}",
                                          f"attention_dir={tmp_path / 'attn'}"]))
    captured = capsys.readouterr()
    assert stop.value.code == 2 and captured.out == ""
    assert "attention maps cannot be drawn from the ONNX export model.onnx" in captured.err
    assert "format=torchscript|state_dict|timm" in captured.err


def test_a_rebuilt_export_that_disagrees_with_the_export_is_refused(esd_checkpoint, tmp_path: Path,
                                                                     monkeypatch) -> None:
    from rsnet.models.main_branch import baseline_from_main_branch

    rsnet.export.export_checkpoint(esd_checkpoint[1], tmp_path / "exported", format="state_dict")
    exported = rsnet.exported_model.load_exported(tmp_path / "exported")

    def other_weights(state, backbone, num_classes, in_chans=3, main_pool="avg", main_heads=()):
        model = baseline_from_main_branch(state, backbone, num_classes, in_chans, main_pool, main_heads)
        torch.nn.init.normal_(model.backbone.classifier.weight, std=1.0)
        return model

    monkeypatch.setattr(rsnet.export, "baseline_from_main_branch", other_weights)
    with pytest.raises(rsnet.exported_model.ExportError, match="does not give the export's logits"):
        rsnet.export.attention_model(exported)


@pytest.mark.parametrize("high_bit_depth", [None, "refuse"])
def test_16_bit_images_are_decoded_as_the_run_decoded_them(predict_mod, tmp_path: Path, monkeypatch, capsys,
                                                         high_bit_depth: str | None) -> None:
    """Was: a 16-bit TIFF became a solid white image and predict printed a confident class for it."""

    model = StandInModel(num_classes=4)
    model.model_config = {"arch": "stand_in"}
    monkeypatch.setattr(rsnet.model_loading, "model_from_checkpoint", lambda ckpt, source=None: model)
    config = {"dataset": {"high_bit_depth": high_bit_depth}} if high_bit_depth else {}
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", {**checkpoint_payload({"arch": "stand_in"}, model.state_dict()),
                                                   "config": config})
    folder = tmp_path / "imgs16"
    folder.mkdir()
    gradient = np.tile(np.linspace(1000, 4000, 40).astype("<u2"), (40, 1))  # 12 bits used of 16
    Image.frombytes("I;16", (40, 40), gradient.tobytes()).save(folder / "dem.tif")
    args = predict_command([f"checkpoint={ckpt}", f"images={folder}"])
    if high_bit_depth == "refuse":  # the run's own setting applies, naming the file
        with pytest.raises(ValueError, match=r"dem\.tif.*I;16"):
            predict_mod.predict(args)
        return
    assert len(predict_mod.predict(args)) == 1
    assert "warning: 1 of 1 images have 16-bit or float pixels (I;16: 1) and were rescaled" in capsys.readouterr().err
    pixels = rsnet.inference.read_image(folder / "dem.tif", 32)
    assert pixels.min() < 10 and pixels.max() > 245  # stretched (after resizing), not clipped to white


@pytest.fixture
def stand_in_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint that rsnet-predict loads as a StandInModel with 4 classes."""
    torch.manual_seed(0)
    model = StandInModel(num_classes=4)
    model.model_config = {"arch": "stand_in"}
    monkeypatch.setattr(rsnet.model_loading, "model_from_checkpoint", lambda ckpt, source=None: model)
    return save_checkpoint(tmp_path / "ckpt.pt", checkpoint_payload({"arch": "stand_in"}, model.state_dict()))


def test_attention_pictures_of_images_that_share_a_name_never_overwrite_each_other(predict_mod, tmp_path: Path,
                                                                                    stand_in_checkpoint: Path) -> None:
    """x.jpg and x.png, a/b__c.jpg and a__b/c.jpg: four images, four sets of pictures (a name two images would share
    gets a hash of each one's path); an image whose name no other shares keeps its plain name."""
    ckpt = stand_in_checkpoint
    images, attn = tmp_path / "imgs", tmp_path / "attn"
    rng = np.random.default_rng(1)
    for name in ("x.jpg", "x.png", "a/b__c.jpg", "a__b/c.jpg", "alone.jpg"):
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(images / name)
    predict_mod.predict(predict_command([f"checkpoint={ckpt}", f"images={images}", f"attention_dir={attn}",
                                         "recursive=true", "progress_bar=false"]))
    written = sorted(p.name for p in attn.iterdir())
    assert len(written) == 5 * 2  # five images, two CAM heads each
    assert {"alone_cam_main.png", "alone_cam_aux1.png"} <= set(written)
    assert sum(name.startswith("x-") for name in written) == 4
    assert sum(name.startswith("a__b__c-") for name in written) == 4


def test_a_file_name_that_is_not_utf8_is_written_to_the_csv_as_it_is(predict_mod, image_dir: Path, tmp_path: Path,
                                                                     stand_in_checkpoint: Path) -> None:
    """Was: every row printed, then `'utf-8' codec can't encode character '\\udce9'` and no CSV. The CSV now names
    such a file with the bytes the file system holds."""
    ckpt = stand_in_checkpoint
    (image_dir / "a.jpg").rename(image_dir / os.fsdecode(b"caf\xe9.jpg"))
    out = tmp_path / "preds.csv"
    rows = predict_mod.predict(predict_command([f"checkpoint={ckpt}", f"images={image_dir}", f"out={out}",
                                                "progress_bar=false"]))
    assert len(rows) == 3
    written = out.read_bytes()
    assert os.fsencode(str(image_dir)) + b"/caf\xe9.jpg," in written and written.count(b"\n") == 4  # header + 3
