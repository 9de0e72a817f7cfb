"""Optimizer (timm) and step settings: mixed precision, channels_last, torch.compile, deterministic."""

from __future__ import annotations

import os
import warnings

import pytest
import timm
import torch

from rsnet.engine import acceleration
from rsnet.engine.acceleration import (
    compiled_forward,
    memory_format,
    set_deterministic,
    tune_convolutions,
    use_channels_last,
)
from rsnet.engine.optim import build_optimizer
from rsnet.precision import StepPrecision

CUDA = torch.device("cuda")  # only inspected, never used: the tests run without a GPU


def _optimizer(name: str) -> torch.optim.Optimizer:
    model = timm.create_model("test_resnet", num_classes=3)
    return build_optimizer(model, {"name": name, "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4})


def test_no_weight_decay_on_norm_layers_and_biases() -> None:
    model = timm.create_model("test_resnet", num_classes=3)
    optimizer = build_optimizer(model, {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4})
    decay = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    for name, parameter in model.named_parameters():
        expected = 0.0 if parameter.ndim <= 1 else 5e-4  # biases and norm weights are 1-D
        assert decay[id(parameter)] == expected, name
    assert len(decay) == len(list(model.parameters()))


@pytest.mark.parametrize("name, kind, nesterov", [("sgd", torch.optim.SGD, True), ("momentum", torch.optim.SGD, False),
                                                  ("adamw", torch.optim.AdamW, None)])
def test_optimizer_names_are_timms(name: str, kind: type, nesterov: bool | None) -> None:
    optimizer = _optimizer(name)
    assert isinstance(optimizer, kind)
    if nesterov is not None:
        assert all(group["nesterov"] is nesterov for group in optimizer.param_groups)


def test_precision_is_float32_on_cpu_and_chosen_on_cuda() -> None:
    assert StepPrecision.for_device("bf16", torch.device("cpu")).dtype is None
    assert StepPrecision.for_device("fp16", torch.device("cpu")).scaler is None
    bf16 = StepPrecision.for_device("bf16", CUDA)
    assert bf16.dtype is torch.bfloat16 and bf16.scaler is None  # bf16 needs no loss scaling
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available. Disabling" on this machine
        fp16 = StepPrecision.for_device("fp16", CUDA)
    assert fp16.dtype is torch.float16 and isinstance(fp16.scaler, torch.amp.GradScaler)
    assert StepPrecision.for_device("none", CUDA).dtype is None
    with pytest.raises(ValueError, match="amp='fp8'"):
        StepPrecision.for_device("fp8", CUDA)


@pytest.mark.parametrize("scaled", [False, True])
def test_backward_and_step_clips_and_updates(scaled: bool) -> None:
    """Clipping sees the true gradients: with a scaler of scale 1024 they are unscaled before the clip, so the step
    is the one an unscaled backward takes (clipping the scaled gradients would leave a step 1024 times too small)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaled else None  # enabled on the CPU
    precision = StepPrecision(torch.device("cpu"), None, scaler)
    before = model.weight.detach().clone()
    loss = (model(torch.randn(8, 4)) * 100).pow(2).mean()
    precision.backward_and_step(loss, optimizer, model.parameters(), max_grad_norm=0.5)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert grads.norm().item() == pytest.approx(0.5, rel=1e-5)  # clipped to 0.5 after unscaling
    torch.testing.assert_close(before - model.weight.detach(), model.weight.grad)  # one SGD step (lr 1) of it
    if scaler is not None:
        assert scaler.get_scale() == 1024.0  # finite gradients: the step was taken, the scale kept


def test_channels_last_only_on_cuda_workers() -> None:
    assert use_channels_last({"channels_last": True}, CUDA)
    assert not use_channels_last({"channels_last": True}, torch.device("cpu"))
    assert not use_channels_last({"channels_last": False}, CUDA)
    assert memory_format({"channels_last": True}, CUDA) == torch.channels_last
    assert memory_format({"channels_last": True}, torch.device("cpu")) == torch.contiguous_format


def test_cudnn_autotuner_only_on_cuda_workers_that_need_not_be_deterministic(monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    tune_convolutions({"deterministic": False}, torch.device("cpu"))
    assert not torch.backends.cudnn.benchmark
    tune_convolutions({"deterministic": True}, CUDA)
    assert not torch.backends.cudnn.benchmark
    tune_convolutions({"deterministic": False}, CUDA)
    assert torch.backends.cudnn.benchmark


def test_compile_is_static_where_the_batch_sizes_are_fixed_else_dynamic(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(acceleration.torch, "compile", lambda module, **kwargs: calls.append(kwargs) or "compiled")
    model = torch.nn.Linear(2, 2)
    assert compiled_forward(model, {"compile": False}, True) is model and not calls
    assert compiled_forward(model, {"compile": True}, True) == "compiled" and calls == [{"dynamic": False}]
    assert compiled_forward(model, {"compile": True}, False) == "compiled" and calls[1:] == [{"dynamic": True}]


def test_deterministic_switches_torch_to_deterministic_algorithms(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        set_deterministic({"deterministic": True})
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        set_deterministic({"deterministic": False})  # a later run in the same process
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
