"""Batched augmentation on the worker's device: the same pixels as the host's OpenCV steps, per-sample parameters,
labels kept with their images, reproducible from (seed, epoch, index) alone."""

from __future__ import annotations

import itertools

import albumentations as A
import cv2
import numpy as np
import torch

from rsnet.data import build_datasets
from rsnet.data.loader import eval_prefetcher, index_chunks
from rsnet.data.augment_params import AugmentParams
from rsnet.data.device_augment import DeviceAugment, resized_crops
from rsnet.data.normalize import to_float_chw
from rsnet.data.transforms import IMAGENET_MEAN, IMAGENET_STD, jitter_image

TRAIN = DeviceAugment(32, IMAGENET_MEAN, IMAGENET_STD, crop_scale=(0.5, 1.0), color_jitter=0.2, dihedral=True)


def _images(n=8, size=32, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8))


def _augment(augment, images, indices, seed=0, epoch=0):
    return augment.apply(images, indices, seed, epoch, torch.contiguous_format)


def test_resized_crops_match_opencv_inter_linear():
    images = _images(12, 40, seed=1)
    rng = np.random.default_rng(2)
    boxes = []
    for _ in range(len(images)):
        h, w = rng.integers(5, 41, 2)
        boxes.append([rng.integers(0, 41 - h), rng.integers(0, 41 - w), h, w])
    boxes = torch.tensor(boxes)
    for size in (24, 40, 64):  # down, same, up
        out = resized_crops(images, boxes, size)
        for image, (top, left, h, w), got in zip(images.numpy(), boxes.tolist(), out):
            expected = cv2.resize(image[top:top + h, left:left + w], (size, size), interpolation=cv2.INTER_LINEAR)
            assert np.abs(got.numpy() - expected).max() <= 1.0  # OpenCV rounds its uint8 weights and output


def test_dihedral_flags_are_the_eight_symmetries():
    image = _images(1, 16, seed=3)
    flags = torch.tensor(list(itertools.product([False, True], repeat=3)))  # transpose, upside down, left-right
    plain = DeviceAugment(16, (0.0, 0.0, 0.0), (1 / 255,) * 3, dihedral=True)
    out = plain(image.expand(8, -1, -1, -1), AugmentParams(flags, None, None), torch.contiguous_format)
    seen = {out[k].permute(1, 2, 0).round().to(torch.uint8).numpy().tobytes() for k in range(8)}
    group = {A.D4(p=1.0).apply(image[0].numpy(), group_element=e).tobytes()
             for e in ("e", "r90", "r180", "r270", "v", "hvt", "h", "t")}
    assert seen == group


def test_colour_jitter_matches_the_host_step():
    images = _images(6, 24, seed=4)
    jitter = DeviceAugment(24, (0.0, 0.0, 0.0), (1 / 255,) * 3, color_jitter=0.4, jitter_p=1.0)
    params = jitter.draw(5, 0, range(6), 24, 24)
    out = jitter(images, params, torch.contiguous_format).permute(0, 2, 3, 1).numpy()
    for image, factors, got in zip(images.numpy(), params.factors.tolist(), out):
        assert factors != [1.0, 1.0, 1.0]
        expected = jitter_image(image, factors)
        assert np.abs(got - expected).max() <= 1.0


def test_without_augmentation_it_is_the_host_normalisation_in_channels_last():
    images = _images(4, 20, seed=5)
    normalise = DeviceAugment(20, IMAGENET_MEAN, IMAGENET_STD)
    out = normalise(images, normalise.draw(0, 0, range(4), 20, 20))
    assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (4, 3, 20, 20)
    assert torch.allclose(out, to_float_chw(images.numpy(), IMAGENET_MEAN, IMAGENET_STD), atol=1e-5)


def test_parameters_are_drawn_per_sample():
    same = _images(1, 32, seed=6).expand(64, -1, -1, -1)
    params = TRAIN.draw(0, 0, range(64), 32, 32)
    assert len({tuple(b) for b in params.boxes.tolist()}) > 50
    assert len({tuple(f) for f in params.dihedral.tolist()}) == 8
    jittered = (params.factors != 1).any(1)
    assert 16 < int(jittered.sum()) < 48  # about half the images
    out = _augment(TRAIN, same, range(64))
    assert len({row.numpy().tobytes() for row in out}) == 64


def test_labels_stay_with_their_images():
    """Constant images whose grey level encodes the label: every augmentation but jitter keeps the level."""
    labels = torch.arange(10)
    images = (labels * 20 + 10).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 32, 32, 3).contiguous()
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    augment = DeviceAugment(24, (0.0, 0.0, 0.0), (1 / 255,) * 3, crop_scale=(0.3, 1.0), dihedral=True)
    out = _augment(augment, images[order], order)
    assert torch.equal(((out.mean((1, 2, 3)) - 10) / 20).round().long(), labels[order])


def test_reproducible_from_seed_whatever_the_batches():
    images = _images(8, 32, seed=7)
    whole = _augment(TRAIN, images, range(8), seed=3, epoch=2)
    halves = torch.cat([_augment(TRAIN, images[:3], range(3), seed=3, epoch=2),
                        _augment(TRAIN, images[3:], range(3, 8), seed=3, epoch=2)])
    assert torch.equal(whole, halves)
    assert torch.equal(whole, _augment(TRAIN, images, range(8), seed=3, epoch=2))
    assert not torch.equal(whole, _augment(TRAIN, images, range(8), seed=4, epoch=2))
    assert not torch.equal(whole, _augment(TRAIN, images, range(8), seed=3, epoch=3))


def test_evaluation_batches_on_the_device_equal_the_host_transform(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 32)
    indices = np.arange(len(bundle.test))
    host = torch.cat([bundle.test.get_batch(indices[k:k + 8])[0] for k in range(0, len(indices), 8)])
    prefetcher = eval_prefetcher(bundle.test, torch.device("cpu"), bundle.eval_augment)
    batches = list(prefetcher.batches(index_chunks(indices, 8)))
    prefetcher.close()
    assert torch.allclose(torch.cat([batch.images for batch in batches]), host, atol=1e-5)
    assert torch.equal(torch.cat([batch.labels for batch in batches]), torch.from_numpy(bundle.test.labels))


def test_training_settings_carry_over_from_the_augment_config(mini_root):
    small = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 32).train_augment
    assert small.dihedral and small.crop_scale is None and small.color_jitter == 0.2  # the defaults: no crop
    large = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 128,
                           augment={"crop_scale": [0.5, 1.0], "color_jitter": 0.0}).train_augment
    assert large.crop_scale == (0.5, 1.0) and large.color_jitter == 0.0
