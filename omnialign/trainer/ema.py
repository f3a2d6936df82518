"""An exponential moving average of the trained parameters (`trainer.ema_decay`), which validation samples from.

flow_grpo keeps one of its LoRA weights (decay 0.9, updated every 8 optimizer steps, with the warm-up
min((1 + s) / (10 + s), decay) at its 0-based step s) and evaluates and saves with it; here the updates count
training steps (1-based, so the warm-up reads min(s / (9 + s), decay)).
"""

from contextlib import contextmanager

import torch
from torch import nn


class ParameterAverage:
    """Float32 copies of `model`'s trained parameters (those with requires_grad), keyed by their names as
    `tensors()` gives them to the checkpoint ("ema/NAME")."""

    def __init__(self, model: nn.Module, decay: float, every: int):
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.average = {n: p.detach().float().clone() for n, p in self.params.items()}
        self.decay, self.every = decay, every

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"ema/{n}": a for n, a in self.average.items()}

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After training step `step` (1-based): every `every` steps, move toward the parameters."""
        if step % self.every == 0:
            weight = 1 - min(step / (9 + step), self.decay)
            for n, p in self.params.items():
                self.average[n].lerp_(p.detach().float(), weight)

    @torch.no_grad()
    def load_into_parameters(self) -> None:
        for n, p in self.params.items():
            p.copy_(self.average[n])

    @contextmanager
    def applied(self):
        """The parameters hold the average inside the context and their own values again after it."""
        kept = {n: p.detach().clone() for n, p in self.params.items()}
        self.load_into_parameters()
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(kept[n])
