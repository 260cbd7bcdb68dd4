"""Where training runs: the process group (one process, or `torchrun`'s N), the device
of each process, and the autocast precision."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "DistInfo":
        """Join the process group when launched by torchrun (WORLD_SIZE > 1)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not torch_dist.is_initialized():
            torch_dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        return cls(torch_dist.get_rank(), world)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch_dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        if self.world_size > 1:
            torch_dist.barrier()

    def close(self) -> None:
        """Leave the process group. A gloo group left to the interpreter's exit can abort
        the process after its work is done ("terminate called without an active
        exception"), failing a finished run."""
        if self.world_size > 1 and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def device_for(dist: DistInfo) -> str:
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', dist.rank))}"
    return "cpu"


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """bf16 autocast on CUDA and on CPUs with native bf16 (avx512_bf16/AMX), fp32
    elsewhere. Measured on a 2-core EPYC with avx512_bf16 (dspark, 4 sequence visits x
    64 blocks x 7 positions, draft vocabulary 8k, one thread, another job on the other
    core): fp32 3.8 s/step, bf16 autocast 2.5 s/step, the same losses to two digits. Master weights, optimizer
    state and the loss stay fp32. `--precision fp32|bf16` forces either."""
    if precision == "fp32":
        return None
    if precision == "bf16" or device.startswith("cuda"):
        return torch.bfloat16
    from dspark.runtime.precision import cpu_has_bf16

    return torch.bfloat16 if cpu_has_bf16() else None
