"""Backbone names and weights the timm way: tags, hf-hub:, local-dir:, weights files, data configs."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest
import safetensors.torch
import timm
import torch
import torchvision
from timm.data import IMAGENET_DEFAULT_MEAN, OPENAI_CLIP_MEAN
from timm.models import vgg

from rsnet.models import BackboneError, backbone_data_config, backbone_layout, build_model, extract_main_branch

FOLDER_MEAN, FOLDER_STD = (0.1, 0.2, 0.3), (0.4, 0.5, 0.6)


@pytest.fixture(autouse=True)
def offline(monkeypatch) -> None:
    """No test here may reach the Hugging Face hub: it fails at once instead."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at call time, set at import


def backbone_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The timm classifier's weights without its classifier."""
    return {k: v for k, v in model.backbone.net.state_dict().items() if not k.startswith("fc.")}


@pytest.fixture
def saved_folder(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A folder written by timm's own save_for_hf: config.json (with its own mean/std) + model.safetensors."""
    torch.manual_seed(3)
    source = timm.create_model("test_resnet")
    folder = tmp_path / "test_resnet_folder"
    timm.models.save_for_hf(source, folder, safe_serialization=True,
                            data_config={"mean": FOLDER_MEAN, "std": FOLDER_STD})
    return folder, source


def test_tagged_name_builds() -> None:
    model = build_model("baseline", "test_resnet.r160_in1k", 5)
    assert model(torch.randn(2, 3, 64, 64)).main_logits.shape == (2, 5)
    assert model.model_config["backbone"] == "test_resnet.r160_in1k"
    assert backbone_layout("resnet50.a1_in1k") == backbone_layout("resnet50")


def test_local_dir_builds_and_loads_its_weights(saved_folder) -> None:
    folder, source = saved_folder
    name = f"local-dir:{folder}"
    random_init = build_model("esd_mbenet", name, 5)
    assert not torch.equal(random_init.backbone.net.conv1[0].weight, source.conv1[0].weight)
    model = build_model("baseline", name, 5, pretrained=True)
    expected = {k: v for k, v in source.state_dict().items() if not k.startswith("fc.")}
    assert backbone_state(model).keys() == expected.keys()
    assert all(torch.equal(backbone_state(model)[k], v) for k, v in expected.items())
    assert model.backbone.net.fc.out_features == 5
    plain = extract_main_branch(model).eval()  # the pruned main branch rebuilds from the same folder
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (plain(x) - model.eval()(x).main_logits).abs().max() <= 1e-5


def test_hf_hub_offline_fails_in_one_line() -> None:
    with pytest.raises(BackboneError, match=r"backbone.name='hf-hub:rsnet-tests/no-such-model'.*local-dir:") as error:
        build_model("baseline", "hf-hub:rsnet-tests/no-such-model", 5)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("name", "expected"), [
    ("resnet50.a1_in1kk", r"no weights tag 'a1_in1kk'.*resnet50.a1_in1k"),  # a typo in the tag
    ("resnet5O.a1_in1k", r"did you mean.*'resnet50'"),  # a typo in the architecture
    ("timm/resnet50.a1_in1k", r"hf-hub:timm/resnet50.a1_in1k"),  # a repo id without its source
    ("local-dir:/no/such/folder", r"/no/such/folder/config.json does not exist.*save_for_hf"),
])
def test_name_errors_say_what_to_do(name: str, expected: str) -> None:
    with pytest.raises(BackboneError, match=rf"backbone.name=.*{expected}"):
        build_model("baseline", name, 5)


def test_data_config_of_a_tag_comes_from_its_pretrained_config() -> None:
    """Registry configs only: the offline fixture proves nothing is downloaded."""
    inception = backbone_data_config("inception_v3.tv_in1k")
    assert inception["mean"] == inception["std"] == (0.5, 0.5, 0.5)
    assert inception["input_size"] == (3, 299, 299)
    assert backbone_data_config("vit_base_patch16_clip_224.openai")["mean"] == OPENAI_CLIP_MEAN
    resnet = backbone_data_config("resnet50")  # untagged: the default tag, a1_in1k
    assert resnet == {"mean": IMAGENET_DEFAULT_MEAN, "std": (0.229, 0.224, 0.225), "input_size": (3, 224, 224),
                      "interpolation": "bicubic", "crop_pct": 0.95, "crop_mode": "center"}


