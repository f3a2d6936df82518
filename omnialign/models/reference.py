"""Contexts under which a policy computes as another one, and the reference policy of full fine-tuning:
a frozen copy of the network, swapped in."""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

from omnialign.engine.fsdp import written_as
from omnialign.models.base import DiffusionPolicy

Context = Callable[[], AbstractContextManager]
"""A factory of the context under which a policy computes as another one: the reference (LoRA adapters off,
or a frozen copy swapped in), a teacher, or the `old` adapter. Trainers and objectives take these."""


def swapped_network(policy: DiffusionPolicy, frozen: nn.Module) -> Context:
    """A context factory under which `policy` computes with `frozen` instead of its trained network."""

    @contextmanager
    def reference() -> Iterator[None]:
        trained, policy.transformer = policy.transformer, frozen
        try:
            yield
        finally:
            policy.transformer = trained

    return reference


class Reference:
    """A reference policy that can change (online DPO's `algorithm.ref_update_every`): its context factory, and
    `copies`, each reference tensor by name with the trained tensor that `refresh()` copies into it."""

    def __init__(self, context: Context, copies: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        self.context, self.copies = context, copies

    def __call__(self) -> AbstractContextManager:
        return self.context()

    @torch.no_grad()
    def refresh(self) -> None:
        for reference, trained in self.copies.values():
            reference.copy_(written_as(trained, reference))

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The reference tensors a checkpoint keeps, by name."""
        return {f"reference/{name}": reference for name, (reference, _) in self.copies.items()}
