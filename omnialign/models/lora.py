"""peft LoRA on any network, with named adapters and the reference (adapters off) context.

`apply_lora` injects a `default` adapter (trainable) into the network in place, so the module
keeps its class and its forward. Algorithms that need an old policy add an `old` adapter
(`add_adapter`, frozen), run under `use_adapter(module, "old")` and refresh it by copy or EMA
(`blend_adapter`). `adapters_disabled` runs the base network: the reference policy.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from torch import nn

from omnialign.engine.fsdp import written_as


def apply_lora(
    module: nn.Module, rank: int, alpha: float, targets: list[str], exclude: list[str] | None = None
) -> LoraConfig:
    """Inject a trainable `default` LoRA adapter into `targets` (minus the `exclude` module names); freezes
    every other parameter."""
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, exclude_modules=exclude,
                        init_lora_weights=True)  # fmt: skip
    module.requires_grad_(False)
    try:
        inject_adapter_in_model(config, module, adapter_name="default")
    except ValueError as e:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in module.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"model.lora.targets={targets} matched no module ({e}); linear layers are named {linear}"
        ) from None
    for name, p in module.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # trained parameters keep fp32 master weights
    return config


def lora_layers(module: nn.Module) -> list[LoraLayer]:
    return [m for m in module.modules() if isinstance(m, LoraLayer)]


def add_adapter(module: nn.Module, name: str, config: LoraConfig) -> None:
    """A second, frozen adapter with the same shape as `default`, initialised as a copy of it."""
    with warnings.catch_warnings():  # a second adapter is intended here
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        inject_adapter_in_model(config, module, adapter_name=name)
    for layer in lora_layers(module):
        layer.set_adapter("default")  # peft marks the active adapter trainable, the others frozen
    blend_adapter(module, name, decay=0.0)


@torch.no_grad()
def blend_adapter(module: nn.Module, name: str, decay: float) -> None:
    """adapter `name` <- decay * itself + (1 - decay) * default; decay 0 copies default."""
    for layer in lora_layers(module):
        for table in (layer.lora_A, layer.lora_B):
            target = table[name].weight
            target.lerp_(written_as(table["default"].weight, target).to(target.dtype), 1.0 - decay)


@contextmanager
def use_adapter(module: nn.Module, name: str) -> Iterator[None]:
    """Compute with adapter `name` instead of `default` (for forward-only passes)."""
    layers = lora_layers(module)
    for layer in layers:
        layer.set_adapter(name)
    try:
        yield
    finally:
        for layer in layers:
            layer.set_adapter("default")


@contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """Compute with the base network only: the reference policy of LoRA training."""
    layers = lora_layers(module)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def adapter_state_dict(module: nn.Module, name: str = "default") -> dict[str, torch.Tensor]:
    """The adapter's weights in PEFT's layout (keys without the adapter name)."""
    return get_peft_model_state_dict(module, adapter_name=name)
