"""CAM / Grad-CAM against hand computations, overlays, and TensorBoard summaries read back from disk."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import PlainClassifier, StandInModel

from rsnet.viz.attention import captioned_attention, class_activation_maps, grad_cam, min_max, overlay
from rsnet.viz.figures import (COLOUR_MAP, AttentionTile, attention_figure, attention_pages, confusion_figure,
                               render_confusion_matrix)
from rsnet.viz.tensorboard import TensorBoardLogger, pick_attention_images


@pytest.fixture
def model() -> StandInModel:
    torch.manual_seed(0)
    net = StandInModel(num_classes=5, width=6)
    # a forward in train mode so BatchNorm statistics are not the identity
    net(torch.randn(8, 3, 32, 32))
    return net


def test_cam_matches_hand_computation(model: StandInModel) -> None:
    images = torch.randn(3, 3, 32, 32)
    model.train()
    cams = class_activation_maps(model, images)
    assert model.training and model.trunk[1].training  # previous mode restored
    assert set(cams) == {"main", "aux1"}
    model.eval()
    with torch.no_grad():
        out = model(images)
    features, cls = out.features["main"], out.logits["main"].argmax(1)
    for b in range(3):
        cam = torch.relu(sum(model.fc_main.weight[cls[b], c] * features[b, c] for c in range(features.shape[1])))
        cam = F.interpolate(cam[None, None], size=(32, 32), mode="bilinear", align_corners=False)[0, 0].clamp_min(0)
        cam = cam / cam.max()
        torch.testing.assert_close(cams["main"][b], cam, atol=1e-5, rtol=1e-4)
    assert cams["aux1"].shape == (3, 32, 32)
    assert float(cams["aux1"].min()) >= 0 and float(cams["aux1"].max()) <= 1 + 1e-6


def test_cam_given_class(model: StandInModel) -> None:
    images = torch.randn(2, 3, 32, 32)
    a = class_activation_maps(model, images, class_idx=1)
    b = class_activation_maps(model, images, class_idx=torch.tensor([1, 1]))
    torch.testing.assert_close(a["main"], b["main"])


def test_gradcam_of_gap_linear_head_equals_cam(model: StandInModel) -> None:
    # For logits = W GAP(F) + b: d z_c / d F[k,i,j] = W[c,k] / hw, so Grad-CAM = CAM / hw -> equal once normalised.
    images = torch.randn(4, 3, 32, 32)
    model.train()
    for p in model.parameters():
        p.requires_grad_(False)  # frozen model: features must still be in the graph
    gc = grad_cam(model, images, head="main")
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    cams = class_activation_maps(model, images)
    torch.testing.assert_close(gc, cams["main"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grad_cam(model, images, head="aux1"), cams["aux1"], atol=1e-5, rtol=1e-4)
    # the identity holds at a given class too
    other = grad_cam(model, images, class_idx=0)
    cam0 = class_activation_maps(model, images, class_idx=0)["main"]
    torch.testing.assert_close(other, cam0, atol=1e-5, rtol=1e-4)


def test_gradcam_rejects_plain_classifier() -> None:
    with pytest.raises(TypeError, match="MultiBranchOutput"):
        grad_cam(PlainClassifier(), torch.randn(1, 3, 16, 16))


def test_overlay_shapes_and_dtype() -> None:
    image = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    out = overlay(image, np.linspace(0, 1, 5 * 6, dtype=np.float32).reshape(5, 6))
    assert out.shape == (20, 30, 3) and out.dtype == np.uint8
    out = overlay(image, torch.zeros(20, 30), alpha=0.0)
    np.testing.assert_array_equal(out, image)
    hot = overlay(np.zeros((4, 4, 3), np.uint8), np.ones((4, 4)), alpha=1.0)
    assert hot[0, 0].tolist() == [252, 255, 164]  # inferno at 1.0 is pale yellow (RGB order)
    with pytest.raises(ValueError, match=re.escape("overlay expects an (H, W, 3) image, got shape (20, 30)")):
        overlay(image[..., 0], np.zeros((20, 30)))


def test_overlay_colours_are_the_colour_bar_s_and_grow_lighter_with_attention() -> None:
    from matplotlib import colormaps

    ramp = np.linspace(0.0, 1.0, 256, dtype=np.float32)[None]
    colours = overlay(np.zeros((1, 256, 3), np.uint8), ramp, alpha=1.0)[0].astype(int)
    expected = np.round(255 * colormaps[COLOUR_MAP](np.arange(256))[:, :3]).astype(int)
    assert np.abs(colours - expected).max() <= 1  # the same map as the figure's colour bar
    lightness = colours @ np.array([0.2126, 0.7152, 0.0722])
    assert (np.diff(lightness) >= -0.5).all()  # perceptual: lighter with attention, unlike jet (dark red at 1.0)


def test_min_max_stretches_each_map_to_the_full_range() -> None:
    cam = np.array([[0.6, 0.7], [0.9, 1.0]], np.float32)
    np.testing.assert_allclose(min_max(cam), [[0.0, 1 / 4], [3 / 4, 1.0]], atol=1e-6)
    np.testing.assert_array_equal(min_max(np.full((3, 3), 0.8, np.float32)), np.zeros((3, 3)))


def test_near_uniform_maps_fill_the_colour_map() -> None:
    """Each head's CAM spans about 0.97..1 of its maximum here; each overlay still runs from the colour map's dark
    end to its light end."""
    torch.manual_seed(0)
    net = StandInModel(num_classes=3, width=6)
    with torch.no_grad():
        for fc, block in ((net.fc_main, net.main_block), (net.fc_aux1, net.aux_block)):
            fc.weight.abs_()
            block[0].bias.fill_(1.0)
    inputs = torch.rand(2, 3, 32, 32)
    assert min(float(cam.min()) for cam in class_activation_maps(net, inputs).values()) > 0.9
    tiles = captioned_attention(net, np.zeros((2, 32, 32, 3), np.uint8), inputs, ["a", "b", "c"])
    for tile in (tile for head_tiles in tiles.values() for tile in head_tiles):
        lightness = tile.overlaid.astype(float) @ np.array([0.2126, 0.7152, 0.0722])
        assert lightness.min() < 5 and lightness.max() > 110  # half of inferno's black and of its pale yellow


def test_an_attention_page_is_legible_and_says_the_maps_are_normalised() -> None:
    from matplotlib.collections import QuadMesh

    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    tile = AttentionTile(image, image, None, "forest", 0.9)
    figure = attention_figure([tile], "forest80.jpg: CAM of head main")
    bar = figure.axes[-1]
    assert [mesh.get_cmap().name for mesh in bar.collections if isinstance(mesh, QuadMesh)] == [COLOUR_MAP]
    assert COLOUR_MAP != "jet"
    assert "min–max normalised" in bar.get_ylabel()
    assert [label.get_text() for label in bar.get_yticklabels()] == ["min", "max"]
    pictures = [axes.get_window_extent() for axes in figure.axes[:-1]]
    assert [(round(box.width), round(box.height)) for box in pictures] == [(256, 256)] * 2  # a 64 px image enlarged
    page = attention_pages([tile], "forest80.jpg: CAM of head main")[0]
    assert max(page.shape[:2]) >= 512 and page.shape[1] > 2 * 256


def test_pick_attention_images() -> None:
    labels = [2, 0, 0, 1, 2, 1, 3]
    assert pick_attention_images(labels) == [1, 3, 0, 6]
    assert pick_attention_images(labels, max_images=2) == [1, 3]
    assert pick_attention_images(np.arange(40) % 20) == list(range(20))  # every class by default
    assert pick_attention_images(np.arange(40) % 20, max_images=16) == list(range(16))


def test_render_confusion_matrix_stays_legible_at_45_classes() -> None:
    """Full class names on both axes (the columns' upright), axis titles, a colour bar and every non-zero cell's
    share of its row, at 45 classes too; the image grows with the classes."""
    small = render_confusion_matrix([[3, 1], [0, 4]], ["forest", "river"])
    assert small.dtype == np.uint8 and small.ndim == 3 and small.shape[2] == 3
    assert (small < 128).any() and (small == 255).any()  # ink on a white page
    names = [f"class_with_a_long_name_{i:02d}" for i in range(45)]
    cm = np.eye(45, dtype=int) * 5
    cm[3, 7] = 5
    figure = confusion_figure(cm, names)
    matrix, bar = figure.axes
    assert [label.get_text() for label in matrix.get_xticklabels()] == names
    assert [label.get_text() for label in matrix.get_yticklabels()] == names
    assert {label.get_rotation() for label in matrix.get_xticklabels()} == {90.0}
    assert (matrix.get_xlabel(), matrix.get_ylabel()) == ("predicted class", "true class")
    assert "share of the true class" in bar.get_ylabel()
    assert sorted(text.get_text() for text in matrix.texts) == ["100"] * 44 + ["50", "50"]
    big = render_confusion_matrix(cm, names)
    assert big.shape[0] > 45 * 20 and big.shape[1] > big.shape[0]  # >= 20 px a cell; the colour bar at the right


def test_tensorboard_logger_writes_readable_summaries(tmp_path, model: StandInModel) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    images = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    logger = TensorBoardLogger(tmp_path / "tb")
    logger.scalars({"train/loss": 1.5, "test/oa_main": torch.tensor(80.0), "skip": {"a": 1}, "none": None}, step=2)
    logger.confusion_matrix([[3, 1], [0, 4]], ["a", "b"], step=2)
    logger.attention_maps(model, images, mean=[0.5] * 3, std=[0.25] * 3, step=2)
    logger.close()
    logger.close()  # idempotent

    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert set(tags["scalars"]) == {"train/loss", "test/oa_main"}
    assert acc.Scalars("train/loss")[0].value == pytest.approx(1.5)
    assert {"test/confusion_matrix", "attention/cam_main", "attention/cam_aux1"} == set(tags["images"])
    event = acc.Images("attention/cam_main")[0]
    assert event.step == 2
    # 3 tiles in a row, each original | overlay enlarged to 256 px with a caption below; a title; a colour bar
    assert event.width > 3 * 2 * 256 + 90 and 256 + 36 + 30 < event.height < 2 * 256 + 36  # one row


def test_disabled_logger_writes_nothing(tmp_path, model: StandInModel) -> None:
    logger = TensorBoardLogger(tmp_path / "tb", enabled=False)
    logger.scalars({"a": 1.0}, 0)
    logger.attention_maps(model, np.zeros((1, 8, 8, 3), np.uint8), [0] * 3, [1] * 3, 0)
    logger.close()
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize("arch", ["esd_mbenet", "mgml_fenet", "baseline"])
def test_real_models_cam_gradcam_and_logger(arch: str, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rsnet.models import build_model

    torch.manual_seed(0)
    net = build_model(arch, "test_resnet", num_classes=3)
    images = torch.randn(2, 3, 64, 64)
    cams = class_activation_maps(net, images)
    assert "main" in cams and set(cams) == set(net.cam_classifiers())
    for cam in cams.values():
        assert cam.shape == (2, 64, 64) and float(cam.max()) <= 1 + 1e-6
    # every CAM head is GAP -> Linear of its feature map, so Grad-CAM equals CAM for each of them
    for head in cams:
        torch.testing.assert_close(grad_cam(net, images, head=head), cams[head], atol=1e-4, rtol=1e-3)
    logger = TensorBoardLogger(tmp_path)
    logger.attention_maps(net, np.zeros((2, 64, 64, 3), np.uint8) + 90, [0.5] * 3, [0.2] * 3, step=1)
    logger.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    assert {f"attention/cam_{h}" for h in cams} == set(acc.Tags()["images"])  # Grad-CAM == CAM: no own panel


def test_a_tile_says_the_true_class_and_whether_the_prediction_is_right() -> None:
    image = np.full((32, 32, 3), 128, np.uint8)

    def ink(tile: AttentionTile) -> tuple[bool, bool]:
        page = attention_pages([tile], "forest80.jpg: CAM of head main")[0]
        caption = page[:, :2 * 256 + 20].astype(int)  # the pair and its caption, left of the colour bar
        green = ((caption[..., 1] > 90) & (caption[..., 0] < 80) & (caption[..., 2] < 80)).any()
        red = ((caption[..., 0] > 150) & (caption[..., 1] < 80) & (caption[..., 2] < 80)).any()
        return bool(green), bool(red)

    assert ink(AttentionTile(image, image, "forest", "forest", 0.9)) == (True, False)
    assert ink(AttentionTile(image, image, "forest", "river", 0.6)) == (False, True)
    assert not any(ink(AttentionTile(image, image, None, "river", 0.6)))  # no true class: plain ink


def test_attention_pages_hold_16_tiles_each_at_the_images_resolution() -> None:
    rng = np.random.default_rng(0)
    tiles = [AttentionTile(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8), np.zeros((200, 200, 3), np.uint8),
                           "a_class_with_a_very_long_name_indeed", "b", 0.5) for _ in range(21)]
    first, second = attention_pages(tiles, "CAM of head main at its predicted class, epoch 4")
    assert first.dtype == np.uint8 and first.shape[1] == second.shape[1] > 4 * 2 * 200  # 200 px images: not shrunk
    assert first.shape[0] > 4 * 200 > second.shape[0] > 2 * 200  # 4 rows, then 2 (5 tiles)
    assert len({tuple(pixel) for pixel in first[::7, ::7].reshape(-1, 3)}) > 1000  # the pictures are there
