"""Training/eval transforms: output contract, randomness, our own transforms (crop draw, dihedral group,
colour jitter) and the rule that they use only albumentations' public custom-transform API."""

from __future__ import annotations

import ast
import itertools
import random
from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import pytest
import torch

from rsnet.data import build_datasets
from rsnet.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ColorJitterAffine,
    Dihedral,
    RandomResizedCrop,
    augmentation_options,
    crop_box,
    dihedral_numpy,
    eval_transform,
    train_transform,
)


def _image(h=40, w=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_train_transform_output_contract_and_randomness(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 32)
    ds = bundle.train
    x, y = ds.get_batch(list(range(8)))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous()
    assert torch.isfinite(x).all()
    # normalised uint8 values: ((0..255)/255 - mean) / std, per channel
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert (x >= -mean / std - 1e-5).all() and (x <= (1 - mean) / std + 1e-5).all()
    u8 = x * std * 255 + mean * 255  # back to the pixel grid
    assert torch.allclose(u8, u8.round(), atol=1e-3)
    # per-item path: same contract
    t, label = ds[0]
    assert t.shape == (3, 32, 32) and t.dtype == torch.float32 and label == int(ds.labels[0])
    # random across calls, reproducible under a seed
    draws = [ds.get_batch([0, 1, 2])[0] for _ in range(4)]
    assert all(not torch.equal(a, b) for a, b in itertools.combinations(draws, 2))
    ds.set_seed(7)
    a = ds.get_batch([0, 1, 2])[0]
    ds.set_seed(7)
    assert torch.equal(a, ds.get_batch([0, 1, 2])[0])


def _normalised(image: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(image).permute(2, 0, 1).float() / 255 - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) \
        / torch.tensor(IMAGENET_STD).view(3, 1, 1)


def _is_dihedral_view(out: torch.Tensor, image: np.ndarray) -> bool:
    """``out`` is one of the 8 flips/rotations of ``image``, normalised (nothing cropped, no colour change)."""
    return any(torch.allclose(out, _normalised(dihedral_numpy(image, g)), atol=1e-5) for g in _D4)


def test_train_transform_knobs():
    img = _image(32, 32)
    out = train_transform(16, scale=(0.3, 0.6), color_jitter=0.4)(image=img)["image"]
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32
    square = _image(16, 16)
    plain = train_transform(16, scale=None, color_jitter=0.0)
    assert all(_is_dihedral_view(plain(image=square)["image"], square) for _ in range(20))
    jittered = train_transform(16, scale=None, color_jitter=0.4)
    changed = sum(not _is_dihedral_view(jittered(image=square)["image"], square) for _ in range(40))
    assert 0 < changed < 40  # colours jittered on about half the images
    cropped = train_transform(16, scale=(0.3, 0.6), color_jitter=0.0)
    assert not any(_is_dihedral_view(cropped(image=square)["image"], square) for _ in range(20))


def test_augment_settings_crop_only_from_128_px_on_auto():
    assert augmentation_options({"crop_scale": "auto", "color_jitter": 0.2}, 64) == {"scale": None, "color_jitter": 0.2}
    assert augmentation_options(None, 224) == {"scale": (0.5, 1.0), "color_jitter": 0.2}
    assert augmentation_options({"crop_scale": [0.3, 0.9], "color_jitter": 0}, 64)["scale"] == (0.3, 0.9)
    assert augmentation_options({"crop_scale": None}, 224)["scale"] is None
    image = _image(16, 16)
    uncropped = train_transform(16, **augmentation_options({"crop_scale": "auto", "color_jitter": 0.0}, 16))
    assert _is_dihedral_view(uncropped(image=image)["image"], image)  # a flip/rotation only, nothing cropped


@pytest.mark.parametrize("augment, message", [
    ({"crop_scale": [0.5]}, "augment.crop_scale must be auto, null or \\[min, max\\]"),
    ({"crop_scale": [0.9, 0.5]}, "augment.crop_scale must satisfy 0 < min <= max <= 1"),
    ({"crop_scale": "big"}, "augment.crop_scale must be auto"),
    ({"color_jitter": 1.5}, "augment.color_jitter must be a number in \\[0, 1\\)"),
    ({"color_jitter": "x"}, "augment.color_jitter"),
])
def test_bad_augment_settings_name_the_setting(augment, message):
    with pytest.raises(ValueError, match=message):
        augmentation_options(augment, 64)


def test_get_batch_matches_per_item_normalisation(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 24)
    test = bundle.test
    idx = [0, 3, 5, 9]
    xb, _ = test.get_batch(idx)
    ref = (torch.from_numpy(np.stack([test.raw(i) for i in idx])).permute(0, 3, 1, 2).float()
           .sub_(torch.tensor(bundle.mean).view(1, 3, 1, 1) * 255).div_(torch.tensor(bundle.std).view(1, 3, 1, 1) * 255))
    assert torch.equal(xb, ref)  # bit for bit the torch formula used before
    for k, i in enumerate(idx):
        assert torch.allclose(xb[k], test[i][0], atol=1e-5)
    # the eval transform alone: an area resize (a no-op at the working size), normalise, to tensor
    image = _image(40, 40)
    assert torch.allclose(eval_transform(24)(image=test.raw(0))["image"], _normalised(test.raw(0)), atol=1e-5)
    resized = cv2.resize(image, (24, 24), interpolation=cv2.INTER_AREA)
    assert torch.allclose(eval_transform(24)(image=image)["image"], _normalised(resized), atol=1e-5)


_D4 = ["e", "r90", "r180", "r270", "v", "hvt", "h", "t"]


def _d4_images():
    rng = np.random.default_rng(3)
    imgs = {f"u8-{h}x{w}x{c}": np.ascontiguousarray(_image(h, w)[..., :c])
            for h, w, c in [(17, 17, 3), (12, 20, 3), (9, 14, 1)]}
    imgs["f32-11x7x3"] = rng.random((11, 7, 3), dtype=np.float32)
    imgs["u8-2d-6x9"] = rng.integers(0, 256, (6, 9), dtype=np.uint8)
    return imgs


@pytest.mark.parametrize("name", list(_d4_images()))
def test_dihedral_cv2_numpy_and_public_d4_agree(name):
    img = _d4_images()[name]
    h, w = img.shape[:2]
    seen = set()
    for g in _D4:
        ours = Dihedral(p=1.0).apply(img, group_element=g)  # cv2 path where it applies
        fallback = dihedral_numpy(img, g)
        ref = A.D4(p=1.0).apply(img, group_element=g)  # public transform, public apply
        assert ours.shape == fallback.shape == ref.shape, g
        assert ours.dtype == img.dtype and fallback.dtype == img.dtype, g
        assert np.array_equal(ours, ref), g
        assert np.array_equal(fallback, ref), g
        assert fallback.flags.c_contiguous and ours.flags.c_contiguous, g
        expect_shape = img.shape if g in ("e", "r180", "v", "h") else (w, h) + img.shape[2:]
        assert ours.shape == expect_shape, g
        seen.add(ours.tobytes() + bytes(str(ours.shape), "ascii"))
    assert len(seen) == 8  # the 8 elements are 8 different maps (random images have no symmetry)
    with pytest.raises(ValueError):
        dihedral_numpy(img, "x")


def test_dihedral_draw_covers_the_group_and_is_seeded():
    t = Dihedral(p=1.0)
    t.set_random_seed(0)
    draws = [t.get_params()["group_element"] for _ in range(400)]
    assert set(draws) == set(_D4)
    t.set_random_seed(0)
    assert [t.get_params()["group_element"] for _ in range(400)] == draws


def _check_box(box, height, width):
    top, left, h, w = box
    assert all(isinstance(v, int) for v in box)
    assert 0 < h <= height and 0 < w <= width
    assert 0 <= top <= height - h and 0 <= left <= width - w


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (3 / 4, 4 / 3)),
                                          ((0.2, 0.3), (0.5, 2.0)), ((0.5, 0.8), (1.0, 1.0)),
                                          ((0.2, 0.4), (1.2, 2.0))])
