"""Evaluation extras: VGG's main-branch attention on conv5, the HParams tab and the embedding projector."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import training_config
from PIL import Image

from rsnet.engine.config_checks import ConfigError, check_training_config
from rsnet.models import build_model
from rsnet.viz.attention import attention_source, class_activation_maps, grad_cam, normalize_maps
from rsnet.viz.embedding import dataset_embedding, main_branch_features, pick_embedding_images, thumbnail_side
from rsnet.viz.tensorboard import TensorBoardLogger, flatten_config, hparam_metrics


@pytest.fixture(scope="module")
def vgg() -> torch.nn.Module:
    """The smallest timm VGG (pool5 -> ConvMlp -> GAP -> fc head) in a multi-branch model."""
    torch.manual_seed(0)
    return build_model("esd_mbenet", "vgg11", num_classes=3)


def _accumulator(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_vgg_main_maps_are_drawn_on_conv5(vgg: torch.nn.Module) -> None:
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    vgg.eval()
    with torch.no_grad():
        output = vgg(images)
    assert output.features["main"].shape[-2:] == (1, 1)  # timm's head map: pooled before the classifier
    assert attention_source(output, "main").shape == (2, 512, 4, 4)  # conv5 at stride 16
    assert attention_source(output, "aux1") is output.features["aux1"]
    native = grad_cam(vgg, images, size=(4, 4))  # at conv5's own resolution
    assert native.shape == (2, 4, 4) and bool((native.flatten(1).std(dim=1) > 0).all())
    cams = class_activation_maps(vgg, images)
    assert cams["main"].shape == (2, 64, 64) and bool((cams["main"].flatten(1).std(dim=1) > 0).all())
    # no linear layer reads conv5: the main CAM is the Grad-CAM on conv5, upsampled to the image
    torch.testing.assert_close(cams["main"], normalize_maps(native, (64, 64)), atol=1e-5, rtol=1e-4)
    assert {"aux1", "aux2", "feature_ensemble"} < set(cams)


def test_resnet_main_maps_stay_on_the_pooled_map() -> None:
    net = build_model("baseline", "test_resnet", num_classes=3).eval()
    with torch.no_grad():
        output = net(torch.randn(1, 3, 64, 64))
    assert attention_source(output, "main") is output.features["main"]


def test_flatten_config() -> None:
    config = {"seed": 0, "amp": True, "run_dir": "out/x", "optimizer": {"lr": 0.02, "nesterov": False},
              "lr_schedule": {"milestones": [0.5, 0.75]}, "max_grad_norm": None, "model": {"options": {"k": 3}}}
    assert flatten_config(config) == {
        "seed": 0, "amp": True, "run_dir": "out/x", "optimizer.lr": 0.02, "optimizer.nesterov": False,
        "lr_schedule.milestones": "[0.5, 0.75]", "max_grad_norm": "None", "model.options.k": 3}


def test_hparam_metrics() -> None:
    summary = {"accuracy": 91.0, "kappa": 0.9, "average_accuracy": 90.5, "val_accuracy": 92.0,
               "oa": {"main": 89.0, "ensemble": 91.0}, "per_class_accuracy": {"a": 1.0}, "history": []}
    assert hparam_metrics(summary) == {"accuracy": 91.0, "average_accuracy": 90.5, "kappa": 0.9,
                                       "val_accuracy": 92.0, "oa_main": 89.0, "oa_ensemble": 91.0}


def test_hparams_are_written_into_the_run(tmp_path) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    config = {"seed": 3, "amp": True, "optimizer": {"lr": 0.02}, "lr_schedule": {"milestones": [0.5, 0.75]},
              "backbone": {"name": "resnet18"}}
    with TensorBoardLogger(tmp_path) as logger:
        logger.scalars({"train/loss": 1.0}, step=1)
        logger.hparams(config, {"accuracy": 91.5, "oa_main": 90.0, "kappa": 0.88}, step=12)
    assert not [path for path in tmp_path.iterdir() if path.is_dir()]  # no sub-run
    acc = _accumulator(tmp_path)
    assert acc.Scalars("hparam/accuracy")[0].value == pytest.approx(91.5)
    assert acc.Scalars("hparam/kappa")[0].step == 12
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {info.name.tag for info in experiment.metric_infos} == {"hparam/accuracy", "hparam/oa_main", "hparam/kappa"}
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["optimizer.lr"].number_value == pytest.approx(0.02)
    assert hparams["backbone.name"].string_value == "resnet18"
    assert hparams["lr_schedule.milestones"].string_value == "[0.5, 0.75]"
    assert hparams["seed"].number_value == 3
    assert hparams["amp"].number_value == 1.0  # torch stores bools as numbers (docs/tensorboard.md says so)


@pytest.mark.parametrize("backbone", ["test_resnet", "densenet121", "vgg11"])
def test_main_branch_features_are_the_classifier_input(backbone: str, vgg: torch.nn.Module) -> None:
    torch.manual_seed(0)
    arch = {"test_resnet": "mgml_fenet", "densenet121": "baseline"}
    net = vgg if backbone == "vgg11" else build_model(arch[backbone], backbone, num_classes=3)
    images = torch.randn(3, 3, 32, 32)
    features = main_branch_features(net, images.split(2))
    width = {"test_resnet": 96, "densenet121": 1024, "vgg11": 4096}[backbone]  # timm's pre-logits widths
    assert features.shape == (3, width) == (3, net.backbone.classifier.in_features)
    net.eval()
    with torch.no_grad():
        logits = net(images).logits["main"]
    torch.testing.assert_close(net.backbone.classifier(features), logits, atol=1e-4, rtol=1e-4)


def test_pick_embedding_images() -> None:
    labels = [1, 0, 1, 1, 0, 2, 1]
    assert pick_embedding_images(labels, 6) == [0, 1, 2, 4, 5]
    assert pick_embedding_images(labels, 2) == [0, 1, 5]  # at least one per class
    assert pick_embedding_images(labels, None) == list(range(7))
    assert thumbnail_side(10) == 32 and thumbnail_side(100_000) == 8192 // 317


def test_projector_files(tmp_path, fake_archive) -> None:
    from rsnet.data import build_datasets

    data = build_datasets("ucmerced_mini", fake_archive("ucmerced_mini", per_class=2, size=32), 0.5, 0, 32,
                          check_counts=False)
    net = build_model("baseline", "test_resnet", num_classes=len(data.class_names))
    indices = pick_embedding_images(data.test.labels, 40)
    features, names, images = dataset_embedding(net, data.test, indices, batch_size=8)
    n = len(indices)
    with TensorBoardLogger(tmp_path) as logger:
        logger.embeddings(features, names, images, step=4)
    with TensorBoardLogger(tmp_path) as resumed:  # a resumed run keeps the earlier entries
        resumed.embeddings(features[:3], names[:3], None, step=8)
    config = (tmp_path / "projector_config.pbtxt").read_text()
    assert 'tensor_name: "main:00004"' in config and 'tensor_name: "main:00008"' in config
    folder = tmp_path / "00004" / "main"
    rows = (folder / "tensors.tsv").read_text().splitlines()
    assert len(rows) == n and all(len(row.split("\t")) == 96 for row in rows)
    classes = [data.class_names[data.test.labels[i]] for i in indices]
    assert (folder / "metadata.tsv").read_text().splitlines() == classes
    side = math.ceil(math.sqrt(n)) * thumbnail_side(n)
    assert Image.open(folder / "sprite.png").size == (side, side)
    assert len((tmp_path / "00008" / "main" / "tensors.tsv").read_text().splitlines()) == 3


def test_disabled_logger_writes_no_extras(tmp_path) -> None:
    logger = TensorBoardLogger(tmp_path / "tb", enabled=False)
    logger.hparams({"a": 1}, {"accuracy": 1.0})
    logger.embeddings(torch.zeros(2, 4), ["a", "b"], None, step=0)
    logger.close()
    assert not (tmp_path / "tb").exists()


def test_embedding_thumbnails_keep_colours() -> None:
    from rsnet.viz.embedding import thumbnails

    red = np.zeros((40, 40, 3), np.uint8)
    red[..., 0] = 255
    small = thumbnails([red], side=8)
    assert small.shape == (1, 3, 8, 8) and float(small[0, 0].min()) == 1.0 and float(small[0, 2].max()) == 0.0


def test_projector_metadata_keeps_one_line_per_point_whatever_the_class_names(tmp_path) -> None:
    """A tab or a newline in a class name (a folder name) split metadata.tsv into more lines than points, and a name
    that is not UTF-8 stopped the run: each name is now one line, its control characters and bytes escaped."""
    names = ["tab\there", "new\nline", "caf\udce9", "plain"]
    with TensorBoardLogger(tmp_path) as logger:
        logger.embeddings(torch.zeros(4, 3), names, None, step=0)
    lines = (tmp_path / "00000" / "main" / "metadata.tsv").read_text(encoding="utf-8").splitlines()
    assert lines == ["tab\\there", "new\\nline", "caf\\udce9", "plain"]


@pytest.mark.parametrize("value", ["svg", "PNG", "eps"])
def test_a_bad_log_figure_format_is_one_line_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_training_config(training_config("backbone=test_resnet", f"log.figure_format={value}"))
    message = str(refused.value)
    assert message == f"log.figure_format={value!r}: use png (the default), pdf (vector, for a paper) or both"
    for fine in ("png", "pdf", "both"):
        check_training_config(training_config("backbone=test_resnet", f"log.figure_format={fine}"))
