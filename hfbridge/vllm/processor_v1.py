"""`HFBridgeLogitsProcessor`: hfbridge's chain inside vLLM's V1 model runner, per request.

vLLM's V1 interface (`vllm.v1.sample.logits_processor.LogitsProcessor`) in four calls, each handed to
the modules that own the work: `validate_params` (the front end, per request: `_sampling_params.validate_params`),
`__init__` (once per worker: the model's vocabulary, device, seed, tokenizer and eos), `update_state`
(the batch's removed, added and moved rows: `_batch.Batch.update`) and `apply` (one step:
`_batch.Batch.apply`). `is_argmax_invariant` is False: hfbridge's options change greedy choices, and
vLLM skips argmax-invariant processors when a step is all greedy.

Model Runner V2 takes another class, `HFBridgeLogitsProcessorV2` (`processor_v2`). So that naming
this one there gives an error that says so (vLLM's own says only that the class is not a V2
`LogitsProcessor`), the class is registered as a virtual subclass of V2's interface, and its
`__init__`, which V2 calls with its request state instead of a device, refuses it naming the right one.

>>> HFBridgeLogitsProcessor.validate_params(SamplingParams(extra_args={"hfbridge": {"top_k": 0}}))
>>> HFBridgeLogitsProcessor.validate_params(SamplingParams(extra_args={"hfbridge": {"top_kk": 5}}))
Traceback (most recent call last):
...
ValueError: `top_kk` is not an hfbridge option vLLM requests take. Did you mean `top_k`? ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from hfbridge.vllm._batch import Batch
from hfbridge.vllm._requests import engine_settings, register_with
from hfbridge.vllm._sampling_params import validate_params

if TYPE_CHECKING:
    from vllm.config import VllmConfig

WRONG_RUNNER = (
    "`hfbridge.vllm.HFBridgeLogitsProcessor` is the processor for vLLM's V1 model runner, and this engine runs "
    "Model Runner V2 (vLLM's default where Triton runs). Name `hfbridge.vllm:HFBridgeLogitsProcessorV2` instead "
    "(`LLM(logits_processors=[HFBridgeLogitsProcessorV2])`, `vllm serve --logits-processors "
    "hfbridge.vllm:HFBridgeLogitsProcessorV2`), or start vLLM with VLLM_USE_V2_MODEL_RUNNER=0 to keep this one.")


class HFBridgeLogitsProcessor(LogitsProcessor):
    """hfbridge's samplers and HF's processors for the vLLM requests that ask for them (V1 model runner).

    Pass the class (or `"hfbridge.vllm:HFBridgeLogitsProcessor"`) as `LLM(logits_processors=[...])`
    or `vllm serve --logits-processors`; each request names its options in
    `SamplingParams(extra_args={"hfbridge": {...}})`. For such a request, hfbridge's chain (the one
    `Sampler` builds, in HF's order) produces the scores and vLLM draws from them: greedy when
    `SamplingParams.temperature` is 0, a draw from their softmax when it is 1. Requests without
    options are left as they are. Model Runner V2 takes `HFBridgeLogitsProcessorV2`. See `docs/vllm.md`.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Check a request's hfbridge options before it runs; the error names the option.

        Raises:
            ValueError: for every refusal (hfbridge's `TypeError`s too, which vLLM would not turn
                into a client error, HTTP 400).
        """
        validate_params(sampling_params)

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool = False):
        if hasattr(device, "all_token_ids"):  # Model Runner V2 passes its `LogitsProcRequestState`
            raise TypeError(WRONG_RUNNER)
        self._batch = Batch(vocab_size=vllm_config.model_config.get_vocab_size(), device=device,
                            **engine_settings(vllm_config))

    def is_argmax_invariant(self) -> bool:
        """False: hfbridge's options change which token is best."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow vLLM's batch: requests removed, added (with their options) and moved."""
        if batch_update is None:
            return
        self._batch.update(removed=batch_update.removed, added=batch_update.added,
                           moved=[(a, b, direction == MoveDirectionality.SWAP)
                                  for a, b, direction in batch_update.moved])

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """hfbridge's scores for the rows whose requests have options; the other rows untouched."""
        return self._batch.apply(logits)


register_with("vllm.v1.worker.gpu.sample.logits_processor", HFBridgeLogitsProcessor)
