"""Contexts under which a policy computes as another one, and the reference policy of full fine-tuning:
a frozen copy of the network, swapped in."""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from torch import nn

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
