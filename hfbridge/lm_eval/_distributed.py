"""Data-parallel evaluation: one process per device, each with its own copy of the model.

lm-eval's evaluator does the splitting: it gives each rank every `world_size`-th document
(`lm.rank`, `lm.world_size`), pads the ranks' request lists to equal length with `all_gather`, and
collects the results on rank 0 with `gather_object`. An `HFBridgeLM` reads its rank and the number
of ranks from `torch.distributed` when a process group is initialised when it is built (as
`torchrun` or `accelerate launch` set up with `torch.distributed.init_process_group`), else it is
rank 0 of 1. The model is wherever the caller's code put it: build it on this rank's device
(`LOCAL_RANK`). HFLM does the same through `accelerate`'s `Accelerator`, which wraps the same
`torch.distributed` calls.

>>> rank_and_size()
(0, 1)
>>> all_gather(torch.tensor(3), 1).tolist()
3
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather", "barrier", "gather_object", "pad_to_longest_rank", "rank_and_size"]


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the number of ranks of the default process group, else `(0, 1)`."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
