"""Optimizer, learning-rate schedule, and the guarded optimizer step."""

import torch
from torch.distributed.tensor import DTensor

from omnialign.config import ActorConfig


def build(
    params: list[torch.nn.Parameter], config: ActorConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the trainable parameters and a linear warmup to a constant rate."""
    if not params:
        raise ValueError("no trainable parameters: check model.lora or the frozen modules")
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    warmup = max(config.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return optimizer, scheduler


def step(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: list[torch.nn.Parameter],
    max_grad_norm: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip, then step only if the gradient norm is finite; always zero the gradients.

    Returns (grad norm before clipping, 1.0 if the update was skipped else 0.0). One host sync.
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if isinstance(grad_norm, DTensor):  # sharded parameters give a replicated global norm
        grad_norm = grad_norm.full_tensor()
    finite = bool(torch.isfinite(grad_norm))
    if finite:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach(), torch.tensor(0.0 if finite else 1.0)
