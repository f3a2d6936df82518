"""The reference policy of KL terms for full fine-tuning: a frozen copy of the network, swapped in."""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from torch import nn

from omnialign.models.base import DiffusionPolicy


def swapped_network(policy: DiffusionPolicy, frozen: nn.Module) -> Callable[[], AbstractContextManager]:
    """A context factory under which `policy` computes with `frozen` instead of its trained network."""

    @contextmanager
    def reference() -> Iterator[None]:
        trained, policy.transformer = policy.transformer, frozen
        try:
            yield
        finally:
            policy.transformer = trained

    return reference
