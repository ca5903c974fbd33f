"""A host on which transformers' own decoding loops run with an hfbridge model adapter as the model.

HF's loops (`_beam_search`; later `_assisted_decoding`) touch the model only through a few methods:
`prepare_inputs_for_generation` (the call's keyword arguments), the call itself (returning an
output with `.logits`), `_update_model_kwargs_for_generation` (carry the cache and the mask
forward), `_prefill` (transformers 5: the first call) and the cache's own `reorder_cache` (beam
search). `LoopHost` implements the first three with the adapter, so that the installed HF's loop
runs unchanged (the BeamSearchScorer loop of 4.x and the vectorized one of 5.x alike) and its
results equal `model.generate` by construction.

What the host adds to each model call is what `generate` checks at every step: the logits are
extracted with the call's `Sampler` (any layout, padded vocabulary dropped, float32 copy), and a
wrong number of rows, NaN, or a vocabulary that changes size raise a `ValueError` naming the step.

For other strategies (assist): build a `LoopHost(adapter, call, rows_per_prompt=...)`, start with
`host.model_kwargs()` and call the HF loop on the host; the adapter's state lives in
`host.state`, and `host.cache_handle` is what HF sees as its cache (`model_kwargs[names.LOOP_CACHE]`:
`past_key_values`, or `cache` since transformers 5.24), reordered via the adapter's `reorder_cache`.
Before every model call after the first, the host checks that HF's beam loop reordered that handle
once since the call before (`contracts.check_reordered`): a release that stops doing so (as 5.24 did
for a cache under its old name) raises instead of continuing beams from the wrong cache rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import LogitsProcessorList
from transformers.modeling_outputs import CausalLMOutputWithPast

from hfbridge._generate.loop import forward_and_update
from hfbridge._generate.stateful_calls import Stateful
from hfbridge._hf import names
from hfbridge._hf.contracts import TransformersContractError, check_reordered
from hfbridge._hf.outputs import model_output
from hfbridge._hf.stand_in import ProcessorHost, fresh_config
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.callables import AdapterTypeError, checked_state
from hfbridge._step.checks.step_errors import add_note, at_step
from hfbridge._step.run.layout import Layout
from hfbridge._step.run.processor_list import BadProcessorOutput
from hfbridge._step.run.sampler import Sampler, extract_logits


class AdapterCache:
    """What HF's loops see as the model's cache: the adapter's state, reordered through the adapter.

    HF calls `reorder_cache(beam_idx)` on the cache object after every beam search step (5.x, and
    4.x for non-tuple caches); here that reorders whatever the adapter carries.
    """

    def __init__(self, host: LoopHost):
        self._host = host
        self.reorders = 0  # since the last model call (`contracts.check_reordered`)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        host = self._host
        self.reorders += 1
        try:
            host.state = checked_state(host.adapter.reorder_cache(host.state, beam_idx), host.adapter, "reorder_cache")
            if host.stateful:
                host.stateful.reorder(beam_idx)  # the processors' per-row state follows the beams too
        except AdapterTypeError as error:
            raise TypeError(f"generate(): after step {host.step - 1}: {error}") from None
        except Exception as error:
            add_note(error, f"hfbridge.generate: raised while reordering the cache for beam search after step "
                             f"{host.step - 1}.")
            raise

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens the model has seen (HF's `Cache.get_seq_length`); HF's prefill reads it."""
        return int(self._host.fed)


class StepProcessors(LogitsProcessorList):
    """The call's processors as HF's loop runs them: a processor's wrong output names the step.

    HF's loop calls the processors after the step's model call, so the step is the host's last one.
    """

    def __init__(self, processors: LogitsProcessorList, host: LoopHost):
        super().__init__(processors)
        self._processors, self._host = processors, host

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        try:
            return self._processors(input_ids, scores, **kwargs)
        except BadProcessorOutput as error:
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(f"generate(): at step {self._host.step - 1}: {error}") from None


