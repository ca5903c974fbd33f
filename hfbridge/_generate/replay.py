"""`replay`: the distribution each generated token was drawn from, recomputed by `generate`'s own step.

RL trainers sample with one engine and train with another; the importance ratio between them is right
only if the trainer knows the distribution each token was drawn from: after every processor, with the
chain's support. `replay` prepares the call exactly as `generate` does (`call.prepare`: the same config,
criteria and `Sampler`), then runs the step again over the recorded tokens (`replay_steps.py`), so its
`scores` are the generation's `output_scores`, bit for bit, for every option and sampler (stateful ones
replayed in order, XTC's coins drawn again from the generator). Three ways to get each step's logits:

- the model, called step by step through the same adapter and cache as `generate` (default: bit-exact);
- `teacher_forced=True`: one forward over the whole sequences, as a trainer computes them (the logits
  differ from cached decoding by float rounding: the scores and kept sets are those logits');
- `logits=`: the logits of every step, given (`generate`'s `output_logits`, or your engine's).

Banned strings roll rows back, and the rolled-back steps drew random numbers the sequences do not show:
`replay` runs the generation again with the generator (model form only) and checks that it made the same
sequences. Beam search and assisted decoding are refused: their scores are not one row's sampling
distribution.

>>> import torch
>>> from hfbridge import generate, replay
>>> table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
>>> options = dict(max_new_tokens=4, do_sample=True, top_p=0.8, repetition_penalty=1.3)
>>> out = generate(lambda ids: table[ids], torch.tensor([[1, 2]]), generator=torch.Generator().manual_seed(3),
...                return_dict_in_generate=True, output_scores=True, **options)
>>> r = replay(lambda ids: table[ids], out.sequences, prompt_length=2, **options)
>>> all(torch.equal(a, b) for a, b in zip(r.scores, out.scores)), r.logprobs.shape
(True, torch.Size([1, 4]))
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hfbridge._generate.call import prepare
from hfbridge._generate.finished import FinishedRows
from hfbridge._generate.loop import LoopOptions
from hfbridge._generate.loop import decode as loop_decode
from hfbridge._generate.options import GenerateOptions
from hfbridge._generate.replay_result import Replay
from hfbridge._generate.replay_steps import ReplayedSteps, given_logits, model_logits, replay_steps
from hfbridge._generate.stateful_calls import Stateful
from hfbridge._generate.strategies import STRATEGIES
from hfbridge._models.adapters import ModelAdapter, Recompute
from hfbridge._models.choose import as_adapter
from hfbridge._models.hf_model import HFModel
from hfbridge._step.checks.caller_inputs import extract_logits
from hfbridge._step.checks.option_checks import check_flag
from hfbridge._step.plan.community_options import OPTIONS as COMMUNITY_OPTIONS
from hfbridge._step.plan.hf_option_rows import length_options, output_only_options

__all__ = ["replay"]

_REPLAYED_MODES = ("greedy_search", "sample")
_NAMED = ("generation_config", "processors", "logits_processor", "stopping_criteria", "layout", "vocab_size", "fast",
          "max_context", "prefix_allowed_tokens_fn")


def replay(model: Callable[..., Any] | ModelAdapter | None, sequences: torch.Tensor, *,
           prompt_length: int | Sequence[int] | torch.Tensor | None = None,
           attention_mask: torch.Tensor | None = None, tokenizer: Any = None,
           generator: torch.Generator | Sequence[torch.Generator] | None = None,
           logits: Sequence[torch.Tensor] | torch.Tensor | None = None, teacher_forced: bool = False,
           **options: Any) -> Replay:
    """Recompute, for every generated token, the distribution `generate` drew it from.

    Args:
        model: Any form `generate` takes (a callable, an adapter, a transformers model), or None with `logits=`.
        sequences: `(rows, prompt + new)` token ids as `generate` returned them (prompts left-padded, finished
            rows filled with the pad token). Never modified.
        prompt_length: Where the new tokens start: an int (the prompt's columns), or one per row (each row's
            prompt length, the rows left-padded to the longest: the padding becomes `attention_mask`).
            Default: the width of `attention_mask`.
        attention_mask: The prompt's `(prompts or rows, prompt)` mask as `generate` got it (or one as wide as
            `sequences`, whose prompt columns are read). Default: inferred as `generate` infers it.
        tokenizer: As `generate`'s (stop strings, DRY's breakers, banned strings, the vocabulary size).
        generator: The generator the generation drew from, in the state it started from (a fresh
            `torch.Generator().manual_seed(s)`), or a list with one per row; it is copied, never advanced.
            With it, each step draws again as the generation did and the drawn token must be the recorded
            one. Needed for XTC (its coins), and for banned strings with sampling. Default: no draws.
        logits: Instead of a model: the logits of every step, a tuple of `(rows, vocab)` (`generate`'s
            `output_logits`) or a `(rows, new, vocab)` tensor.
        teacher_forced: Compute the logits with one forward over the whole `sequences` (a plain callable
            returning `(batch, seq, vocab)`, or a transformers model) instead of step by step through the
            cache. Default: False (the generation's own logits, bit for bit).
        **options: The options `generate` took: its keywords (`generation_config=`, `processors=`,
            `vocab_size=`, ...), the sampling options and samplers, per-row values, model inputs.
            `max_new_tokens` defaults to the new tokens of `sequences`.

    Returns:
        A `Replay` (`scores`, `logprobs`, `raw_logprobs`, `kept_mass`, `kept(step)`, `importance_ratio`, ...).

    Raises:
        ValueError / TypeError: bad arguments; a strategy that is not one row's sampling (beams, assisted);
            XTC without `generator`; a drawn token that is not the recorded one; sequences the options could
            not have produced (tokens after a row finished that are not the pad token).
    """
    with torch.no_grad():
        return _replay(model, sequences, prompt_length, attention_mask, tokenizer, generator, logits,
                       teacher_forced, dict(options))


def _replay(model: Any, sequences: Any, prompt_length: Any, attention_mask: Any, tokenizer: Any, generator: Any,
            logits: Any, teacher_forced: Any, kwargs: dict[str, Any]) -> Replay:
    check_flag("teacher_forced", teacher_forced, optional=False)
    if not isinstance(sequences, torch.Tensor) or sequences.ndim != 2 or sequences.is_floating_point() \
            or sequences.dtype == torch.bool:
        got = f"shape {tuple(sequences.shape)} of {sequences.dtype}" if isinstance(sequences, torch.Tensor) \
            else type(sequences).__name__
        raise TypeError(f"replay(): `sequences` must be a (rows, prompt + new) tensor of token ids, got {got}.")
    if (model is None) == (logits is None):
        raise TypeError("replay(): pass the model (any form generate takes) or `logits=` (the logits of every step), "
                        f"exactly one; got {'neither' if model is None else 'both'}.")
    if teacher_forced and model is None:
        raise TypeError("replay(): `teacher_forced=True` runs the model over the whole sequences; pass the model.")
    for name in ("streamer", "assistant_model", "prompt_lookup_num_tokens"):
        if kwargs.get(name) is not None:
            raise ValueError(f"replay(): `{name}` is not taken: assisted decoding is not replayed (its scores are the "
                             "target's checks of drafted tokens, not one row's sampling distribution).")
    if kwargs.pop("progress", False) or kwargs.pop("synced_gpus", None):
        raise ValueError("replay(): `progress` and `synced_gpus` are not taken.")
    if kwargs.get("thinking_options") is not None:
        raise ValueError("replay(): `thinking_options` (phase-aware sampling) is not replayed yet: each row's phase "
                         "picks its own chain per step; replay a generation made without it.")
    for name in (*output_only_options(), "check_every"):  # they change what is returned, not what is drawn
        kwargs.pop(name, None)
    named = {name: kwargs.pop(name) for name in _NAMED if name in kwargs}
    if "logits_processor" in named:
        if named.get("processors") is not None:
            raise TypeError("replay() got both `processors=` and `logits_processor=`; pass your processors once.")
        named["processors"] = named.pop("logits_processor")
    rows, length = sequences.shape
    start, mask = _prompt(prompt_length, attention_mask, rows, length)
    steps = length - start
    config = named.get("generation_config")
    if getattr(config, "max_time", None) is not None:  # the replay's own time would finish rows: dropped
        config = copy.deepcopy(config)
        setattr(config, "max_time", None)  # noqa: B010 - the config may be any object generate takes
        named["generation_config"] = config
    expand = kwargs.get("num_return_sequences", getattr(config, "num_return_sequences", None)) or 1
    if isinstance(expand, bool) or not isinstance(expand, int) or expand < 1 or rows % expand:
        raise ValueError(f"replay(): `sequences` have {rows} rows, which num_return_sequences={expand!r} does not "
                         "divide; pass the sequences of one generate call and its options.")
    if not any(name in kwargs for name in length_options()) and \
            getattr(config, "max_new_tokens", None) is None:
        kwargs["max_new_tokens"] = max(steps, 1)
    prompts = sequences[::expand, :start]  # generate expands each prompt to `expand` rows itself
    if mask is not None and mask.shape[0] == rows and expand > 1:
        mask = mask[::expand]
    new_tokens = sequences[:, start:].to(torch.long)  # [N, S]
    adapter = as_adapter(model, max_context=named.get("max_context")) if model is not None else _GivenLogits()
    fast = named.pop("fast", False)
    check_flag("fast", fast, optional=False)
    copies = _copied(generator)
    generate_options = GenerateOptions(attention_mask=mask, tokenizer=tokenizer, generator=copies, **named,
                                       kwargs=kwargs)
    call = prepare(adapter, prompts, generate_options, STRATEGIES)
    if call.mode not in _REPLAYED_MODES:
        name = call.strategy.name if call.strategy is not None else call.mode
        raise ValueError(f"replay(): {name} is not replayed: its scores are not one row's sampling distribution "
                         "(beams keep running sums, assisted decoding checks drafted tokens). Replay greedy search "
                         "or sampling.")
    if call.sequences.shape[0] != rows:
        raise ValueError(f"replay(): the options make {call.sequences.shape[0]} rows from {prompts.shape[0]} prompts, "
                         f"but `sequences` have {rows}.")
    if (call.sequences != sequences[:, :start]).any():
        raise ValueError("replay(): the rows of each prompt differ in the prompt's columns; with "
                         f"num_return_sequences={expand} each prompt's rows must be consecutive and equal there.")
    Stateful(call.sampler).reset()
    sampler = call.sampler
    coins = sampler.do_sample and _draws_coins(call.config)
    if coins and generator is None:
        raise ValueError("replay(): `xtc_probability` draws a coin per row and step from the generator, which the "
                         "sequences do not show; pass generator= in the state the generation's started from (e.g. "
                         "torch.Generator().manual_seed(seed), as passed to generate). The global RNG is not replayed.")
    if coins and fast:
        raise ValueError("replay(): with fast=True the generation drew XTC's coins and its tokens from another random "
                         "stream than exact mode's; replay a generation made with fast=False.")
    if call.banned is not None:
        return _resimulated(adapter, call, sequences, start, generator, model is None or teacher_forced)
    if teacher_forced:
        source = given_logits(_teacher_forced(adapter, call, sequences, start))
    elif model is not None:
        source = model_logits(adapter)
    else:
        source = given_logits(_checked_logits(logits, rows, steps))
    # teacher-forced logits differ from the generation's by float rounding: the draws only advance the stream
    draw = sampler.do_sample and generator is not None and not fast and (coins or not teacher_forced)
    replayed = replay_steps(call, new_tokens, source, draw=draw)
    if replayed.mismatch is not None and not teacher_forced and bool(replayed.mismatch.any()):
        row, step = (int(i) for i in replayed.mismatch.nonzero()[0])
        raise ValueError(f"replay(): at step {step}, row {row}: drawing with `generator` gives another token than the "
                         f"recorded {int(new_tokens[row, step])}: the generator did not start in the generation's "
                         "state, or the options, logits or model differ from the generation's.")
    return _result(sequences, start, replayed)


class _GivenLogits(ModelAdapter):
    """The adapter of a replay from given logits: `prepare` checks it like a model's; it is never called."""

    def __init__(self) -> None:
        def given(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
            raise AssertionError("unreachable: replay(logits=) never calls the model")  # pragma: no cover
        super().__init__(given)
        self.takes_mask = True

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:  # pragma: no cover
        raise AssertionError("unreachable: replay(logits=) never calls the model")

    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        return state  # nothing cached; banned strings from given logits are refused after `prepare`


def _prompt(prompt_length: Any, attention_mask: Any, rows: int, length: int) -> tuple[int, torch.Tensor | None]:
    """The column where the new tokens start and the prompt's mask (None: inferred by `prepare`)."""
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"replay(): `attention_mask` must be a (prompts or rows, prompt) tensor, got {got}.")
    if prompt_length is None:
        if attention_mask is None:
            raise TypeError("replay(): pass `prompt_length` (where the new tokens start) or the prompt's "
                            "`attention_mask`.")
        if attention_mask.shape[1] >= length:
            raise ValueError(f"replay(): `attention_mask` has {attention_mask.shape[1]} columns and `sequences` "
                             f"{length}: pass prompt_length= to say where the new tokens start.")
        return attention_mask.shape[1], attention_mask
    if _one_int(prompt_length):
        start = int(prompt_length)  # an int, a NumPy integer, a 0-d integer tensor
        per_row = None
    else:
        values = prompt_length.tolist() if isinstance(prompt_length, torch.Tensor) else prompt_length
        if not isinstance(values, (list, tuple)) or len(values) != rows or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise TypeError(f"replay(): `prompt_length` must be an int or one int per row ({rows}), got "
                            f"{prompt_length!r}.")
        per_row = list(values)
        start = max(per_row) if per_row else 0
    if not 1 <= start < length + 1 or (per_row is not None and min(per_row) < 1):
        raise ValueError(f"replay(): `prompt_length` must be in [1, {length}] (`sequences` have {length} columns), "
                         f"got {prompt_length!r}.")
    if attention_mask is not None:
        mask = attention_mask[:, :start] if attention_mask.shape[1] >= start else None
        if mask is None or (attention_mask.shape[1] != start and attention_mask.shape[1] != length):
            raise ValueError(f"replay(): `attention_mask` has {attention_mask.shape[1]} columns; expected the "
                             f"prompt's {start} or the sequences' {length}.")
        if per_row is not None and mask.shape[0] == rows and mask.sum(-1).tolist() != per_row:
            raise ValueError("replay(): `prompt_length` per row disagrees with `attention_mask`'s ones per row.")
        return start, mask
    if per_row is None:
        return start, None
    columns = torch.arange(start)
    lengths = torch.tensor(per_row)
    return start, (columns[None, :] >= (start - lengths)[:, None]).long()  # [N, T] left padding


def _one_int(value: Any) -> bool:
    if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool:
        return False
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not value.is_floating_point()
    return hasattr(value, "__index__") and not hasattr(value, "__len__")


def _copied(generator: Any) -> Any:
    """Copies of the generator(s) in their current state: the caller's are never advanced."""
    def copy(one: Any) -> Any:
        if not isinstance(one, torch.Generator):
            return one  # generate's checks name it
        fresh = torch.Generator(device=one.device)
        fresh.set_state(one.get_state())
        return fresh
    if isinstance(generator, (list, tuple)):
        return [copy(one) for one in generator]
    return copy(generator)


def _draws_coins(config: Any) -> bool:
    """Whether the chain the options build draws random numbers of its own (XTC's coins): the registry's rows
    whose processor needs the generator."""
    return any("generator" in row.needs and row.active(getattr(config, name, None))
               for name, row in COMMUNITY_OPTIONS.items())


def _checked_logits(logits: Any, rows: int, steps: int) -> tuple[torch.Tensor, ...] | torch.Tensor:
    if isinstance(logits, torch.Tensor):
        if logits.ndim != 3 or logits.shape[0] != rows or logits.shape[1] != steps or not logits.is_floating_point():
            raise ValueError(f"replay(): `logits` as one tensor must be (rows, new tokens, vocab) float = ({rows}, "
                             f"{steps}, vocab), got shape {tuple(logits.shape)} of {logits.dtype}.")
        return logits
    if not isinstance(logits, (tuple, list)) or len(logits) != steps:
        got = f"{len(logits)} steps" if isinstance(logits, (tuple, list)) else type(logits).__name__
        raise ValueError(f"replay(): `logits` must be one (rows, vocab) tensor per new token ({steps}), got {got}.")
    for step, item in enumerate(logits):
        if not isinstance(item, torch.Tensor) or item.ndim != 2 or item.shape[0] != rows \
                or not item.is_floating_point():
            got = (f"shape {tuple(item.shape)} of {item.dtype}" if isinstance(item, torch.Tensor)
                   else type(item).__name__)
            raise ValueError(f"replay(): `logits[{step}]` must be a ({rows}, vocab) float tensor, got {got}.")
    return tuple(logits)


def _teacher_forced(adapter: ModelAdapter, call: Any, sequences: torch.Tensor, start: int) -> torch.Tensor:
    """`(rows, new, vocab)`: the logits before each new token, from one forward over the whole sequences."""
    rows, length = sequences.shape
    mask = torch.cat([call.mask, call.mask.new_ones((rows, length - start))], dim=-1)  # [N, L]
    ids = sequences.to(device=call.sequences.device, dtype=torch.long)
    inputs = adapter.model_inputs(call.state)
    if isinstance(adapter, HFModel):
        # the positions generate gives a left-padded row (HF's prepare_inputs_for_generation)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        output = adapter.hf(input_ids=ids, attention_mask=mask, position_ids=positions, **inputs)
    elif type(adapter) is Recompute and adapter.max_context is None:
        output = adapter.forward(ids, {**call.state, "attention_mask": mask})
    else:
        raise TypeError(f"replay(): `teacher_forced=True` needs a plain callable returning the logits of every "
                        f"position or a transformers model, got {type(adapter).__name__}"
                        f"{' with max_context' if isinstance(adapter, Recompute) else ''}; replay step by step "
                        "(teacher_forced=False) instead.")
    logits = extract_logits(adapter.logits(output))
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3 or tuple(logits.shape[:2]) != (rows, length):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"replay(): `teacher_forced=True` needs the model's logits as (batch, seq, vocab) = ({rows}, "
                         f"{length}, vocab) for the whole sequences, got {got}.")
    return logits[:, start - 1:length - 1]  # [N, S, V]: the position before each new token


