"""Processes and devices: one process per device under torchrun; world size 1 without it.

The only module (with its siblings in engine/) that names device types.
"""

import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init() -> World:
    """Join the process group when launched by torchrun (nccl on GPUs, gloo on CPUs); pick the device."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), device)
    return World(0, 1, device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def synchronizer(device: torch.device):
    """A function that waits for the device's queued work (for honest phase timings)."""
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None
