"""Training/eval transforms: output contract, randomness, and the cv2 fast paths against albumentations."""

from __future__ import annotations

import itertools

import albumentations as A
import numpy as np
import pytest
import torch
from albumentations.augmentations.geometric import functional as fgeometric

from rsnet.data import build_datasets
from rsnet.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ColorJitterAffine,
    Dihedral,
    RandomResizedCropCV2,
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


def test_train_transform_knobs():
    img = _image(32, 32)
    out = train_transform(16, scale=(0.3, 0.6), color_jitter=0.4, seed=0)(image=img)["image"]
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32
    kinds = [type(t) for t in train_transform(16, color_jitter=0.0).transforms]
    assert ColorJitterAffine not in kinds and A.ColorJitter not in kinds
    assert A.ColorJitter in [type(t) for t in train_transform(16, hue=0.05).transforms]
    crop = train_transform(16, scale=(0.3, 0.6)).transforms[0]
    assert isinstance(crop, RandomResizedCropCV2) and tuple(crop.scale) == (0.3, 0.6)


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
    # the eval transform alone is unchanged: resize (no-op here), normalise, to tensor
    assert [type(t).__name__ for t in eval_transform(24).transforms] == ["Resize", "Normalize", "ToTensorV2"]


@pytest.mark.parametrize("shape", [(17, 17, 3), (12, 20, 3), (9, 14, 1)])
def test_dihedral_matches_albumentations_d4(shape):
    img = _image(*shape[:2])[..., : shape[2]]
    img = np.ascontiguousarray(img)
    for g in ["e", "r90", "r180", "r270", "v", "hvt", "h", "t"]:
        out = Dihedral(p=1.0).apply(img, g)
        assert np.array_equal(out.reshape(fgeometric.d4(img, g).shape), fgeometric.d4(img, g)), g


def test_resized_crop_matches_albumentations():
    img = _image(50, 50)
    ours = RandomResizedCropCV2(size=(32, 32), scale=(0.5, 1.0))
    ref = A.RandomResizedCrop(size=(32, 32), scale=(0.5, 1.0))
    for coords in [(0, 0, 50, 50), (3, 7, 40, 45), (10, 2, 30, 49)]:
        assert np.array_equal(ours.apply(img, coords), ref.apply(img, coords))


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
