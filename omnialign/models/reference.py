"""The reference policy of KL terms: a frozen copy of the trained network, swapped in on demand."""

import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from omnialign.models.base import DiffusionPolicy


def frozen_reference(policy: DiffusionPolicy) -> Callable[[], AbstractContextManager]:
    """A context factory under which `policy` computes with a frozen copy of its current network."""
    frozen = copy.deepcopy(policy.transformer).requires_grad_(False).eval()

    @contextmanager
    def reference() -> Iterator[None]:
        trained, policy.transformer = policy.transformer, frozen
        try:
            yield
        finally:
            policy.transformer = trained

    return reference
