"""The target and the draft model as HF's `_assisted_decoding` sees them.

HF's assisted loop asks its model for little: `prepare_inputs_for_generation`, a call whose output
has `.logits` for every position fed and a `.past_key_values` it can measure and `crop`, and
`_update_model_kwargs_for_generation`. `TargetHost` is `LoopHost` (the host beam search runs on)
with the two differences assisted decoding needs: a call returns the logits of all positions it
fed (the draft tokens are checked in one call), and the cache HF sees can be cropped.

HF's `AssistedCandidateGenerator` drafts by calling `assistant_model.generate(...)` and carrying
its `past_key_values` from one call to the next. `DraftHost` is that assistant: its `generate` is
hfbridge's own loop (`call.prepare` + `loop.decode`, which equals HF's `_sample`) on the draft's adapter,
resumed from the state the previous draft left and HF cropped, so the draft can be any model form.

>>> import torch
>>> from hfbridge import generate
>>> table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
>>> target, draft = (lambda ids: table[ids]), (lambda ids: table[ids] + 0.5 * table[ids].flip(-1))
>>> prompt = torch.tensor([[1, 2]])
>>> torch.equal(generate(target, prompt, assistant_model=draft, max_new_tokens=6),
...             generate(target, prompt, max_new_tokens=6))      # greedy: the target's tokens, whatever the draft
True
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from einops import rearrange
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.modeling_outputs import CausalLMOutputWithPast

from hfbridge._generate.call import prepare as _prepare
from hfbridge._generate.hf_loops.loop_stand_in import LoopHost
from hfbridge._generate.loop import LoopOptions, forward_and_update
from hfbridge._generate.loop import decode as _decode
from hfbridge._generate.options import GenerateOptions
from hfbridge._hf import names
from hfbridge._hf.caches import CacheBase
from hfbridge._hf.contracts import check_crop_amount, check_cropped, check_handed_back
from hfbridge._hf.loops import candidate_generator, is_prompt_lookup, prepare_prompt_lookup
from hfbridge._hf.outputs import decoder_output, model_output
from hfbridge._hf.stand_in import AssistantStandIn, fresh_config
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.callables import AdapterTypeError, checked_state
from hfbridge._step.checks.step_errors import add_note, at_step
from hfbridge._step.plan.community_options import OPTIONS as COMMUNITY_OPTIONS
from hfbridge._step.run.layout import Layout
from hfbridge._step.run.sampler import Sampler, extract_logits
from hfbridge._step.run.stateful_members import stateful_members


class Rollback(CacheBase):
    """A model's cache as HF's assisted loop sees it: its length and `crop`, delegated to `owner`.

    `owner` (a `TargetHost` or a `DraftState`) has `fed`, the positions the model holds, and
    `crop(length)`. HF only measures and crops this object; transformers 4.x checks
    `isinstance(cache, DynamicCache)` first, hence the base class (whose own storage stays unused).
    """

    def __init__(self, owner: Any):
        super().__init__()
        self.owner = owner

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return int(self.owner.fed)

    def activate_past_recording(self) -> None:
        """transformers 5 asks caches to keep sliding-window states for rollback; the adapter's crop decides."""

    def crop(self, amount: int) -> None:
        amount = int(amount)  # 5.17's loop passes a 0-d tensor (its loop has read the matches already)
        check_crop_amount(amount)
        self.owner.crop(names.crop_keeps(self.owner.fed, amount))  # 4.x: a length; 5.x: minus the removed


def fed_logits(logits: torch.Tensor, *, layout: Any, vocab_size: int | Callable[[int], int | None] | None,
               rows: int, fed: int, role: str) -> torch.Tensor:
    """The logits of the last `fed` positions as float32 `(rows, fed, vocab)`, padded vocabulary dropped.

    `vocab_size` is the columns to keep, or a function of the logits' width that says it (`Sampler.vocab_limit`).

    Raises `ValueError` for logits without a sequence axis, too few positions or rows, or NaN.
    """
    parsed = Layout.for_tensor(logits, layout)
    parsed.check(logits)
    where = f"the {role} model returned logits of shape {tuple(logits.shape)} (layout {parsed.pattern!r})"
    if not parsed.has_seq or len(parsed.batch_axes) != 1:
        raise ValueError(
            f"{where}; assisted and prompt-lookup decoding check several tokens in one call, so they need one "
            "batch axis and a sequence axis, e.g. 'b t v'."
        )
    full = rearrange(logits, f"{parsed.pattern} -> {parsed.batch_axes[0]} t v")  # [B, T, V]
    if full.shape[0] != rows or full.shape[1] < fed:
        raise ValueError(
            f"{where}, expected {rows} row(s) and the logits of all {fed} positions fed in this call: assisted "
            "and prompt-lookup decoding check several draft tokens at once (do not keep only the last position, "
            "e.g. no logits_to_keep=1)."
        )
    full = full[:, full.shape[1] - fed:]  # [B, fed, V]
    if callable(vocab_size):
        vocab_size = vocab_size(full.shape[-1])
    if vocab_size is not None:
        if full.shape[-1] < vocab_size:
            raise ValueError(f"{where}, fewer vocabulary columns than `vocab_size`={vocab_size}.")
        full = full[..., :vocab_size]
    if bool(torch.isnan(full).any()):
        raise ValueError(f"{where}, which contain NaN; check the model's forward pass (overflow in fp16?).")
    return full.float()