class LoopHost(ProcessorHost):
    """`GenerationMixin` with an hfbridge adapter as its model.

    Args:
        adapter: The model adapter (its `start` already called: `state` is its state).
        state: The adapter's state.
        sampler: The call's `Sampler`: its processors are the loop's, its `rows` extracts the logits.
        prompts: Prompts in the batch (for error messages).
        rows_per_prompt: Rows per prompt (`num_beams` for beam search).
        rows_name: What a row is, for error messages (e.g. "num_beams").
        device: The device of `input_ids`.
        on_step: Called after every model call (a progress bar's update). Default: None.
        min_vocab: The fewest vocabulary columns the loop can work with, and why (for the error).
            Default: `(1, "")`.
        lockstep: HF's loop runs with `synced_gpus`: once this rank is finished it still calls the
            model, with the same sequences and a mask one longer each time; the host then feeds the
            last token again for every extra mask column (the outputs are thrown away). Default: False.
        unconditional: Guidance's unconditional branch, whose negative prompt is checked against the
            vocabulary when the prompts are. Default: None.

    >>> import torch
    >>> from hfbridge import Recompute, Sampler
    >>> host = LoopHost(Recompute(lambda ids: torch.zeros(1, ids.shape[1], 5)), {}, Sampler(), prompts=1)
    >>> host(input_ids=torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 2, dtype=torch.long)).logits.shape
    torch.Size([1, 1, 5])
    """

    def __init__(self, adapter: ModelAdapter, state: dict[str, Any], sampler: Sampler, *, prompts: int,
                 rows_per_prompt: int = 1, rows_name: str = "num_beams", device: torch.device | None = None,
                 on_step: Callable[[], Any] | None = None, min_vocab: tuple[int, str] = (1, ""),
                 lockstep: bool = False, unconditional: Any = None):
        super().__init__(device=device)
        self.config = fresh_config()  # its own: `prefill_early` sets its vocab_size
        self.adapter = adapter
        self.state = state
        self.sampler = sampler
        self.prompts = prompts
        self.rows_per_prompt = rows_per_prompt
        self.rows_name = rows_name
        self.on_step = on_step
        self.min_vocab, self.min_vocab_reason = min_vocab
        self.lockstep = lockstep
        self.unconditional = unconditional
        self.stateful = Stateful(sampler)  # the protocol's calls (`_generate/stateful_calls.py`)
        self.step = 0  # model calls so far; step 0 is the prompt's forward pass
        self.fed = 0  # tokens of the sequence the model has seen
        self.vocab: int | None = None
        self.cache_handle = AdapterCache(self)
        self.early: tuple[torch.Size, CausalLMOutputWithPast] | None = None  # see `prefill_early`

    def prefill_early(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Make the prompt's model call now, so that `config.vocab_size` is known before HF's loop starts.

        transformers 4.50 to 5.x's beam loop reads `config.vocab_size` before its first model call; a
        callable has no config, so the width of the logits is read from this call, whose output is
        returned to HF's first call of the loop (the same prompt) instead of calling the model twice.
        """
        output = self(input_ids=input_ids, attention_mask=attention_mask)
        self.config.vocab_size = int(output.logits.shape[-1])  # type: ignore[union-attr]
        self.early = (input_ids.shape, output)

    def model_kwargs(self, attention_mask: torch.Tensor) -> dict[str, Any]:
        """The `**model_kwargs` to start an HF loop with: the mask, and `use_cache` (5.x reads it)."""
        return {"attention_mask": attention_mask, "use_cache": True}

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, *args: Any,
                                      **model_kwargs: Any) -> dict[str, Any]:
        # The adapter decides what the model is fed (all of it, or the tokens after its cache).
        return {"input_ids": input_ids, "attention_mask": model_kwargs.get("attention_mask")}

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 **ignored: Any) -> CausalLMOutputWithPast:
        """One model call through the adapter: `(rows, seq)` ids in, checked logits `(rows, 1, vocab)` out."""
        if self.early is not None:
            shape, output = self.early
            self.early = None
            if input_ids.shape == shape:  # HF's first call: the prompt, already run by `prefill_early`
                return output
            raise TransformersContractError(
                "beam-first-call", f"its first model call had ids of shape {tuple(input_ids.shape)}, but the prompt "
                                   f"(already run to read the vocabulary size) has {tuple(shape)}")
        step = self.step
        extra = self.lockstep and attention_mask is not None and attention_mask.shape[1] > input_ids.shape[1]
        if not extra:  # synced_gpus: HF's loop calls a finished rank's model without reordering
            check_reordered(step=step, reorders=self.cache_handle.reorders, cache_name=names.LOOP_CACHE)
        self.cache_handle.reorders = 0
        if attention_mask is not None:
            self.state["attention_mask"] = attention_mask
            if self.lockstep and attention_mask.shape[1] > input_ids.shape[1]:
                # synced_gpus, this rank finished: HF calls again with the same sequences (`_generate/lockstep.py`)
                repeats = attention_mask.shape[1] - input_ids.shape[1]
                input_ids = torch.cat([input_ids, input_ids[:, -1:].expand(-1, repeats)], dim=-1)
        outputs, self.state = forward_and_update(self.adapter, input_ids, self.state, step,
                                                 f"{input_ids.shape[1]} tokens so far")
        rows = self._rows(self.adapter.logits(outputs), input_ids, step)  # [N, V]
        self.fed = input_ids.shape[1]
        self.step += 1
        if self.on_step is not None:
            self.on_step()
        return model_output(logits=rows[:, None, :])  # [N, 1, V]

    def _update_model_kwargs_for_generation(self, outputs: Any, model_kwargs: dict[str, Any],
                                            is_encoder_decoder: bool = False, num_new_tokens: int = 1,
                                            **ignored: Any) -> dict[str, Any]:
        model_kwargs[names.LOOP_CACHE] = self.cache_handle
        mask = model_kwargs.get("attention_mask")
        if mask is not None:
            model_kwargs["attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], num_new_tokens))], dim=-1)
        return model_kwargs

    def _rows(self, output: Any, input_ids: torch.Tensor, step: int) -> torch.Tensor:
        """The last-position logits as checked float32 rows `(rows, vocab)` on the device of `input_ids`."""
        logits = at_step(step, lambda: extract_logits(output))
        rows = at_step(step, lambda: self.sampler.rows(logits)).to(input_ids.device)  # [N, V]
        expected = input_ids.shape[0]
        if rows.shape[0] != expected:
            layout = Layout.for_tensor(logits, self.sampler.layout).pattern
            raise ValueError(
                f"generate(): at step {step} the model returned logits of shape {tuple(logits.shape)} (layout "
                f"{layout!r}), which give {rows.shape[0]} rows, expected {expected}: one per sequence "
                f"({self.prompts} prompts x {self.rows_name}={self.rows_per_prompt})."
            )
        if self.vocab is None:
            self.vocab = rows.shape[1]
            at_step(step, lambda: self.sampler.input_rows(input_ids, rows))  # prompt ids within the vocabulary
            if self.unconditional is not None:  # and the negative prompt's, before guidance feeds it
                at_step(step, lambda: self.unconditional.check_vocab(rows.shape[1], self.sampler.vocab_size))
            if rows.shape[1] < self.min_vocab:
                raise ValueError(
                    f"generate(): at step {step} the model returned logits with {rows.shape[1]} vocabulary columns, "
                    f"but {self.min_vocab_reason}."
                )
        elif rows.shape[1] != self.vocab:
            raise ValueError(
                f"generate(): at step {step} the model returned logits with {rows.shape[1]} vocabulary columns, "
                f"but {self.vocab} at step 0; the vocabulary size must stay the same."
            )
        return rows