def _resimulated(adapter: ModelAdapter, call: Any, sequences: torch.Tensor, start: int, generator: Any,
                 given: bool) -> Replay:
    """Banned strings: the generation run again (rollbacks and their draws included), its sequences checked."""
    if given:
        raise ValueError("replay(): `banned_strings` / `banned_regex` roll rows back and try other tokens, whose "
                         "logits neither `logits=` nor one teacher-forced forward hold; replay them with the model "
                         "step by step.")
    if call.sampler.do_sample and generator is None:
        raise ValueError("replay(): with `banned_strings` / `banned_regex` and sampling, the rolled-back steps drew "
                         "random numbers the sequences do not show; pass generator= in the state the generation's "
                         "started from, so that the generation can be run again and checked.")
    call.scores, call.raw_logits = (), ()
    loop_decode(adapter, call, None, None, LoopOptions())
    if call.sequences.shape != sequences.shape or bool((call.sequences != sequences).any()):
        raise ValueError("replay(): running the generation again with `generator` gives other sequences than "
                         "`sequences` (banned strings are replayed by running the generation again): the generator "
                         "did not start in the generation's state, or the options or model differ.")
    tokens = sequences[:, start:].to(torch.long)
    raw = [torch.log_softmax(logits, dim=-1) for logits in call.raw_logits]
    raw_logprobs = [step.gather(1, tokens[:, t, None])[:, 0] for t, step in enumerate(raw)]
    kept_mass = [torch.where(scores > float("-inf"), step, float("-inf")).logsumexp(-1).exp()
                 for scores, step in zip(call.scores, raw)]
    generated = _generated(call, tokens)
    rows = tokens.shape[0]
    replayed = ReplayedSteps(
        scores=tuple(call.scores),
        raw_logprobs=torch.stack(raw_logprobs, 1) if raw_logprobs else torch.zeros((rows, 0)),
        raw_kept_mass=torch.stack(kept_mass, 1) if kept_mass else torch.zeros((rows, 0)),
        generated=generated, mismatch=None)
    return _result(sequences, start, replayed)


def _generated(call: Any, tokens: torch.Tensor) -> torch.Tensor:
    """`(rows, new)` bool: each row unfinished when its token was chosen, by the call's stopping criteria."""
    finished = FinishedRows(tokens.shape[0], tokens.device, call.criteria)
    prompt = call.sequences[:, :call.sequences.shape[1] - tokens.shape[1]]
    flags = []
    for step in range(tokens.shape[1]):
        flags.append(finished.unfinished)
        finished.after_step(torch.cat([prompt, tokens[:, :step + 1]], dim=-1), None, step=step, force_read=True)
    return torch.stack(flags, 1) if flags else torch.zeros(tokens.shape, dtype=torch.bool)


def _result(sequences: torch.Tensor, start: int, replayed: ReplayedSteps) -> Replay:
    return Replay(sequences=sequences.to(torch.long, copy=True), prompt_length=start, scores=replayed.scores,
                  raw_logprobs=replayed.raw_logprobs, kept_mass=replayed.raw_kept_mass, generated=replayed.generated)
