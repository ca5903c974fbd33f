"""`synced_gpus`: ranks of `torch.distributed` that decode in lockstep, as HF's loops do.

Under DeepSpeed ZeRO-3 or FSDP every rank holds a shard of the weights, and each forward pass
gathers the shards with collectives that all ranks must join. A rank whose rows are finished must
therefore keep calling its model (its outputs thrown away) until every rank is finished, or the
others wait forever. HF's `_sample` does this when `synced_gpus` is on; each step the ranks sum a
"still running" flag with `all_reduce` and stop together when it is zero.

HF's default (`synced_gpus=None`, transformers 4.46 to 5.x): on when DeepSpeed ZeRO-3 is enabled or
the model is managed by FSDP, and the process group has more than one rank. `resolve` applies the
same rule, with HF's own detection functions, to the model inside the adapter.
"""

from __future__ import annotations

from typing import Any

import torch

from hfbridge._hf.integrations import is_sharded


def world_size() -> int:
    """Ranks in the default process group; 1 when `torch.distributed` is unavailable or not initialised."""
    distributed = torch.distributed
    if not distributed.is_available() or not distributed.is_initialized():
        return 1
    return distributed.get_world_size()


def resolve(synced_gpus: Any, model: Any) -> bool:
    """The `synced_gpus` a `generate` call runs with: the caller's bool, or HF's default for None.

    Raises:
        TypeError: `synced_gpus` is not a bool or None.
        ValueError: `synced_gpus=True` without an initialised process group.

    >>> resolve(None, lambda ids: ids), resolve(False, None)
    (False, False)
    """
    if synced_gpus is not None and not isinstance(synced_gpus, bool):
        raise TypeError(f"`synced_gpus` must be True, False or None (HF's default), got {synced_gpus!r}.")
    if synced_gpus is None:
        return _sharded(model) and world_size() > 1
    if synced_gpus and world_size() == 1 and not _initialised():
        raise ValueError(
            "`synced_gpus=True` keeps the ranks of torch.distributed in lockstep, but no process group is "
            "initialised; call torch.distributed.init_process_group(...) first, or drop synced_gpus."
        )
    return synced_gpus


def _initialised() -> bool:
    distributed = torch.distributed
    return distributed.is_available() and distributed.is_initialized()


def _sharded(model: Any) -> bool:
    """HF's test: DeepSpeed ZeRO-3 enabled, or the model managed by FSDP (HF's own functions)."""
    return is_sharded(model)


def sum_over_ranks(flag: torch.Tensor) -> torch.Tensor:
    """`flag` (0-d bool: this rank still has unfinished rows) summed over all ranks, as a 0-d int tensor.

    Runs on the flag's device, as HF's `_has_unfinished_sequences` (gloo: CPU, NCCL: CUDA).
    """
    total = flag.to(torch.int32).reshape(1)  # a fresh tensor: all_reduce works in place
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
    return total[0]
