"""Processes and devices: one process per device under torchrun; world size 1 without it.

The only module (with its siblings in engine/) that names device types.
"""

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
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
    """Join the process group (nccl on GPUs, gloo on CPUs) and pick this process's device.

    Under torchrun the group spans its processes; without it this process forms a group of one,
    so that FSDP2, checkpoints and reductions take the same code path at world size 1.
    """
    if torch.cuda.is_available():
        local_rank, visible = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= visible:
            raise RuntimeError(
                f"process {local_rank} of this node has no GPU of its own ({visible} visible): start at most "
                f"{visible} per node (torchrun --nproc-per-node {visible}), or hide the GPUs (CUDA_VISIBLE_DEVICES=) "
                "to run on the CPU"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        device_id = device if device.type == "cuda" else None  # NCCL's communicator bound to this rank's GPU
        if "RANK" in os.environ:
            dist.init_process_group(backend, device_id=device_id)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id)
    return World(dist.get_rank(), dist.get_world_size(), device)


def all_gather(tensor: torch.Tensor, every: int = 1) -> torch.Tensor:
    """Concatenate equally shaped tensors of every rank along dim 0 (rank order). With `every`=N, those of ranks
    0, N, 2N, ... only: the first of each sequence-parallel group, whose N ranks hold the same samples."""
    if dist.get_world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts[::every])


def all_gather_list(items: list, every: int = 1) -> list:
    """Concatenate picklable lists of every rank (rank order); of every `every`-th rank only, as `all_gather`."""
    if dist.get_world_size() == 1:
        return items
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [item for part in parts[::every] for item in part]


def mean_across(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (one all-reduce)."""
    if dist.get_world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return tensor


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextmanager
def deterministic(enabled: bool) -> Iterator[None]:
    """Deterministic kernels while the context lasts (`trainer.deterministic`), the previous settings restored after:
    PyTorch's deterministic algorithms (an op that has none raises, naming itself; cuDNN's attention is then never
    picked), cuDNN's deterministic convolutions without benchmarking, and the cuBLAS workspace that determinism needs
    (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set). New tensors are not filled with NaN first (PyTorch's debugging aid
    in this mode, an extra kernel per allocation): a read of memory nothing wrote would show as two runs that
    differ. With the seeds of the run this makes the same config give the same numbers on the same device and
    software (docs/engine.md)."""
    if not enabled:
        yield
        return
    fill = torch.utils.deterministic
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, fill.fill_uninitialized_memory,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))  # fmt: skip
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    fill.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
        fill.fill_uninitialized_memory = saved[4]
        if saved[5] is None:
            del os.environ["CUBLAS_WORKSPACE_CONFIG"]


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
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def synchronizer(device: torch.device):
    """A function that waits for the device's queued work (for honest phase timings)."""
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None