def test_crop_box_within_scale_and_ratio(scale, ratio):
    height, width = 50, 40
    area = height * width
    fallbacks = 0
    boxes = set()
    for seed in range(500):
        box = crop_box(height, width, scale, ratio, random.Random(seed))
        _check_box(box, height, width)
        boxes.add(box)
        top, left, h, w = box
        if box == crop_box(height, width, (5.0, 6.0), ratio, random.Random(0)):  # the central fallback
            fallbacks += 1
            continue
        # w, h are round(sqrt(area·r)), round(sqrt(area/r)): the unrounded values lie within 0.5
        assert (w - 0.5) * (h - 0.5) <= scale[1] * area + 1e-9
        assert (w + 0.5) * (h + 0.5) >= scale[0] * area - 1e-9
        assert (w - 0.5) / (h + 0.5) <= ratio[1] + 1e-9
        assert (w + 0.5) / (h - 0.5) >= ratio[0] - 1e-9
    assert fallbacks < 50 and len(boxes) > 20  # random, and mostly not the fallback
    # the same seed, the same box
    assert crop_box(height, width, scale, ratio, random.Random(11)) == crop_box(height, width, scale, ratio,
                                                                                  random.Random(11))


def test_crop_box_fallback_is_central():
    never = (2.0, 3.0)  # target area larger than the image: no attempt can fit
    for seed in range(20):
        # aspect ratio of the image (40/50 = 0.8) inside the range: the whole image
        assert crop_box(50, 40, never, (3 / 4, 4 / 3), random.Random(seed)) == (0, 0, 50, 40)
        # too tall for ratio >= 1: full width, height clamped to width / 1.0, centred vertically
        assert crop_box(50, 40, never, (1.0, 2.0), random.Random(seed)) == (5, 0, 40, 40)
        # too wide for ratio <= 1: full height, width height * 1.0, centred horizontally
        assert crop_box(40, 51, never, (0.5, 1.0), random.Random(seed)) == (0, 5, 40, 40)
        # too tall for ratio >= 2: height round(30 / 2) = 15, top (40 - 15) // 2
        assert crop_box(40, 30, never, (2.0, 3.0), random.Random(seed)) == (12, 0, 15, 30)


