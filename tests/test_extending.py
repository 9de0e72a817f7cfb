"""docs/extending.md, done once: a new model, a new strategy and a new dataset, each added by the files that page
names (a registered class + its yaml; a yaml only for a dataset folder), then trained for an epoch by rsnet-train."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, compose_command, run_train
from hydra.errors import ConfigCompositionException
from PIL import Image
from torch import Tensor, nn

from rsnet.config_schema import TRAINER_SCHEMAS, LocalSgdSchema, register_schemas, type_error
from rsnet.models import MODELS, RSNetModel, build_model, register_model
from rsnet.models.output import MultiBranchOutput
from rsnet.parallel.strategies import STRATEGIES, LocalSGDStrategy, register_strategy

TINY = ["backbone=test_resnet", "dataset.image_size=32", "batch_size=16", "log.progress_bar=false",
        "trainer.devices=[cpu]", "epochs=1"]


class TwoHeads(RSNetModel):
    """The backbone's classifier (the main head, which export keeps) and a second linear head on the S4 map."""

    arch = "two_heads"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 second_scale: float = 1.0) -> None:
        super().__init__(backbone, num_classes, pretrained, drop_rate, second_scale=second_scale)
        self.second = nn.Linear(self.backbone.channels[3], num_classes)
        self.second_scale = second_scale

    def forward(self, x: Tensor) -> MultiBranchOutput:
        main = self.main_branch(self.backbone.trunk(x)[-1])
        second = self.second(main.stage4.mean(dim=(2, 3))) * self.second_scale
        return MultiBranchOutput(logits={"main": main.logits, "second": second,
                                         "ensemble": (main.logits + second) / 2},
                                 features={"main": main.head_map, "stage4": main.stage4}, ensemble="ensemble")


class AverageEveryStep(LocalSGDStrategy):
    """local_sgd with H = 1: the replicas are averaged after every step."""

    name = "average_every_step"

    def __init__(self, trainer_cfg, *args, **kwargs) -> None:
        super().__init__({**trainer_cfg, "average_every": 1}, *args, **kwargs)


@pytest.fixture
def registered(monkeypatch) -> Iterator[None]:
    """What a new module does when rsnet imports it: register its classes (undone after the test), and the
    strategy's schema (the settings of local_sgd: the class it subclasses)."""
    register_model(TwoHeads)
    register_strategy(AverageEveryStep)
    monkeypatch.setitem(TRAINER_SCHEMAS, AverageEveryStep.name, LocalSgdSchema)
    register_schemas()
    yield
    del MODELS[TwoHeads.arch], STRATEGIES[AverageEveryStep.name]


def write_extension(conf: Path, images: Path) -> None:
    """The yaml files docs/extending.md names: conf/model/<arch>.yaml, conf/trainer/<name>.yaml,
    conf/dataset/<name>.yaml (here in a config dir of the user's, as --config-dir would add it)."""
    for group, text in {
        "model/two_heads.yaml": "arch: two_heads\noptions:\n  drop_rate: 0.0\n  second_scale: 0.5\nloss:\n"
                                "  temperature: 3.0\n  alpha: 1.0\n  beta: 0.0\n  rampup_epochs: 1\n"
                                "  feature_loss: none\n  teacher: null\n  ce_heads: null\n  label_smoothing: 0.1\n",
        "trainer/average_every_step.yaml": "defaults:\n  - average_every_step_schema\n  - /_base/launcher@_here_\n"
                                           "  - _self_\nname: average_every_step\n"
                                           "average_every: 1\nref_batch: null\ntorch_averager: true\nbatch_min: 8\n",
        "dataset/my_scenes.yaml": f"defaults: [image_folder, _self_]\nroot: {images}\n",
    }.items():
        (conf / group).parent.mkdir(parents=True, exist_ok=True)
        (conf / group).write_text(text)


def scene_folder(root: Path, classes: int = 3, per_class: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for index in range(classes):
        folder = root / f"class_{index}"
        folder.mkdir(parents=True)
        for image in range(per_class):
            pixels = np.clip(rng.normal(60 * index + 40, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{image}.png")
    return root


def test_a_model_a_strategy_and_a_dataset_added_as_the_docs_say_train(registered, tmp_path: Path, capfd) -> None:
    conf = tmp_path / "my_conf"
    write_extension(conf, scene_folder(tmp_path / "scenes"))
    run_dir = tmp_path / "run"
    status = run_train(run_dir, *TINY, f"hydra.searchpath=[file://{conf}]", "model=two_heads",
                       "trainer=average_every_step", "dataset=my_scenes")
    out, err = capfd.readouterr()
    assert status == 0, err
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["reported_head"] == "ensemble" and set(metrics["oa"]) == {"main", "second", "ensemble"}
    assert metrics["scheduler"]["strategy"] == "average_every_step" and metrics["test_samples"] == 12
    model = build_model("two_heads", "test_resnet", 3, second_scale=0.5)
    assert model.model_config["second_scale"] == 0.5 and isinstance(model(torch.zeros(2, 3, 32, 32)).logits, dict)


def test_the_registries_refuse_a_second_class_under_a_taken_name(registered) -> None:
    class Impostor(TwoHeads):
        pass

    with pytest.raises(ValueError, match="model.arch='two_heads' is registered twice: TwoHeads and "):
        register_model(Impostor)
    assert register_model(TwoHeads) is TwoHeads  # the same class again (a module imported twice) is no conflict


def test_the_docs_name_the_files_this_test_touched() -> None:
    page = (REPO / "docs" / "extending.md").read_text()
    for named in ("@register_model", "rsnet/models/__init__.py", "conf/model/<arch>.yaml", "@register_strategy",
                  "rsnet/parallel/strategies/__init__.py", "conf/trainer/<name>.yaml", "conf/dataset/<name>.yaml",
                  "rsnet/data/specs.py", "rsnet/config_schema.py", "TRAINER_SCHEMAS"):
        assert named in page, named


def test_the_new_strategys_settings_are_typed_by_its_schema(registered, tmp_path: Path) -> None:
    conf = tmp_path / "my_conf"
    write_extension(conf, tmp_path / "scenes")
    with pytest.raises(ConfigCompositionException) as caught:
        compose_command("config", f"hydra.searchpath=[file://{conf}]", "trainer=average_every_step",
                        "trainer.average_every=abc")
    assert type_error(caught.value.__cause__) == "trainer.average_every='abc': must be a whole number"
