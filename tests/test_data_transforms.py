"""Training/eval transforms: output contract, reproducibility of the host path from (seed, epoch, index), its
OpenCV kernels (crop, dihedral group, colour jitter) and the rule that rsnet uses only albumentations' public API."""

from __future__ import annotations

import ast
import itertools
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
    HostAugment,
    augmentation_options,
    dihedral,
    eval_transform,
    jitter_image,
    resized_crop,
    train_transform,
)


def _image(h=40, w=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_train_transform_output_contract_and_randomness(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 32)
    ds = bundle.train
    assert isinstance(ds.transform, HostAugment)
    x, y = ds.get_batch(list(range(8)))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous()
    assert torch.isfinite(x).all()
    # normalised uint8 values: ((0..255)/255 - mean) / std, per channel
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert (x >= -mean / std - 1e-5).all() and (x <= (1 - mean) / std + 1e-5).all()
    u8 = x * std * 255 + mean * 255  # back to the pixel grid
    assert torch.allclose(u8, u8.round(), atol=1e-3)
    # per-item path: item i of get_batch with the dataset's seed and epoch
    t, label = ds[0]
    assert t.shape == (3, 32, 32) and t.dtype == torch.float32 and label == int(ds.labels[0])
    assert torch.equal(t, ds.get_batch([0], ds.seed, ds.epoch)[0][0])
    # random across epochs and seeds, the same for the same (seed, epoch)
    draws = [ds.get_batch([0, 1, 2], 7, epoch)[0] for epoch in range(4)]
    assert all(not torch.equal(a, b) for a, b in itertools.combinations(draws, 2))
    assert torch.equal(draws[1], ds.get_batch([0, 1, 2], 7, 1)[0])
    assert not torch.equal(draws[1], ds.get_batch([0, 1, 2], 8, 1)[0])
    ds.epoch = 1
    assert torch.equal(ds[2][0], ds.get_batch([0, 1, 2], 0, 1)[0][2])


def test_host_batches_do_not_depend_on_batching_or_worker(mini_root):
    """An item's augmentation depends on (seed, epoch, index) alone: not on the batch around it, its place in the
    batch, nor the process that draws it (DataLoader workers forked from this one)."""
    ds = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 32).train
    whole = ds.get_batch(list(range(8)), 3, 2)[0]
    pieces = torch.cat([ds.get_batch([5, 6, 7], 3, 2)[0], ds.get_batch(list(range(5)), 3, 2)[0]])
    assert torch.equal(whole, torch.cat([pieces[3:], pieces[:3]]))
    assert torch.equal(whole[[6, 1]], ds.get_batch([6, 1], 3, 2)[0])
    ds.seed, ds.epoch = 3, 2
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=False,
                                         sampler=range(8), multiprocessing_context="fork")
    assert torch.equal(torch.cat([images for images, _ in loader]), whole)


def _normalised(image: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(image).permute(2, 0, 1).float() / 255 - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) \
        / torch.tensor(IMAGENET_STD).view(3, 1, 1)


def _is_dihedral_view(out: torch.Tensor, image: np.ndarray) -> bool:
    """``out`` is one of the 8 flips/rotations of ``image``, normalised (nothing cropped, no colour change)."""
    return any(torch.allclose(out, _normalised(dihedral(image, g)), atol=1e-5) for g in _D4)


def _augmented(transform: HostAugment, image: np.ndarray, index: int) -> torch.Tensor:
    return transform.apply([image], [index], seed=0, epoch=0)[0]


def test_train_transform_knobs():
    img = _image(32, 32)
    out = _augmented(train_transform(16, scale=(0.3, 0.6), color_jitter=0.4), img, 0)
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32
    square = _image(16, 16)
    plain = train_transform(16, scale=None, color_jitter=0.0)
    assert all(_is_dihedral_view(_augmented(plain, square, i), square) for i in range(20))
    jittered = train_transform(16, scale=None, color_jitter=0.4)
    changed = sum(not _is_dihedral_view(_augmented(jittered, square, i), square) for i in range(40))
    assert 0 < changed < 40  # colours jittered on about half the images
    cropped = train_transform(16, scale=(0.3, 0.6), color_jitter=0.0)
    assert not any(_is_dihedral_view(_augmented(cropped, square, i), square) for i in range(20))