@pytest.mark.parametrize("shape, dtype", [((50, 40, 3), np.uint8), ((50, 40, 3), np.float32), ((50, 40), np.uint8),
                                          ((50, 40, 1), np.uint8), ((50, 40, 6), np.uint8)])
def test_resized_crop_apply_is_cv2_resize_of_the_box(shape, dtype):
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, shape).astype(dtype)
    if dtype == np.float32:
        img /= 255.0
    t = RandomResizedCrop(size=(16, 24), scale=(0.3, 0.9), interpolation=cv2.INTER_LINEAR)
    t.set_random_seed(1)
    boxes = set()
    for _ in range(10):
        params = t.get_params()
        top, left, h, w = t.crop_box(img.shape, params["crop_seed"])
        assert (top, left, h, w) == crop_box(50, 40, t.scale, t.ratio, random.Random(params["crop_seed"]))
        boxes.add((top, left, h, w))
        out = t.apply(img, **params)
        assert out.shape == (16, 24) + shape[2:] and out.dtype == img.dtype
        patch = np.ascontiguousarray(img[top:top + h, left:left + w])
        if img.ndim == 3 and img.shape[2] > 4:
            ref = np.concatenate([cv2.resize(np.ascontiguousarray(patch[..., c:c + 3]), (24, 16),
                                             interpolation=cv2.INTER_LINEAR) for c in (0, 3)], axis=2)
        else:
            ref = cv2.resize(patch, (24, 16), interpolation=cv2.INTER_LINEAR).reshape(out.shape)
        assert np.array_equal(out, ref)
    assert len(boxes) > 1


