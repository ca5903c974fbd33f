"""The registry's rows for HF's other options: flags, counts, numbers, token ids and the processors they build.

`option_table.ROWS` holds the sampling options (HF's and hfbridge's samplers); these rows hold the rest of
what hfbridge reads of HF's options, one row each: how `option_checks.check_options` checks it (`kind`), and
the facts about the HF processors it builds, which HF's classes cannot carry as traits
(`hfbridge/processors/_traits.py`): whether they leave the token ids intact (the step then passes the
caller's ids uncopied) and where they sit in HF's chain relative to hfbridge's samplers (`chain`).

| kind | value | check |
| --- | --- | --- |
| `flag` | a bool | `value_checks.check_flag` |
| `count` | an int >= `minimum` | `option_checks.check_count` |
| `number` | a finite real (> 0 with `positive`) | `value_checks.check_number` |
| `id` | one token id | an int >= 0 |
| `ids` | one token id or a non-empty list | each an int >= 0 |
| `id_list` | a list of token ids | each an int >= 0 |
| `id_sequences`, `sequence_bias`, `decay`, `stop_strings`, `watermark` | their own shapes | their own checks |
| `strategy` | beam and draft options | the row's `check` |
| None | not checked (HF checks it) | |

>>> [row.name for row in HF_OPTION_ROWS.values() if row.kind == "id"]
['pad_token_id', 'bos_token_id', 'forced_bos_token_id']
>>> intact_processors() >= {"MinLengthLogitsProcessor", "TopKLogitsWarper"}
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hfbridge._step.checks.row_checks import check_count, check_early_stopping, check_real, check_schedule
from hfbridge._step.checks.value_checks import check_flag
from hfbridge._step.plan.option_table import ROWS

__all__ = ["HF_OPTION_ROWS", "HFOptionRow", "chain_processors", "intact_processors", "length_options", "list_options",
           "needing", "options_of_kind", "output_only_options", "request_options", "token_id_options"]

@dataclasses.dataclass(frozen=True)
class HFOptionRow:
    """One of HF's options that is not a sampling option.

    Attributes:
        name: The option (keyword, `GenerationConfig` field).
        kind: How it is checked (see the module); None: not checked by hfbridge.
        minimum: A count's minimum.
        positive: A number must be > 0 (HF stops at once for `max_time <= 0` without a word).
        builds: The names of HF's processors it builds.
        keeps_ids_intact: Those processors read `input_ids` without writing them, keeping them or handing them
            to user code (checked in transformers' `logits_process.py`, 4.46 and 5.x).
        chain: Where those processors sit for hfbridge's placement: "head" (hfbridge's penalties go after
            them), "tail" (hfbridge's last samplers go before them), None.
        token_ids: Its value holds token ids (checked against the vocabulary at the first step).
        step: The step reads it (`sample_step` accepts it): it becomes a processor or decides one's parameters in
            HF's `_get_logits_processor` (or `_step/plan/watermark.py`, `_step/plan/guidance_processor.py`).
        needs: What its processor needs besides: "prompt_length" (it depends on how long the prompt was),
            "prompt_end" (in an engine's request it counts the tokens from where the prompt ends), "eos" (the
            end-of-sequence ids: a request's stop tokens unless `eos_token_id` is given).
        check: A "strategy" option's check `(name, value) -> None` (the beam and draft options).
        selects: `value -> bool`: the value selects a decoding strategy other than greedy or sampling (HF's
            `get_generation_mode`); the step refuses it, naming the option.
        refused: Why `generate` refuses the option when set (`selects`, or a true value): it needs more than
            logits processors.
        whole_call: It holds for the whole call, the same in both phases of `thinking_options` (lengths, special
            tokens, options whose processors need more than the step).
        request: A serving engine's request may carry it (`engine_requests`: vLLM's and SGLang's processors): it
            only changes the scores. Every row of `option_table.ROWS` may.
        request_refused: Why an engine's request may not carry it, said by the engine: a template of `{engine}`,
            `{temperature}` and `{max_tokens}` (the engine's own fields: `engine_requests.Engine`).
        list_value: Its one value is a list by nature (token ids, pairs, strings): a list is that value, never one
            value per row.
        assistant: A field of the assistant's own generation config in HF's assisted decoding.
        internals: A true value asks for the model's internals, which `generate` does not see (refused).
        output_only: It changes what `generate` returns, or stops it by the wall clock, never what is drawn (a
            replay of the generation leaves it out).
        length: It sets how long the generation is (`max_length`, `max_new_tokens`).
    """

    name: str
    kind: str | None
    minimum: int | None = None
    positive: bool = False
    builds: tuple[str, ...] = ()
    keeps_ids_intact: bool = False
    chain: str | None = None
    token_ids: bool = False
    step: bool = False
    needs: tuple[str, ...] = ()
    check: Callable[[str, Any], None] | None = None
    selects: Callable[[Any], bool] | None = None
    refused: str | None = None
    whole_call: bool = False
    request: bool = False
    request_refused: str | None = None
    list_value: bool = False
    assistant: bool = False
    internals: bool = False
    output_only: bool = False
    length: bool = False


def _row(name: str, kind: str | None, *builds: str, intact: bool = True, **more: Any) -> HFOptionRow:
    return HFOptionRow(name, kind, builds=builds, keeps_ids_intact=intact and bool(builds), **more)


def _above(bound: float) -> Callable[[Any], bool]:
    return lambda value: value is not None and value > bound


def _set(value: Any) -> bool:
    return value is not None


_PROMPT = ("prompt_length",)
_LENGTH = "{max_tokens} ends the request"  # an engine's own length ends its requests
_ROWS = [
    _row("do_sample", "flag", step=True,
         request_refused="{temperature} decides: 0 is greedy, 1 samples from hfbridge's scores"),
    _row("remove_invalid_values", "flag", "InfNanRemoveLogitsProcessor", step=True, request=True),
    _row("renormalize_logits", "flag", "LogitNormalization", chain="tail", step=True, request=True),
    _row("return_dict_in_generate", "flag", output_only=True),
    _row("output_scores", "flag", output_only=True),
    _row("output_logits", "flag", output_only=True),
    _row("output_attentions", "flag", internals=True),
    _row("output_hidden_states", "flag", internals=True),
    _row("use_cache", "flag"),
    _row("min_length", "count", "MinLengthLogitsProcessor", minimum=0, step=True, needs=("prompt_end", "eos"),
         request=True),
    _row("min_new_tokens", "count", "MinNewTokensLengthLogitsProcessor", minimum=0, step=True,
         needs=("prompt_length", "prompt_end", "eos"), request=True),
    _row("max_length", "count", minimum=1, step=True, whole_call=True, request_refused=_LENGTH, length=True),
    _row("max_new_tokens", "count", minimum=1, step=True, whole_call=True, needs=_PROMPT, request_refused=_LENGTH,
         length=True),
    _row("num_return_sequences", "count", minimum=1),
    _row("num_beams", "count", minimum=1, selects=_above(1)),
    _row("num_beam_groups", "count", minimum=1, selects=_above(1)),
    # the guidance processor runs the model (with ids of its own): not intact
    _row("guidance_scale", "number", "UnbatchedClassifierFreeGuidanceLogitsProcessor", intact=False, chain="head",
         step=True, whole_call=True,
         request_refused="classifier-free guidance needs a second model call per step, which {engine} does not make"),
    _row("max_time", "number", positive=True, output_only=True),
    _row("pad_token_id", "id", token_ids=True, step=True, whole_call=True),
    _row("bos_token_id", "id", token_ids=True, step=True, whole_call=True),
    _row("forced_bos_token_id", "id", "ForcedBOSTokenLogitsProcessor", token_ids=True, step=True,
         request_refused="it applies at the first position of encoder-decoder outputs only"),
    _row("eos_token_id", "ids", token_ids=True, step=True, whole_call=True, request=True, list_value=True),
    _row("forced_eos_token_id", "ids", "ForcedEOSTokenLogitsProcessor", token_ids=True, step=True, list_value=True,
         request_refused=f"it needs HF's `max_length`; {_LENGTH}"),
    _row("suppress_tokens", "id_list", "SuppressTokensLogitsProcessor", token_ids=True, step=True, request=True,
         list_value=True),
    _row("begin_suppress_tokens", "id_list", "SuppressTokensAtBeginLogitsProcessor", token_ids=True, step=True,
         needs=("prompt_length", "prompt_end"), request=True, list_value=True),
    _row("bad_words_ids", "id_sequences", "NoBadWordsLogitsProcessor", token_ids=True, step=True, request=True,
         list_value=True),
    _row("sequence_bias", "sequence_bias", "SequenceBiasLogitsProcessor", chain="head", token_ids=True, step=True,
         request=True, list_value=True),
    _row("exponential_decay_length_penalty", "decay", "ExponentialDecayLengthPenalty", step=True,
         needs=("prompt_length", "prompt_end", "eos"), request=True, list_value=True),
    _row("stop_strings", "stop_strings", list_value=True),
    _row("watermarking_config", "watermark", "WatermarkLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor",
         intact=False, chain="tail", step=True, whole_call=True,
         request_refused="watermarking is not offered inside {engine}"),
    _row("encoder_repetition_penalty", None, "EncoderRepetitionPenaltyLogitsProcessor", intact=False, chain="head"),
    # beam search and assisted / prompt-lookup decoding: HF's loops read these without checking them
    # (`length_penalty="2"` failed after the first model call, `num_assistant_tokens=inf` inside the draft loop);
    # `selects`: the options (in this order) that select another strategy than greedy or sampling
    _row("length_penalty", "strategy", check=check_real),
    _row("diversity_penalty", "strategy", check=check_real, selects=_above(0)),
    _row("penalty_alpha", None, selects=_above(0), refused=(
        "contrastive search re-ranks candidates with the model's hidden states. Transformers 5 moved it out of its "
        "core into the Hub repository transformers-community/contrastive-search")),
    _row("constraints", None, selects=_set),
    _row("force_words_ids", None, selects=_set),
    _row("dola_layers", None, selects=_set),
    _row("assistant_early_exit", None, selects=_set),
    _row("early_stopping", "strategy", check=check_early_stopping),
    _row("low_memory", "strategy", check=check_flag),
    _row("num_assistant_tokens", "strategy", check=lambda name, value: check_real(name, value, 1), assistant=True),
    _row("assistant_confidence_threshold", "strategy", check=lambda name, value: check_real(name, value, 0, 1),
         assistant=True),
    _row("num_assistant_tokens_schedule", "strategy", check=check_schedule, assistant=True),
    _row("prompt_lookup_num_tokens", "strategy", check=lambda name, value: check_count(name, value, 1),
         selects=_set),
    _row("max_matching_ngram_size", "strategy", check=lambda name, value: check_count(name, value, 1)),
    # not HF's processors: token healing re-tokenizes the prompt
    _row("token_healing", None, refused="token healing re-tokenizes the prompt; heal it before the call"),
]

HF_OPTION_ROWS: dict[str, HFOptionRow] = {row.name: row for row in _ROWS}


def options_of_kind(*kinds: str) -> tuple[str, ...]:
    """The options of these kinds, in the table's order."""
    return tuple(name for name, row in HF_OPTION_ROWS.items() if row.kind in kinds)


def intact_processors() -> frozenset[str]:
    """The names of HF's processors that leave the token ids intact: the sampling rows' (`option_table`) and
    these rows'."""
    sampling = {row.processor for row in ROWS.values() if row.keeps_ids_intact and isinstance(row.processor, str)}
    return frozenset(sampling.union(*(row.builds for row in HF_OPTION_ROWS.values() if row.keeps_ids_intact)))


def chain_processors(chain: str) -> frozenset[str]:
    """The names of HF's processors at `chain` ("head" or "tail"), from both tables."""
    sampling = {row.processor for row in ROWS.values() if row.chain == chain and isinstance(row.processor, str)}
    return frozenset(sampling.union(*(row.builds for row in HF_OPTION_ROWS.values() if row.chain == chain)))


def needing(need: str) -> tuple[str, ...]:
    """The options whose processor needs `need` (see `HFOptionRow.needs`), in the table's order."""
    return tuple(name for name, row in HF_OPTION_ROWS.items() if need in row.needs)


def token_id_options() -> tuple[str, ...]:
    """The options holding token ids (checked against the vocabulary at the first step): these rows' and the
    sampling rows' (DRY's breakers, which may be strings too)."""
    return (*(name for name, row in HF_OPTION_ROWS.items() if row.token_ids),
            *(name for name, row in ROWS.items() if row.token_ids))


def request_options() -> tuple[str, ...]:
    """HF's options a serving engine's request may carry: the HF rows of `option_table.ROWS` (HF's samplers and
    penalties) and these rows' `request` ones (hfbridge's samplers are `community_rows()`).

    >>> {"top_p", "repetition_penalty", "eos_token_id"} <= set(request_options()), "max_length" in request_options()
    (True, False)
    """
    return (*(name for name, row in ROWS.items() if not row.community),
            *(name for name, row in HF_OPTION_ROWS.items() if row.request))


def list_options() -> tuple[str, ...]:
    """The options whose one value is a list by nature (the rows' `list_value`, both tables): a list there is
    that value, never one value per row."""
    return (*(name for name, row in HF_OPTION_ROWS.items() if row.list_value),
            *(name for name, row in ROWS.items() if row.list_value))


def output_only_options() -> tuple[str, ...]:
    """HF's options that change what `generate` returns (or stop it by the wall clock), never what is drawn.

    >>> output_only_options()
    ('return_dict_in_generate', 'output_scores', 'output_logits', 'max_time')
    """
    return tuple(name for name, row in HF_OPTION_ROWS.items() if row.output_only)


def length_options() -> tuple[str, ...]:
    """HF's options that set how long the generation is.

    >>> length_options()
    ('max_length', 'max_new_tokens')
    """
    return tuple(name for name, row in HF_OPTION_ROWS.items() if row.length)
