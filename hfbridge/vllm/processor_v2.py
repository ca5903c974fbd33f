"""`HFBridgeLogitsProcessorV2`: hfbridge's chain inside vLLM's Model Runner V2, per request.

vLLM's V2 interface (`vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`) in four calls:
`validate_params` (the front end, per request: `_sampling_params.validate_params`, the V1 processor's
checks), `__init__` (once per worker: vLLM's request state, seed, tokenizer and eos; speculative
decoding noted), `add_request` (a request enters a recycled slot: `_slots.Slots.add_request`) and
`apply(logits, ctx)` (one step: `_slots.Slots.apply`). `apply_staged_writes` is vLLM's default:
nothing is staged, as the tokens are read from vLLM's own buffer. The semantics are the V1
processor's: V2 calls custom processors at the same place (after its logit bias, penalties, bad
words and grammar; before its temperature, min-p and top-k/top-p).

The V1 runner takes `HFBridgeLogitsProcessor` (`processor_v1`). So that naming this one there gives an
error that says so, the class is registered as a virtual subclass of V1's interface, and its
`__init__`, which V1 calls with a device instead of its request state, refuses it naming the right one.

>>> HFBridgeLogitsProcessorV2.validate_params(SamplingParams(extra_args={"hfbridge": {"top_kk": 5}}))
Traceback (most recent call last):
...
ValueError: `top_kk` is not an hfbridge option vLLM requests take. Did you mean `top_k`? ...
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm import SamplingParams
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor, LogitsProcRequestState

from hfbridge.vllm._requests import engine_settings, register_with
from hfbridge.vllm._sampling_params import validate_params
from hfbridge.vllm._slots import SPECULATIVE, Slots

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

WRONG_RUNNER = (
    "`hfbridge.vllm.HFBridgeLogitsProcessorV2` is the processor for vLLM's Model Runner V2, and this engine runs "
    "the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0, or no Triton, as on vLLM's CPU build). Name "
    "`hfbridge.vllm:HFBridgeLogitsProcessor` instead (`LLM(logits_processors=[HFBridgeLogitsProcessor])`, "
    "`vllm serve --logits-processors hfbridge.vllm:HFBridgeLogitsProcessor`).")


class HFBridgeLogitsProcessorV2(LogitsProcessor):
    """hfbridge's samplers and HF's processors for the vLLM requests that ask for them (Model Runner V2).

    Pass the class (or `"hfbridge.vllm:HFBridgeLogitsProcessorV2"`) as `LLM(logits_processors=[...])`
    or `vllm serve --logits-processors`; requests name their options in
    `SamplingParams(extra_args={"hfbridge": {...}})`, with the same checks and the same meaning as
    `HFBridgeLogitsProcessor` (the V1 runner's). Under speculative decoding a request with options is
    ended at its first step and the worker logs why. See `docs/vllm.md`.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Check a request's hfbridge options before it runs; the error names the option.

        Raises:
            ValueError: for every refusal (vLLM answers it with HTTP 400).
        """
        validate_params(sampling_params)

    def __init__(self, vllm_config: VllmConfig, req_states: LogitsProcRequestState, *v1_arguments: Any):
        if v1_arguments or not hasattr(req_states, "all_token_ids"):  # the V1 runner: (config, device, pin)
            raise TypeError(WRONG_RUNNER)
        refuse = None
        if getattr(vllm_config, "speculative_config", None) is not None:
            refuse = SPECULATIVE
            logger.warning("hfbridge: this engine decodes speculatively; requests with hfbridge options will be "
                           "ended at their first step.")
        self._slots = Slots(req_states, refuse=refuse, **engine_settings(vllm_config))

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """A request enters slot `req_idx`; whether its logits are hfbridge's to process."""
        return self._slots.add_request(req_idx, sampling_params)

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        """hfbridge's scores for the rows whose requests have options; the other rows untouched."""
        return self._slots.apply(logits, ctx)


register_with("vllm.v1.sample.logits_processor", HFBridgeLogitsProcessorV2)
