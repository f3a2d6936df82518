"""Optimizer, learning-rate schedule, and the guarded optimizer step."""

import bisect

import torch
from torch.distributed.tensor import DTensor

from omnialign.config import ActorConfig


def build(
    params: list[torch.nn.Parameter], config: ActorConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the trainable parameters; the rate warms up linearly, then stays, times `lr_gamma` from each of
    `lr_milestones` applied updates on."""
    if not params:
        raise ValueError("no trainable parameters: check model.lora or the frozen modules")
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    warmup, milestones, gamma = max(config.warmup_steps, 1), sorted(config.lr_milestones), config.lr_gamma
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * gamma ** bisect.bisect_right(milestones, step)
    )
    return optimizer, scheduler


class NonFiniteUpdate(FloatingPointError):
    """The gradient of an update is NaN or infinite; the update was not applied."""


def step(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: list[torch.nn.Parameter],
    loss: torch.Tensor,
    max_grad_norm: float,
    skip_nonfinite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip, then step only if the gradient norm and the update's `loss` (0-d) are finite; always zero
    the gradients. A non-finite one raises `NonFiniteUpdate` unless `skip_nonfinite`. A gradient of exactly 0 (a
    mini-batch with nothing to learn, such as online DPO's where every pair is tied) takes no step either, so that
    AdamW's momentum and weight decay do not move the weights on no evidence.

    Returns (grad norm before clipping, 1.0 if the update was skipped else 0.0). One host sync.
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if isinstance(grad_norm, DTensor):  # sharded parameters give a replicated global norm
        grad_norm = grad_norm.full_tensor()
    loss = loss.detach().float().reshape(()).to(grad_norm.device)
    finite, empty = torch.stack([torch.isfinite(grad_norm) & torch.isfinite(loss), grad_norm == 0]).tolist()
    if not finite and not skip_nonfinite:
        optimizer.zero_grad(set_to_none=True)
        cause = (
            "the loss is finite, so the backward pass made it (PyTorch reports NaN gradients from cuDNN's masked "
            "attention backward on H100/H200, pytorch/pytorch#196678: try engine.cudnn_attention=false)"
            if torch.isfinite(loss)
            else "a loss or a reward is NaN or infinite"
        )
        raise NonFiniteUpdate(
            f"the loss is {float(loss)} and the gradient norm {float(grad_norm)}: {cause}. The update was not "
            "applied and the last checkpoint is intact; look at the step's rewards and losses, or set "
            "actor.skip_nonfinite=true to skip such updates and go on"
        )
    if finite and not empty:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach(), torch.tensor(0.0 if finite else 1.0)