def test_data_config_of_a_local_dir_comes_from_its_config_json(saved_folder) -> None:
    folder, _ = saved_folder
    config = backbone_data_config(f"local-dir:{folder}")
    assert (config["mean"], config["std"]) == (FOLDER_MEAN, FOLDER_STD)
    assert config["input_size"] == (3, 160, 160)  # test_resnet.r160_in1k's, carried into config.json


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_pretrained_timm_file(tmp_path: Path, suffix: str) -> None:
    torch.manual_seed(3)
    source = timm.create_model("test_resnet")  # an ImageNet-style classifier: 1000 classes
    path = tmp_path / f"test_resnet{suffix}"
    save = torch.save if suffix == ".pth" else safetensors.torch.save_file
    save(source.state_dict(), path)
    model = build_model("esd_mbenet", "test_resnet", 4, pretrained=str(path))
    assert torch.equal(model.backbone.net.layer4[0].conv1.weight, source.layer4[0].conv1.weight)
    assert model.backbone.net.fc.out_features == 4
    assert model.model_config["pretrained"] == str(path)


def test_pretrained_torchvision_resnet18_file(tmp_path: Path) -> None:
    torch.manual_seed(4)
    source = torchvision.models.resnet18()
    path = tmp_path / "resnet18-torchvision.pth"
    torch.save(source.state_dict(), path)
    model = build_model("baseline", "resnet18", 7, pretrained=path)
    expected = {k: v for k, v in source.state_dict().items() if not k.startswith("fc.")}
    assert backbone_state(model).keys() == expected.keys()
    assert all(torch.equal(backbone_state(model)[k], v) for k, v in expected.items())
    assert model.backbone.net.fc.out_features == 7


def test_torchvision_vgg16_keys_map_through_timm_filter() -> None:
    """timm loads files through vgg's own filter: torchvision's classifier.0/3/6 become fc6/fc7 convs and head.fc."""
    with torch.device("meta"):  # shapes only: a real vgg16 file is 528 MB
        source = torchvision.models.vgg16().state_dict()
        target = timm.create_model("vgg16").state_dict()
    mapped = vgg._filter_fn(source)
    assert {k: v.shape for k, v in mapped.items()} == {k: v.shape for k, v in target.items()}


def test_pretrained_file_that_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(timm.create_model("resnet18").state_dict(), path)
    with pytest.raises(BackboneError, match=r"backbone.pretrained=.*resnet18.pth does not load.*conv1.weight") as error:
        build_model("baseline", "test_resnet", 4, pretrained=str(path))
    assert "\n" not in str(error.value)
    classes = tmp_path / "test_resnet_45_classes.pth"  # keys fit, classifier of another class count
    torch.save(timm.create_model("test_resnet", num_classes=45).state_dict(), classes)
    with pytest.raises(BackboneError, match=r"fc.weight.*local-dir:"):
        build_model("baseline", "test_resnet", 4, pretrained=str(classes))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a state dict")
    with pytest.raises(BackboneError, match=r"backbone.pretrained=.*junk.pth"):
        build_model("baseline", "test_resnet", 4, pretrained=str(junk))
    with pytest.raises(BackboneError, match=r"backbone.pretrained=.*missing.pth does not exist"):
        build_model("baseline", "test_resnet", 4, pretrained=str(tmp_path / "missing.pth"))


def test_pretrained_true_offline_suggests_a_local_folder(monkeypatch) -> None:
    real = timm.create_model

    def no_network(name, pretrained=False, **kwargs):  # whatever the HF cache of this machine holds
        if pretrained:
            raise OSError("Name or service not known")
        return real(name, pretrained=False, **kwargs)

    monkeypatch.setattr(timm, "create_model", no_network)
    with pytest.raises(BackboneError, match=r"backbone.pretrained=true.*save_for_hf.*local-dir:/path/to/test_resnet"):
        build_model("baseline", "test_resnet", 4, pretrained=True)
