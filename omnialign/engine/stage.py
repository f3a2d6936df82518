"""Host-to-device staging of trajectory inputs, with an optional prefetch on a side stream, and `to_device`: a host
tensor to a GPU without waiting for the queued work.

`Stager.resident` copies a micro-batch's per-sample fields once; `Stager.steps` yields each
step's inputs on the device just in time. With `prefetch` (CUDA only), step k+1's inputs are
made contiguous, pinned and copied on a side stream while step k computes; the consumer's
stream waits for the copy before use and the memory is released when the consumer drops it.
"""

from collections.abc import Callable, Iterator
from typing import Any

import torch


def to_device(value: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """`value` on `device`; a host tensor goes to a GPU from pinned memory without waiting. A copy from pageable
    memory first waits for all the work queued on the device, so the host could not run ahead of it: in a loop that
    copies every step, the device would then wait for each step's launches."""
    if device is not None and torch.device(device).type == "cuda" and value.device.type == "cpu":
        return value.pin_memory().to(device, non_blocking=True)
    return value.to(device)


class Stager:
    def __init__(self, device: torch.device, prefetch: bool = False):
        self.device = device
        self.prefetch = prefetch and device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.prefetch else None

    def copy(self, name: str, value: Any) -> Any:
        """One field to the device (tensors and TensorDicts; None passes through)."""
        if value is None:
            return None
        if self.prefetch:
            return value.contiguous().pin_memory().to(self.device, non_blocking=True)
        return value.to(self.device)

    def resident(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {name: self.copy(name, value) for name, value in fields.items()}

    def steps(self, count: int, inputs_of: Callable[[int], dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The inputs of steps 0..count-1 on the device; `inputs_of(k)` gives step k's host tensors."""
        if not self.prefetch:
            for k in range(count):
                yield {name: self.copy(name, value) for name, value in inputs_of(k).items()}
            return
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            ahead = {name: self.copy(name, value) for name, value in inputs_of(0).items()}
        for k in range(count):
            compute.wait_stream(self.stream)
            current, ahead = ahead, None
            for value in current.values():
                value.record_stream(compute)  # memory made on the side stream, used on this one
            if k + 1 < count:
                with torch.cuda.stream(self.stream):
                    ahead = {name: self.copy(name, value) for name, value in inputs_of(k + 1).items()}
            yield current
            del current