def test_resized_crop_reproducible_under_compose_seed():
    img = _image(50, 40)

    def run(seed, n=6):
        pipe = A.Compose([RandomResizedCrop(size=(20, 20), scale=(0.1, 1.0)), Dihedral(p=1.0)], seed=seed)
        return [pipe(image=img)["image"] for _ in range(n)]

    a, b, c = run(3), run(3), run(4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert not all(np.array_equal(a[0], x) for x in a[1:])  # random across calls
    t = RandomResizedCrop(size=(20, 20))
    t.set_random_seed(9)
    s1 = [t.get_params()["crop_seed"] for _ in range(5)]
    t.set_random_seed(9)
    assert [t.get_params()["crop_seed"] for _ in range(5)] == s1 and len(set(s1)) == 5
    with pytest.raises(ValueError):
        RandomResizedCrop(size=(20, 20), scale=(0.9, 0.1))


_RSNET = Path(__file__).resolve().parents[1] / "rsnet"


_ALBU_DIR = Path(A.__file__).parent
_ALLOWED_ALBU = ("albumentations.pytorch",)


def _is_albu_submodule(name: str) -> bool:
    first = name.split(".")[1]
    return (_ALBU_DIR / first).is_dir() or (_ALBU_DIR / f"{first}.py").exists()


def _internal_albumentations_imports(path: Path) -> list[str]:
    """albumentations submodules other than ``albumentations.pytorch`` that ``path`` imports, via
    ``import albumentations.x``, ``from albumentations.x import ...`` or ``from albumentations import x``
    (``from albumentations import Compose`` imports a public name and is fine)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "albumentations":
                names += [f"albumentations.{alias.name}" for alias in node.names
                          if _is_albu_submodule(f"albumentations.{alias.name}")]
        else:
            continue
        found += [n for n in names if n.startswith("albumentations.")
                  and not any(n == ok or n.startswith(ok + ".") for ok in _ALLOWED_ALBU)]
    return found


def test_rsnet_imports_only_public_albumentations_modules():
    files = sorted(_RSNET.rglob("*.py"))
    assert any(f.name == "transforms.py" for f in files)
    bad = {str(f.relative_to(_RSNET.parent)): mods for f in files
           if (mods := _internal_albumentations_imports(f))}
    assert not bad, ("rsnet imports albumentations internals (only `albumentations` and "
                     f"`albumentations.pytorch` are allowed): {bad}")


def test_import_scanner_flags_internal_modules(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import albumentations as A\nfrom albumentations import Compose\n"
                 "from albumentations.pytorch import ToTensorV2\nimport albumentations.pytorch.transforms\n"
                 "from albumentations.augmentations.geometric import functional\n"
                 "import albumentations.core.composition\nfrom albumentations import core\n"
                 "def f():\n    from albumentations.augmentations import functional as F\n")
    assert sorted(_internal_albumentations_imports(f)) == sorted([
        "albumentations.augmentations.geometric", "albumentations.core.composition", "albumentations.core",
        "albumentations.augmentations"])


@pytest.mark.parametrize("cls", [RandomResizedCrop, Dihedral, ColorJitterAffine])
def test_own_transforms_subclass_image_only_transform_directly(cls):
    assert cls.__mro__[1] is A.ImageOnlyTransform
    t = cls(size=(8, 8)) if cls is RandomResizedCrop else cls()
    assert type(t).__mro__[1] is A.ImageOnlyTransform
    # serialisable through the public API: every init arg name is an attribute
    for name in t.get_transform_init_args_names():
        assert hasattr(t, name), name


def _sequential_jitter(img, factors, order):
    """brightness/contrast/saturation one after another in float, no intermediate clipping."""
    w = np.array([0.299, 0.587, 0.114])
    x = img.astype(np.float64)
    for op in order:
        f = factors[op]
        if op == 0:
            x = x * f
        elif op == 1:
            x = f * x + (1 - f) * (x @ w).mean()
        else:
            x = f * x + (1 - f) * (x @ w)[..., None]
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def test_color_jitter_affine_equals_the_sequential_steps():
    rng = np.random.default_rng(1)
    for s in range(5):
        img = _image(24, 24, seed=s)
        factors = rng.uniform(0.6, 1.4, 3)
        out = ColorJitterAffine(p=1.0).apply(img, factors)
        assert out.dtype == np.uint8 and out.shape == img.shape
        for order in itertools.permutations(range(3)):  # the steps commute: any order, same result
            assert np.abs(out.astype(int) - _sequential_jitter(img, factors, order)).max() <= 1
    img = _image(24, 24)
    assert np.array_equal(ColorJitterAffine(p=1.0).apply(img, (1.0, 1.0, 1.0)), img)
    # factor draws stay in ColorJitter's ranges
    t = ColorJitterAffine(0.2, 0.3, 0.4, p=1.0)
    t.set_random_seed(0)
    for _ in range(50):
        b, c, s = t.get_params()["factors"]
        assert 0.8 <= b <= 1.2 and 0.7 <= c <= 1.3 and 0.6 <= s <= 1.4
