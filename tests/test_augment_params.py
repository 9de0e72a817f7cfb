"""The one augmentation draw of the host and the device path: per-sample parameters from (seed, epoch, index) alone,
torchvision's crop draw, the dihedral codes, and the same sample augmented alike by OpenCV and by torch."""

from __future__ import annotations

import math

import albumentations as A
import numpy as np
import pytest
import torch
import torchvision

from rsnet.data.augment_params import DIHEDRAL_ELEMENTS, AugmentParams, AugmentSettings, sample_uniforms
from rsnet.data.device_augment import DeviceAugment
from rsnet.data.normalize import to_float_chw
from rsnet.data.transforms import IMAGENET_MEAN, IMAGENET_STD, HostAugment, dihedral, jitter_image, resized_crop

TRAINING = {"image_size": 32, "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "scale": (0.5, 1.0), "color_jitter": 0.2}


def _images(n: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _crops(scale, ratio, height, width, count, seed=0) -> np.ndarray:
    settings = AugmentSettings(8, (0.0,) * 3, (1.0,) * 3, crop_scale=scale, crop_ratio=ratio)
    return settings.draw(seed, 0, range(count), height, width).boxes.numpy()


def test_uniforms_depend_only_on_seed_epoch_index_and_column():
    batch = sample_uniforms(3, 1, [7, 11, 5], 6)
    assert np.array_equal(sample_uniforms(3, 1, [5], 6)[0], batch[2])  # not on the batch around it
    assert not np.array_equal(sample_uniforms(3, 2, [5], 6)[0], batch[2])  # another epoch
    assert not np.array_equal(sample_uniforms(4, 1, [5], 6)[0], batch[2])  # another seed
    many = sample_uniforms(0, 0, np.arange(20000), 4)
    assert many.min() >= 0 and many.max() < 1
    assert abs(many.mean() - 0.5) < 0.01 and abs(np.corrcoef(many[:, 0], many[:, 1])[0, 1]) < 0.03


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (3 / 4, 4 / 3)),
                                          ((0.2, 0.3), (0.5, 2.0)), ((0.5, 0.8), (1.0, 1.0)),
                                          ((0.2, 0.4), (1.2, 2.0))])
def test_crop_boxes_within_scale_and_ratio(scale, ratio):
    height, width = 50, 40
    area = height * width
    boxes = _crops(scale, ratio, height, width, 500)
    top, left, h, w = boxes.T
    assert ((h > 0) & (h <= height) & (w > 0) & (w <= width)).all()
    assert ((top >= 0) & (top <= height - h) & (left >= 0) & (left <= width - w)).all()
    central = tuple(_crops((5.0, 6.0), ratio, height, width, 1)[0])  # no attempt fits: the central fallback
    drawn = np.array([tuple(box) != central for box in boxes])
    assert (~drawn).sum() < 50 and len({tuple(box) for box in boxes}) > 20  # random, and mostly not the fallback
    # w, h are round(sqrt(area·r)), round(sqrt(area/r)): the unrounded values lie within 0.5
    h, w = h[drawn].astype(float), w[drawn].astype(float)
    assert ((w - 0.5) * (h - 0.5) <= scale[1] * area + 1e-9).all()
    assert ((w + 0.5) * (h + 0.5) >= scale[0] * area - 1e-9).all()
    assert ((w - 0.5) / (h + 0.5) <= ratio[1] + 1e-9).all() and ((w + 0.5) / (h - 0.5) >= ratio[0] - 1e-9).all()


def test_crop_boxes_follow_torchvisions_draw():
    boxes = _crops((0.5, 1.0), (3 / 4, 4 / 3), 150, 150, 2000, seed=1).astype(float)
    top, left, h, w = boxes.T
    assert (top + h <= 150).all() and (left + w <= 150).all()
    torch.manual_seed(0)  # torchvision draws from torch's global generator
    reference = [torchvision.transforms.RandomResizedCrop.get_params(torch.empty(3, 150, 150), [0.5, 1.0],
                                                                     [3 / 4, 4 / 3]) for _ in range(2000)]
    area = h * w / 150 ** 2
    reference_area = np.mean([bh * bw for _, _, bh, bw in reference]) / 150 ** 2
    assert area.min() > 0.5 - 0.02 and area.max() <= 1.0 and area.mean() == pytest.approx(reference_area, abs=0.01)
    assert (np.log(w / h) >= math.log(3 / 4) - 0.02).all() and (np.log(w / h) <= math.log(4 / 3) + 0.02).all()


def test_crop_box_fallback_is_central():
    never = (2.0, 3.0)  # target area larger than the image: no attempt can fit
    # aspect ratio of the image (40/50 = 0.8) inside the range: the whole image
    assert {tuple(box) for box in _crops(never, (3 / 4, 4 / 3), 50, 40, 20)} == {(0, 0, 50, 40)}
    # too tall for ratio >= 1: full width, height clamped to width / 1.0, centred vertically
    assert {tuple(box) for box in _crops(never, (1.0, 2.0), 50, 40, 20)} == {(5, 0, 40, 40)}
    # too wide for ratio <= 1: full height, width height * 1.0, centred horizontally
    assert {tuple(box) for box in _crops(never, (0.5, 1.0), 40, 51, 20)} == {(0, 5, 40, 40)}
    # too tall for ratio >= 2: height round(30 / 2) = 15, top (40 - 15) // 2
    assert {tuple(box) for box in _crops(never, (2.0, 3.0), 40, 30, 20)} == {(12, 0, 15, 30)}


