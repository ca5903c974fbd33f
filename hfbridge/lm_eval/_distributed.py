"""Data-parallel evaluation: one process per device, each with its own copy of the model.

lm-eval's evaluator does the splitting: it gives each rank every `world_size`-th document
(`lm.rank`, `lm.world_size`), pads the ranks' request lists to equal length with `all_gather`, and
collects the results on rank 0 with `gather_object`. An `HFBridgeLM` reads its rank and the number
of ranks from `torch.distributed` when it is built: from the default process group, which it starts
itself under a launcher (`torchrun`, `accelerate launch`) when the caller has not, else it is rank 0
of 1. A model built from a `model_args` string is moved to this rank's GPU (`cuda:LOCAL_RANK`); a
model object stays where the caller put it. HFLM does the same through `accelerate`'s
`Accelerator`, which wraps the same `torch.distributed` calls.

>>> rank_and_size()
(0, 1)
>>> all_gather(torch.tensor(3), 1).tolist()
3
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather", "barrier", "gather_object", "local_rank", "pad_to_longest_rank", "rank_and_size",
           "rank_device"]


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the number of ranks of the default process group, else `(0, 1)`.

    Under a launcher (`torchrun`, `accelerate launch`: `WORLD_SIZE` > 1 in the environment) without a
    process group yet, it starts one from the launcher's variables, as `accelerate`'s `Accelerator`
    does for HFLM: NCCL when CUDA is available, else gloo.
    """
    if not dist.is_available():
        return 0, 1
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank())
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_rank() -> int:
    """This process's rank on its machine (the launcher's `LOCAL_RANK`), which picks its GPU."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(requested: torch.device | None, world_size: int) -> torch.device | None:
    """With several ranks, a CUDA device is this rank's GPU, `cuda:LOCAL_RANK` (HFLM's accelerate
    does the same to lm-eval's default `--device cuda:0`); else `requested`."""
    if world_size > 1 and requested is not None and requested.type == "cuda":
        return torch.device("cuda", local_rank())
    return requested


def all_gather(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's `tensor`, concatenated along the first axis (a 0-d tensor counts as one element)."""
    if world_size <= 1:
        return tensor
    tensor = tensor[None] if tensor.ndim == 0 else tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def gather_object(obj: Any, rank: int, world_size: int, dst: int = 0) -> list[Any] | None:
    """Every rank's `obj` on rank `dst` (a list, in rank order); None on the other ranks."""
    if world_size <= 1:
        return [obj]
    gathered: list[Any] | None = [None] * world_size if rank == dst else None
    dist.gather_object(obj, gathered, dst=dst)
    return gathered


def barrier(world_size: int) -> None:
    """Wait until every rank gets here."""
    if world_size > 1:
        dist.barrier()


def pad_to_longest_rank(lm: Any, items: list[Any]) -> int:
    """Repeat `items[0]` until every rank holds as many items as the longest; the number appended.

    HFLM pads the rolling windows so that ranks make the same number of calls (collective calls
    inside a model under FSDP or tensor parallelism must match); the copies' scores are dropped.
    """
    if lm.world_size <= 1:
        return 0
    counts = all_gather(torch.tensor(len(items), device=lm.device), lm.world_size).tolist()
    missing = max(counts) - counts[lm.rank]
    items.extend([items[0]] * missing if items else [])
    return missing if items else 0
