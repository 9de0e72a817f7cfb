"""The rule that fits ESD-MBENet's FAM dilations and MGML-FENet's pooling grids to the feature maps of the training
image size (rsnet.models.geometry): map sides, output shapes and receptive fields at 32, 64, 128 and 224 px."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rsnet.models import build_model, options_for_size
from rsnet.models.geometry import feature_map_sides, fit_dilation, fit_grids

SIZES = (32, 64, 128, 224)
CLASSES = 5
# S1..S4 sides of timm's ResNets (and DenseNet) and of rsnet's VGG16 levels (whose last pooling is the head's)
RESNET_SIDES = {32: [8, 4, 2, 1], 64: [16, 8, 4, 2], 128: [32, 16, 8, 4], 224: [56, 28, 14, 7]}
VGG_SIDES = {32: [16, 8, 4, 2], 64: [32, 16, 8, 4], 128: [64, 32, 16, 8], 224: [112, 56, 28, 14]}


@pytest.mark.parametrize(("backbone", "sides"), [("test_resnet", RESNET_SIDES), ("resnet50", RESNET_SIDES),
                                                 ("vgg16", VGG_SIDES)])
def test_feature_map_sides_are_those_of_a_real_forward(backbone: str, sides: dict[int, list[int]]) -> None:
    """The meta-device forward gives the sides S1..S4 really have (checked against a forward with weights for
    the tiny backbone)."""
    assert {size: list(feature_map_sides(backbone, size)) for size in SIZES} == sides
    if backbone == "test_resnet":
        model = build_model("baseline", backbone, CLASSES).eval()
        for size in SIZES:
            with torch.no_grad():
                levels = model.backbone.trunk(torch.zeros(1, 3, size, size))
                maps = [*levels, model.backbone.stage4(levels[-1])]
            assert [m.shape[-1] for m in maps] == sides[size]


def test_the_rule_keeps_what_the_map_holds_and_shrinks_the_rest() -> None:
    assert [fit_dilation(3, side) for side in (1, 2, 3, 4, 5, 6, 7, 14)] == [1, 1, 1, 1, 2, 2, 3, 3]
    assert fit_dilation(2, 8) == 2 and fit_dilation(1, 2) == 1
    assert fit_grids([1, 2, 4], 7) == [1, 2, 4]
    assert fit_grids([1, 2, 4], 2) == [1, 2]  # 4 -> 2, which is there already: kept once
    assert fit_grids([4, 2, 1], 1) == [1]
    assert fit_grids([1, 3], 2) == [1, 2]


def taps_on_the_map(conv: nn.Conv2d, side: int) -> int:
    """How many S3 pixels the output pixel in the middle of S4 reads through ``conv`` (its receptive field on a
    map of ``side`` x ``side``), from the gradient."""
    x = torch.zeros(1, conv.in_channels, side, side, requires_grad=True)
    out = conv(x)
    middle = out.shape[-1] // 2
    out[0, :, middle, middle].sum().backward()
    return int((x.grad[0].abs().sum(0) > 0).sum())


@pytest.mark.parametrize("size", SIZES)
def test_esd_mbenet_fam_reads_a_full_kernel_of_s3_at_every_size(size: int) -> None:
    """With the rule, each FAM's dilated 3x3 conv reads 9 distinct S3 pixels where S3 is at least 3 wide (64, 128,
    224 px) and the whole 2x2 map at 32 px, and its output has S4's shape. Dilations 2 and 3 stay at 128 and 224 px;
    at 64 px (S3 4x4) they were reading 1 to 4 pixels, the rest padding."""
    torch.manual_seed(0)
    model = build_model("esd_mbenet", "test_resnet", CLASSES, image_size=size).eval()
    s3_side, s4_side = RESNET_SIDES[size][2:]
    assert model.fitted_dilations == ([2, 3] if size >= 128 else [1, 1])
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        s3 = model.backbone.trunk(x)[-1]
        for fam in model.aux:
            assert fam(s3, (s4_side, s4_side)).shape[-2:] == (s4_side, s4_side)
            assert fam.body[0](s3).shape[-2:] == (s3_side, s3_side)
    for fam, dilation in zip(model.aux, model.fitted_dilations):
        conv = fam.body[1][0]
        assert conv.dilation == (dilation, dilation)
        assert F.conv2d(torch.zeros(1, conv.in_channels, s3_side, s3_side), conv.weight, stride=conv.stride,
                        padding=conv.padding, dilation=conv.dilation).shape[-1] == s4_side
        assert taps_on_the_map(conv, s3_side) == (9 if s3_side >= 3 else s3_side ** 2)
    assert model(x).logits["ensemble"].shape == (2, CLASSES)
    if size == 64:  # without the rule: dilation 2 reads 4 pixels of the 4x4 map, dilation 3 only 1
        unfitted = build_model("esd_mbenet", "test_resnet", CLASSES)
        assert [taps_on_the_map(fam.body[1][0], s3_side) for fam in unfitted.aux] == [4, 1]


def cell_supports(grid: int, side: int) -> list[frozenset[int]]:
    """The map pixels each of adaptive pooling's grid x grid cells averages (its receptive field), from the
    gradient."""
    supports = []
    for cell in range(grid * grid):
        x = torch.zeros(1, 1, side, side, requires_grad=True)
        F.adaptive_avg_pool2d(x, grid).flatten()[cell].backward()
        supports.append(frozenset(torch.nonzero(x.grad.flatten()).flatten().tolist()))
    return supports


@pytest.mark.parametrize("size", SIZES)
def test_mgml_fenet_every_pooling_cell_has_pixels_of_its_own_at_every_size(size: int) -> None:
    """With the rule, every grid of every level has at most as many cells per row as its map has pixels, so no two
    cells pool the same pixels (the 4x4 grid over a 2x2 S4 at 64 px repeated each pixel 4 times); the heads are
    named by the grids they use, and every head gives (batch, classes)."""
    model = build_model("mgml_fenet", "test_resnet", CLASSES, image_size=size).eval()
    sides = dict(zip((1, 2, 3, 4), RESNET_SIDES[size]))
    expected = {level: [g for g in (1, 2, 4) if g <= sides[level]] or [1] for level in (2, 3, 4)}
    assert model.level_grids == expected
    for level, grids in model.level_grids.items():
        for grid in grids:
            supports = cell_supports(grid, sides[level])
            assert all(supports) and len(set(supports)) == grid * grid
    assert [g.grids for g in model.ffb.generators] == list(expected.values())
    heads = {f"fem_s{level}_g{grid}" for level, grids in expected.items() for grid in grids}
    logits = model(torch.randn(2, 3, size, size)).logits
    assert heads <= set(logits) and all(z.shape == (2, CLASSES) for z in logits.values())
    if size == 64:
        assert "fem_s4_g4" not in logits and len(set(cell_supports(4, sides[4]))) == 4  # what the rule removes


def test_at_128_and_224_px_the_rule_changes_nothing() -> None:
    """The papers' geometry (dilations 2, 3; grids 1, 2, 4 on S2..S4) is what the rule gives where maps are 8 px or
    more: the same parameters, and the same outputs from the same initial weights."""
    for arch in ("esd_mbenet", "mgml_fenet"):
        for size in (128, 224):
            torch.manual_seed(0)
            fitted = build_model(arch, "test_resnet", CLASSES, image_size=size).eval()
            torch.manual_seed(0)
            as_set = build_model(arch, "test_resnet", CLASSES).eval()
            assert {k: v.shape for k, v in fitted.state_dict().items()} == \
                   {k: v.shape for k, v in as_set.state_dict().items()}
            x = torch.randn(2, 3, size, size)
            with torch.no_grad():
                assert torch.equal(fitted(x).logits["ensemble"], as_set(x).logits["ensemble"])


@pytest.mark.parametrize("arch", ["esd_mbenet", "mgml_fenet"])
def test_a_checkpoints_model_config_rebuilds_the_fitted_model(arch: str) -> None:
    """model_config records the size the geometry was fitted to, so evaluate and export rebuild the same model;
    image_size=auto is resolved from the training size, and is refused where no size is at hand."""
    options = options_for_size({"image_size": "auto"}, 64)
    assert options == {"image_size": 64}
    model = build_model(arch, "test_resnet", CLASSES, **options)
    rebuilt = build_model(**model.model_config)
    assert model.model_config["image_size"] == 64
    rebuilt.load_state_dict(model.state_dict())  # strict: same parameters and shapes
    with pytest.raises(ValueError, match="image_size=auto stands for dataset.image_size"):
        build_model(arch, "test_resnet", CLASSES, image_size="auto")
    with pytest.raises(ValueError, match="image_size must be auto, null or a positive int"):
        build_model(arch, "test_resnet", CLASSES, image_size="large")