def test_dihedral_codes_name_the_device_flags_and_cover_the_group():
    image = torch.from_numpy(_images(1, 16, seed=3))
    plain = DeviceAugment(16, (0.0, 0.0, 0.0), (1 / 255,) * 3, dihedral=True)
    for code, element in enumerate(DIHEDRAL_ELEMENTS):
        flags = torch.tensor([[bool(code & 4), bool(code & 2), bool(code & 1)]])  # transpose, upside down, left-right
        params = AugmentParams(flags, None, None)
        assert params.dihedral_codes().tolist() == [code]
        out = plain(image, params, torch.contiguous_format)[0].permute(1, 2, 0).round().to(torch.uint8).numpy()
        assert np.array_equal(out, A.D4(p=1.0).apply(image[0].numpy(), group_element=element)), element
    codes = plain.draw(0, 0, range(4000), 16, 16).dihedral_codes()
    assert np.bincount(codes, minlength=8).min() > 400  # about 500 each: uniform over the 8 symmetries


def test_source_boxes_crop_the_same_pixels_before_the_flip():
    image = _images(1, 20, seed=4)[0]
    rng = np.random.default_rng(5)
    for code, element in enumerate(DIHEDRAL_ELEMENTS):
        h, w = rng.integers(3, 21, 2)
        box = (int(rng.integers(0, 21 - h)), int(rng.integers(0, 21 - w)), int(h), int(w))
        flags = torch.tensor([[bool(code & 4), bool(code & 2), bool(code & 1)]])
        top, left, sh, sw = AugmentParams(flags, None, torch.tensor([box])).source_boxes(20, 20)[0]
        flipped = A.D4(p=1.0).apply(image, group_element=element)
        expected = flipped[box[0]:box[0] + box[2], box[1]:box[1] + box[3]]
        assert np.array_equal(dihedral(np.ascontiguousarray(image[top:top + sh, left:left + sw]), element),
                              expected), element


def test_a_sample_gets_the_same_parameters_on_either_path():
    host, device = HostAugment.for_training(**TRAINING), DeviceAugment.for_training(**TRAINING)
    assert {f: getattr(host, f) for f in host.__dataclass_fields__} == \
        {f: getattr(device, f) for f in device.__dataclass_fields__}
    on_host = host.draw(5, 3, [9, 2, 14, 7], 48, 48)
    on_device = device.draw(5, 3, torch.tensor([14, 9]), 48, 48)  # another batch, another order
    for name in ("dihedral", "factors", "boxes"):
        assert torch.equal(getattr(on_host, name)[[2, 0]], getattr(on_device, name)), name
    many = host.draw(5, 3, range(400), 48, 48)
    assert 150 < int(many.jittered().sum()) < 250  # about half the images jittered
    assert (many.factors[~torch.from_numpy(many.jittered())] == 1).all()


def test_host_pixels_are_the_opencv_steps_with_the_samples_parameters():
    host = HostAugment.for_training(**TRAINING)
    images = _images(16, 48, seed=6)
    indices = np.arange(100, 116)
    params = host.draw(1, 4, indices, 48, 48)
    out = host.apply(list(images), indices, seed=1, epoch=4)
    boxes, codes, jittered = params.source_boxes(48, 48), params.dihedral_codes(), params.jittered()
    assert jittered.any() and not jittered.all()
    for k, image in enumerate(images):
        expected = dihedral(resized_crop(image, boxes[k], 32), DIHEDRAL_ELEMENTS[codes[k]])
        if jittered[k]:
            expected = jitter_image(expected, params.factors[k].tolist())
        assert torch.equal(out[k], to_float_chw(expected, IMAGENET_MEAN, IMAGENET_STD))


def test_host_and_device_outputs_agree():
    """The same uint8 images, indices, seed and epoch through both paths (training settings at 32 and 128 px, stored
    at 48 and 150 px: crops down- and upsampled). Random pixels are the worst case for rounding: OpenCV rounds to
    uint8 after its resize and after the jitter (whose factors scale that rounding), torch stays in float. Measured:
    at most 1.7 grey levels, under 1 % of the values more than 1, mean 0.32."""
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    for size, stored in ((32, 48), (128, 150)):
        settings = {**TRAINING, "image_size": size}
        host, device = HostAugment.for_training(**settings), DeviceAugment.for_training(**settings)
        images = _images(64, stored, seed=size)
        indices = np.arange(64) * 3
        on_host = host.apply(list(images), indices, seed=2, epoch=5)
        on_device = device.apply(torch.from_numpy(images), indices, 2, 5, torch.contiguous_format)
        grey_levels = (on_host - on_device).abs() * std * 255  # the difference in uint8 steps
        assert grey_levels.max() <= 2.0
        assert (grey_levels > 1.0).float().mean() < 0.02 and grey_levels.mean() < 0.4