class TargetHost(LoopHost):
    """The target model as HF's `_assisted_decoding` sees it: a `LoopHost` whose calls return every
    fed position's logits, with a cache HF can crop.

    Args:
        adapter: The target's adapter (its `start` already called: `state` is its state).
        state: The adapter's state.
        sampler: The call's `Sampler` (its layout and vocabulary size read the logits).
        device: The device of `input_ids`.
        prompt_length: The prompt's length in tokens.

    Before each call after which the processors run again, stateful processors are rolled back to
    the sequence accepted so far (`rollback(lengths)`): they forget the rejected draft tokens, and
    the candidates HF's prompt lookup screened with them. After a rejected draft token the last
    accepted token is the target's own, which the processors never saw: they go back to the length
    before it (the last one whose tokens they saw and kept) and that call is replayed on the target's
    logits there (`_replay_kept`), so that the next call continues it with the target's token.
    """

    def __init__(self, adapter: ModelAdapter, state: dict[str, Any], sampler: Sampler, *, device: torch.device,
                 prompt_length: int = 0):
        super().__init__(adapter, state, sampler, prompts=1, rows_per_prompt=1, rows_name="num_return_sequences",
                         device=device)
        self.prompt_length = prompt_length
        self.accepted: int | None = None  # the accepted sequence's length, as the last round began
        self.config = fresh_config()  # a private one: HF's prompt lookup reads `vocab_size` from it
        self.cache_handle = cast(Any, Rollback(self))  # in place of LoopHost's, which only reorders
        self.seen: torch.Tensor | None = None  # the ids of the last call (`contracts.check_cropped`)
        self.lookup: Any = None  # HF's prompt-lookup generator, when that is the strategy
        self.draft: DraftHost | None = None  # the assistant, when a draft model is the strategy
        self.probe_vocab: Callable[[], int] | None = None  # the target's logits width from a call on the prompt
        self.do_sample = False
        # stateful processors only: the round's first length and its logits `[1, n, V]` (lengths first..first + n - 1)
        self.round_logits: tuple[int, torch.Tensor] | None = None

    def crop(self, length: int) -> None:
        """Forget every position from `length` on (the rejected draft tokens)."""
        if length < self.fed:
            self.state = cropped(self.adapter, self.state, length, f"after step {self.step - 1}")
            self.fed = length

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 **ignored: Any) -> CausalLMOutputWithPast:
        """One model call: the tokens the model has not seen in, `(1, fed, vocab)` float32 logits out."""
        check_cropped(role="target", kept=self.fed, seen=self.seen, input_ids=input_ids,
                      output_name=names.OUTPUT_CACHE)
        step, fed = self.step, input_ids.shape[1] - self.fed
        self.seen = input_ids
        if self.stateful:  # the accepted sequence: the prompt, then one token past what the model holds
            self._rollback(self.accepted if self.accepted is not None else
                           self.prompt_length if step == 0 else self.fed + 1)
        self.state["attention_mask"] = attention_mask if attention_mask is not None else input_ids.new_ones(
            input_ids.shape)
        try:
            outputs, self.state = forward_and_update(
                self.adapter, input_ids, self.state, step,
                f"{input_ids.shape[1]} tokens so far, {fed} of them fed in this call",
                check=self.adapter.check_crop if step == 0 else None)
        except Exception as error:
            if step == 0:
                self._check_draft_vocab(error)  # a draft token past the target's vocabulary fails inside it
            raise
        logits = at_step(step, lambda: fed_logits(
            extract_logits(self.adapter.logits(outputs)), layout=self.sampler.layout,
            vocab_size=self.sampler.vocab_limit, rows=input_ids.shape[0], fed=fed, role="target"))
        logits = logits.to(input_ids.device)  # [1, fed, V]
        self._check_vocab(logits, input_ids, step)
        if self.stateful:  # HF's loop writes the processed scores into these logits: a copy for `_replay_kept`
            first = self.accepted if self.accepted is not None else self.prompt_length
            self.round_logits = (first, logits[:, first - input_ids.shape[1] - 1:].clone())
        self.fed = input_ids.shape[1]
        self.step += 1
        return model_output(logits=logits, cache=self.cache_handle)

    def _check_vocab(self, logits: torch.Tensor, input_ids: torch.Tensor, step: int) -> None:
        if self.vocab is None:
            self.vocab = logits.shape[-1]
            at_step(step, lambda: self.sampler.input_rows(input_ids, logits[:, -1]))  # prompt ids in the vocabulary
        elif logits.shape[-1] != self.vocab:
            raise ValueError(
                f"generate(): at step {step} the model returned logits with {logits.shape[-1]} vocabulary columns, "
                f"but {self.vocab} at step 0; the vocabulary size must stay the same."
            )
        if self.lookup is not None:
            prepare_prompt_lookup(self.lookup, device=self.device, vocab=self.vocab)
        self._check_draft_vocab()

    def _check_draft_vocab(self, error: Exception | None = None) -> None:
        """Refuse an assistant with another vocabulary, as HF's generate refuses one with another vocab_size.

        After `error` (the target's first call failed), the target's width is read from one call on
        the prompt alone: a draft with a larger vocabulary proposes ids the target cannot embed.
        """
        draft_vocab = None if self.draft is None else self.draft.vocab
        vocab = self.vocab
        if error is not None and draft_vocab is not None and self.probe_vocab is not None:
            try:
                vocab = self.probe_vocab()
            except Exception:  # the prompt alone fails too: the error is the model's own
                return
        if draft_vocab is None or vocab is None or draft_vocab == vocab:
            return
        why = ("speculative sampling compares their distributions token by token, so both must cover the same "
               "vocabulary" if self.do_sample else
               "the target checks the draft's token ids, so both must have one vocabulary (HF's generate refuses "
               "an assistant with another vocab_size)")
        raise ValueError(
            f"generate(): the assistant's logits have {draft_vocab} vocabulary columns and the target's {vocab}; "
            f"{why} (pass vocab_size= to drop padded columns)."
        ) from error

    def _rollback(self, length: int) -> None:
        """Stateful processors back to a sequence of `length` tokens (the one batch row)."""
        self.stateful.rollback(torch.full((1,), length, dtype=torch.long, device=self.device))

    def _replay_kept(self, input_ids: torch.Tensor) -> None:
        """Stateful processors back to the accepted sequence `input_ids` `(1, n)`, as a new round begins.

        The last round ran the processors on each candidate length. When a draft token was rejected, the
        last accepted token (the target's own) differs from the candidate they saw at that length: they
        go back to `n - 1` tokens, all of which they saw and kept, and the call at `n - 1` is made again
        on the target's logits there (the same call as in the round, with the global RNG restored after
        it: a sampler that draws, such as XTC, leaves the draws of the run as they were). Its state and
        distribution are then the ones the next call at `n` continues, as in a plain loop.
        """
        length, kept = input_ids.shape[1], self.round_logits
        first, logits = kept if kept is not None else (0, None)
        if logits is None or not first < length <= first + logits.shape[1] - 1:
            self._rollback(length)  # the first round, or every draft token accepted: nothing they saw is wrong
            return
        self._rollback(length - 1)
        scores = logits[:, length - 1 - first].clone()  # [1, V] the target's logits after `length - 1` tokens
        devices = [] if scores.device.type == "cpu" else [scores.device]
        with torch.random.fork_rng(devices=devices, device_type=scores.device.type):
            self.sampler.processors(cast(torch.LongTensor, input_ids[:, :length - 1]), scores)

    def _get_candidate_generator(self, *args: Any, **kwargs: Any) -> Any:
        generator: Any = candidate_generator(self, *args, **kwargs)  # HF's choice
        if is_prompt_lookup(generator):
            self.lookup = generator
            prepare_prompt_lookup(generator, device=self.device, vocab=self.vocab)
        if self.stateful:  # each round starts from the accepted sequence HF hands the candidate generator
            get_candidates = generator.get_candidates

            def from_accepted(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                self.accepted = input_ids.shape[1]
                self._replay_kept(input_ids)  # HF's prompt lookup screens candidates with the processors
                return get_candidates(input_ids, *args, **kwargs)

            generator.get_candidates = from_accepted
        return generator


class DraftState:
    """The draft model's state between two drafts, and how many positions it holds."""

    def __init__(self, adapter: ModelAdapter, state: dict[str, Any]):
        self.adapter, self.state = adapter, state
        self.fed = 0
        self.seen: torch.Tensor | None = None  # the sequence of the last draft

    def crop(self, length: int) -> None:
        if length < self.fed:
            self.state = cropped(self.adapter, self.state, length, "in the assistant model")
            self.fed = length


def cropped(adapter: ModelAdapter, state: dict[str, Any], length: int, where: str) -> dict[str, Any]:
    """`adapter.crop(state, length)`, its result checked; a hook's wrong result names `where` it happened."""
    try:
        return checked_state(adapter.crop(state, length), adapter, "crop")
    except AdapterTypeError as error:
        raise TypeError(f"generate(): {where}, rolling back rejected draft tokens: {error}") from None


class DraftHost(AssistantStandIn):
    """The draft model as HF's `AssistedCandidateGenerator` sees it: a `generate` that is hfbridge's.

    Args:
        adapter: The draft's adapter.
        device: The device of `input_ids`.
        generation_config: Where HF reads the draft options (`num_assistant_tokens`, ...).
        layout: The logits' layout, as for the target.
        vocab_size: The real vocabulary when the logits are padded, as for the target.
        user_processors: The caller's own processors (`processors=`), to tell them from the target's
            option-built ones among those HF hands the draft (see `_processors`). Default: none.
        tokenizer: For the options that need one (DRY's string sequence breakers). Default: None.
    """

    def __init__(self, adapter: ModelAdapter, *, device: torch.device, generation_config: GenerationConfig,
                 layout: Any, vocab_size: int | None, user_processors: Any = (), tokenizer: Any = None):
        self.adapter = adapter
        self.user_processors = list(user_processors)
        self.tokenizer = tokenizer
        self.device = device
        self.generation_config = generation_config
        self.config = fresh_config()
        self.layout, self.vocab_size = layout, vocab_size
        self.vocab: int | None = None  # logits width, once it has drafted
        self.drafts = 0  # generate calls so far

    def generate(self, input_ids: torch.Tensor, *, generation_config: GenerationConfig,
                 logits_processor: Any = None, min_new_tokens: int | None = None, max_new_tokens: int | None = None,
                 attention_mask: torch.Tensor | None = None, use_cache: Any = None,
                 **model_inputs: Any) -> GenerateDecoderOnlyOutput:
        """Draft up to `max_new_tokens` tokens after `input_ids` `(1, seq)`, as HF's `generate` would.

        HF passes the draft's cache from the previous draft as `names.LOOP_CACHE` (checked: a release
        that hands it back under another name raises instead of drafting from a stale cache).
        """
        cache = model_inputs.pop(names.LOOP_CACHE, None)
        stray = [name for name, value in model_inputs.items() if isinstance(value, Rollback)]
        check_handed_back(drafts=self.drafts, handed_back=isinstance(cache, Rollback), stray=stray,
                          cache_name=names.LOOP_CACHE)
        self.drafts += 1
        # the lengths go into the config, not beside it (HF 5.x deprecates a config together with options)
        config = copy.deepcopy(generation_config)
        config.max_new_tokens = max_new_tokens
        if min_new_tokens:
            config.min_new_tokens = min_new_tokens
        call = _prepare(self.adapter, input_ids, GenerateOptions(
            attention_mask=attention_mask, generation_config=config,
            processors=self._processors(logits_processor, config),
            layout=self.layout, vocab_size=self.vocab_size, tokenizer=self.tokenizer, kwargs=dict(model_inputs)))
        if isinstance(cache, Rollback):  # resume where the last draft stopped (HF cropped it)
            draft = cache.owner
            check_cropped(role="assistant", kept=draft.fed, seen=draft.seen, input_ids=input_ids,
                          output_name=names.OUTPUT_CACHE)
            call.state = draft.state
        else:
            draft = DraftState(self.adapter, call.state)
        try:
            _decode(self.adapter, call, None, None, LoopOptions())
        except Exception as error:
            add_note(error, f"hfbridge.generate: raised while the assistant model drafted after "
                             f"{input_ids.shape[1]} tokens.")
            raise
        if call.scores:
            self.vocab = call.scores[0].shape[-1]
        draft.state = call.state
        draft.fed = call.sequences.shape[1] - 1  # the last drafted token was never fed
        draft.seen = call.sequences
        return decoder_output(sequences=call.sequences, scores=call.scores, cache=Rollback(draft))

    def _processors(self, handed: Any, config: GenerationConfig) -> LogitsProcessorList:
        """The processors HF hands the draft, as HF's assistant merges them with the ones it builds.

        transformers 5 hands the target's whole list (4.x the caller's own processors). The options of
        `hfbridge.processors`' samplers ride the config, so the draft would build those processors a
        second time beside the target's instances: they are taken off `config` (in place) when HF
        handed more than the caller's own. A stateful processor is copied, with the target's state at
        this draft, so that drafting never moves the target's state.
        """
        handed = list(handed or [])
        if any(not any(p is own for own in self.user_processors) for p in handed):
            for name in COMMUNITY_OPTIONS:
                if getattr(config, name, None) is not None:
                    setattr(config, name, None)
        stateful = stateful_members(handed)
        result = LogitsProcessorList()
        for processor in handed:
            if any(processor is one for one in stateful):
                try:
                    processor = copy.deepcopy(processor)  # the target's state now, moved by this draft only
                except Exception:
                    continue
            result.append(processor)
        return result