def test_augment_settings_crop_only_when_asked():
    assert augmentation_options(None) == {"scale": None, "color_jitter": 0.2}
    assert augmentation_options({"crop_scale": None, "color_jitter": 0.2}) == {"scale": None, "color_jitter": 0.2}
    assert augmentation_options({"crop_scale": [0.3, 0.9], "color_jitter": 0})["scale"] == (0.3, 0.9)
    image = _image(16, 16)
    uncropped = train_transform(16, **augmentation_options({"color_jitter": 0.0}))
    assert _is_dihedral_view(_augmented(uncropped, image, 0), image)  # a flip/rotation only, nothing cropped
    by_default = train_transform(16, color_jitter=0.0)  # the function's default is the config's: no crop
    assert all(_is_dihedral_view(_augmented(by_default, image, i), image) for i in range(8))


@pytest.mark.parametrize("augment, message", [
    ({"crop_scale": [0.5]}, "augment.crop_scale must be null \\(no crop\\) or \\[min, max\\]"),
    ({"crop_scale": [0.9, 0.5]}, "augment.crop_scale must satisfy 0 < min <= max <= 1"),
    ({"crop_scale": "auto"}, "augment.crop_scale must be null \\(no crop\\) or \\[min, max\\], got .auto."),
    ({"color_jitter": 1.5}, "augment.color_jitter must be a number in \\[0, 1\\)"),
    ({"color_jitter": "x"}, "augment.color_jitter"),
])
def test_bad_augment_settings_name_the_setting(augment, message):
    with pytest.raises(ValueError, match=message):
        augmentation_options(augment)


def test_get_batch_matches_per_item_normalisation(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 24)
    test = bundle.test
    idx = [0, 3, 5, 9]
    xb, _ = test.get_batch(idx)
    ref = (torch.from_numpy(np.stack([test.raw(i) for i in idx])).permute(0, 3, 1, 2).float()
           .sub_(torch.tensor(bundle.mean).view(1, 3, 1, 1) * 255)
           .div_(torch.tensor(bundle.std).view(1, 3, 1, 1) * 255))
    assert torch.equal(xb, ref)  # bit for bit the torch formula used before
    for k, i in enumerate(idx):
        assert torch.allclose(xb[k], test[i][0], atol=1e-5)
    # the eval transform alone: an area resize (a no-op at the working size), normalise, to tensor
    image = _image(40, 40)
    assert torch.allclose(eval_transform(24)(image=test.raw(0))["image"], _normalised(test.raw(0)), atol=1e-5)
    resized = cv2.resize(image, (24, 24), interpolation=cv2.INTER_AREA)
    assert torch.allclose(eval_transform(24)(image=image)["image"], _normalised(resized), atol=1e-5)


_D4 = ["e", "r90", "r180", "r270", "v", "hvt", "h", "t"]


@pytest.mark.parametrize("shape", [(17, 17, 3), (12, 20, 3)])
def test_dihedral_kernels_are_the_public_d4(shape):
    img = _image(*shape[:2])
    h, w = img.shape[:2]
    seen = set()
    for g in _D4:
        ours = dihedral(img, g)
        ref = A.D4(p=1.0).apply(img, group_element=g)  # public transform, public apply
        assert ours.dtype == img.dtype and ours.flags.c_contiguous, g
        assert np.array_equal(ours, ref), g
        expect_shape = img.shape if g in ("e", "r180", "v", "h") else (w, h, 3)
        assert ours.shape == expect_shape, g
        seen.add(ours.tobytes() + bytes(str(ours.shape), "ascii"))
    assert len(seen) == 8  # the 8 elements are 8 different maps (random images have no symmetry)
    with pytest.raises(ValueError, match="unknown dihedral group element"):
        dihedral(img, "x")


def test_resized_crop_is_one_cv2_resize_of_the_box():
    img = _image(50, 40, seed=5)
    for top, left, h, w in [(0, 0, 50, 40), (3, 7, 20, 31), (10, 2, 9, 9)]:
        out = resized_crop(img, (top, left, h, w), 24)
        patch = np.ascontiguousarray(img[top:top + h, left:left + w])
        assert out.shape == (24, 24, 3) and out.dtype == np.uint8
        assert np.array_equal(out, cv2.resize(patch, (24, 24), interpolation=cv2.INTER_LINEAR))


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


def test_colour_jitter_equals_the_sequential_steps():
    rng = np.random.default_rng(1)
    for s in range(5):
        img = _image(24, 24, seed=s)
        factors = rng.uniform(0.6, 1.4, 3)
        out = jitter_image(img, factors)
        assert out.dtype == np.uint8 and out.shape == img.shape
        for order in itertools.permutations(range(3)):  # the steps commute: any order, same result
            assert np.abs(out.astype(int) - _sequential_jitter(img, factors, order)).max() <= 1
    img = _image(24, 24)
    assert np.array_equal(jitter_image(img, (1.0, 1.0, 1.0)), img)
    with pytest.raises(TypeError, match="colour jitter needs H×W×3 RGB images"):
        jitter_image(img[..., :1], (1.1, 1.0, 1.0))
