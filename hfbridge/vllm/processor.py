"""`HFBridgeLogitsProcessor`: hfbridge's chain inside vLLM's V1 engine, per request.

vLLM's interface (`vllm.v1.sample.logits_processor.LogitsProcessor`) in four calls, each handed to
the modules that own the work: `validate_params` (the front end, per request: `_options.check_request`),
`__init__` (once per worker: the model's vocabulary, device, seed, tokenizer and eos), `update_state`
(the batch's removed, added and moved rows: `_batch.Batch.update`) and `apply` (one step:
`_batch.Batch.apply`). `is_argmax_invariant` is False: hfbridge's options change greedy choices, and
vLLM skips argmax-invariant processors when a step is all greedy.

>>> HFBridgeLogitsProcessor.validate_params(SamplingParams(extra_args={"hfbridge": {"top_k": 0}}))
>>> HFBridgeLogitsProcessor.validate_params(SamplingParams(extra_args={"hfbridge": {"top_kk": 5}}))
Traceback (most recent call last):
...
ValueError: `top_kk` is not an hfbridge option vLLM requests take. Did you mean `top_k`? ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from hfbridge.vllm._batch import Batch
from hfbridge.vllm._options import check_request

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class HFBridgeLogitsProcessor(LogitsProcessor):
    """hfbridge's samplers and HF's processors for the vLLM requests that ask for them.

    Pass the class (or `"hfbridge.vllm:HFBridgeLogitsProcessor"`) as `LLM(logits_processors=[...])`
    or `vllm serve --logits-processors`; each request names its options in
    `SamplingParams(extra_args={"hfbridge": {...}})`. For such a request, hfbridge's chain (the one
    `Sampler` builds, in HF's order) produces the scores and vLLM draws from them: greedy when
    `SamplingParams.temperature` is 0, a draw from their softmax when it is 1. Requests without
    options are left as they are. See `docs/vllm.md`.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Check a request's hfbridge options before it runs; the error names the option.

        Raises:
            ValueError: for every refusal (hfbridge's `TypeError`s too, which vLLM would not turn
                into a client error, HTTP 400).
        """
        try:
            check_request(sampling_params)
        except TypeError as error:
            raise ValueError(str(error)) from None

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        model_config = vllm_config.model_config
        eos = getattr(model_config.hf_config, "eos_token_id", None)
        self._batch = Batch(vocab_size=model_config.get_vocab_size(), device=device,
                            seed=model_config.seed if model_config.seed is not None else 0,
                            tokenizer=lambda: _load_tokenizer(model_config),
                            default_eos=[] if eos is None else [eos] if isinstance(eos, int) else list(eos))

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


def _load_tokenizer(model_config: Any) -> Any:
    """The model's tokenizer, as transformers loads it (DRY's string breakers map through it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_config.tokenizer, revision=model_config.tokenizer_revision,
                                         trust_remote_code=model_config.trust_remote_code)
