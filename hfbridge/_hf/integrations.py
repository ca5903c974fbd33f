"""transformers' tests for a sharded model (DeepSpeed ZeRO-3, FSDP), which decide `synced_gpus`.

HF's `generate` turns `synced_gpus` on when `is_deepspeed_zero3_enabled()` or
`is_fsdp_managed_module(model)` holds; hfbridge asks the same functions of the installed version.

>>> import torch
>>> is_sharded(torch.nn.Linear(2, 2))
False
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["is_sharded"]


def is_sharded(model: Any) -> bool:
    """HF's test: DeepSpeed ZeRO-3 enabled, or `model` managed by FSDP."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        return True
    if not isinstance(model, torch.nn.Module) or not torch.distributed.is_available():
        return False
    from transformers.integrations.fsdp import is_fsdp_managed_module

    return bool(is_fsdp_managed_module(model))
