"""Type and range checks for the options hfbridge reads itself, before HF or torch sees them.

HF validates some options in its processors' constructors (`top_p` in [0, 1], a positive
`temperature`), and hfbridge still runs those (`_processors._check_values`). What HF lets through
is caught here: a string where a flag goes (`do_sample="False"` is truthy), a bool where a count
goes (`top_k=True` is 1 to Python, a crash to torch), NaN (`top_p=nan` compares false with
everything, so HF's range checks pass it), empty or ill-typed token-id lists (`eos_token_id=[]`).
Each error names the option, what came and what was expected.

`check_option_values` is the one check of a dict of options from any source (keywords, a passed
`GenerationConfig`, a model's own `generation_config`): the registry's rows (`option_table.ROWS`: the
sampling options, HF's and the community samplers') by their row, the others here.

>>> check_options({"top_k": 40, "do_sample": True})
>>> check_options({"do_sample": "False"})
Traceback (most recent call last):
...
TypeError: `do_sample` must be a bool (True or False), got str 'False'.
>>> check_option_values({"mirostat": 3}, where="in `generation_config`")
Traceback (most recent call last):
...
ValueError: `mirostat` must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got 3 (in `generation_config`).
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hfbridge._step.checks.row_checks import check_count
from hfbridge._step.checks.value_checks import check_flag, check_number, got, is_int
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS, options_of_kind
from hfbridge._step.plan.hf_option_rows import token_id_options as token_id_options_of_rows
from hfbridge._step.plan.option_table import ROWS, per_row_options, setting, without_effect
from hfbridge._step.plan.watermark import check_watermarking_config
from hfbridge.processors._rows import plain

__all__ = ["CHECKED_OPTIONS", "TOKEN_ID_OPTIONS", "check_config_options", "check_flag", "check_number",
           "check_option_values", "check_options", "check_token_ids_in_vocab", "did_you_mean", "got", "is_int",
           "per_row_from_config", "token_id_options", "warn_without_effect"]

# HF's other options, by kind (`hf_option_rows.HF_OPTION_ROWS`: flags, counts, numbers, token ids, ...); the
# sampling options (`temperature`, `top_k`, ...) are the registry's rows (`option_table.ROWS`), checked there.
_ONE_ID = options_of_kind("id")  # "is" in the vocabulary message (the others "hold" ids)

# The registry's HF rows (`temperature`, `top_k`, `repetition_penalty`, ...): checked by their row.
HF_ROWS = tuple(name for name, row in ROWS.items() if not row.community)

# Options holding token ids (checked against the vocabulary at the first step); DRY's breakers may be
# strings too (those are found in the tokenizer's vocabulary).
TOKEN_ID_OPTIONS = token_id_options_of_rows()

# Every option `check_options` knows (a prepared config is checked on these names).
CHECKED_OPTIONS = (*HF_ROWS, *(name for name, row in HF_OPTION_ROWS.items() if row.kind is not None))


def check_options(options: Mapping[str, Any]) -> None:
    """Check the type (and where HF does not, the range) of every known option in `options`.

    None means "not set" and passes. Names not listed here pass unchecked (HF checks them, or
    hfbridge does not read them).
    """
    for name, value in options.items():
        if value is None:
            continue
        row = HF_OPTION_ROWS.get(name)
        kind = row.kind if row is not None else None
        if name in ROWS:
            ROWS[name].check_value(value)
        elif kind == "flag":
            check_flag(name, value)
        elif row is not None and kind == "count":
            check_count(name, value, row.minimum)
        elif row is not None and kind == "number":
            check_number(name, value, positive=row.positive)
        elif kind == "id":
            _check_id(name, value)
        elif kind in ("ids", "id_list"):
            _check_ids(name, value, allow_single=kind == "ids")
        elif kind == "id_sequences":
            _check_id_sequences(name, value)
        elif kind == "sequence_bias":
            _check_sequence_bias(value)
        elif kind == "decay":
            _check_decay(value)
        elif kind == "stop_strings":
            _check_stop_strings(value)
        elif row is not None and row.check is not None:  # the beam and draft options
            row.check(name, value)
        elif kind == "watermark":
            check_watermarking_config(value)


def check_option_values(options: Mapping[str, Any], *, where: str = "") -> None:
    """Check every option in `options` (None = not set), from any source; errors name the public option.

    The registry's rows (`option_table.ROWS`) are checked (one value, or one per row for a per-row option); every other
    option goes to `option_checks.check_options` (flags, counts, token ids, ...). `where` is added to
    the message, e.g. "in `generation_config`".
    """
    try:
        for name, value in options.items():
            if value is None:
                continue
            check_options({name: plain(value)})  # a registry row's own check, or HF's other options' checks
    except (TypeError, ValueError) as error:
        if not where:
            raise
        raise type(error)(f"{str(error).rstrip('.')} ({where}).") from None


def check_config_options(config: Any, *, where: str, names: Iterable[str] | None = None) -> None:
    """`check_option_values` for every option a `GenerationConfig` carries that a keyword would be checked for.

    The one check of a passed `generation_config` and of a model's own: the registry's rows and every other option
    `check_options` knows (or only `names`), read off `config` (None: nothing to check). Errors name the option and
    `where`.

    >>> from transformers import GenerationConfig
    >>> check_config_options(GenerationConfig(top_k=True), where="in the model's `generation_config`")
    Traceback (most recent call last):
    ...
    TypeError: `top_k` must be an int, got bool True (in the model's `generation_config`).
    """
    if config is None:
        return
    names = dict.fromkeys((*ROWS, *CHECKED_OPTIONS) if names is None else names)  # the registry's rows, HF's others
    check_option_values({name: getattr(config, name, None) for name in names}, where=where)


def per_row_from_config(generation_config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` (keywords) with the per-row values a passed `generation_config` carries added, as keywords.

    HF's `GenerationConfig` holds a list (or tuple, NumPy array, tensor) where one value per row goes, but its
    own checks and processors take one number: `Sampler`, `sample_step` and `generate` read such a value as the
    keyword (`split_per_row` then parses it), so one value per row means the same wherever it was set. A keyword
    wins over the config, as in HF's merge.

    >>> from transformers import GenerationConfig
    >>> per_row_from_config(GenerationConfig(temperature=[0.5, 1.3], top_k=4), {"top_p": 0.9})
    {'top_p': 0.9, 'temperature': [0.5, 1.3]}
    """
    options = dict(options)
    for name in per_row_options():
        value = getattr(generation_config, name, None) if generation_config is not None else None
        if name not in options and (isinstance(value, (list, tuple)) or bool(getattr(value, "ndim", 0))):
            check_option_values({name: value}, where="in `generation_config`")
            options[name] = value
    return options


def warn_without_effect(passed: Mapping[str, Any], sources: Sequence[Any], *, where: str = "",
                        names: Iterable[str] | None = None) -> list[str]:
    """A `UserWarning` for each option of `passed` without effect (`without_effect`) whose switches are not set at
    all (a switch set to its off value, as llama.cpp's full settings pass them, says the caller knows); returns the
    names of every option without effect. `names`: warn for these options of `passed` only (default: all)."""
    idle = without_effect(passed, sources)
    for name, switches in idle.items():
        if (names is not None and name not in names) or any(_set_by_caller(switch, passed, sources)
                                                             for switch in switches):
            continue
        kinds = " / ".join(dict.fromkeys(ROWS[name].classes))
        either = ", ".join(f"`{switch}`" for switch in switches[:-1])
        either = f"{either} or `{switches[-1]}`" if either else f"`{switches[-1]}`"
        sampling = " (and does not turn sampling on)" if ROWS[name].sampling else ""
        warnings.warn(f"`{name}` is set to {plain(passed[name])!r}{where}, but it only tunes {kinds}, which {either} "
                      f"turns on: alone it does nothing{sampling}. Set {either}, or unset `{name}`.", UserWarning,
                      stacklevel=4)
    return list(idle)


def _set_by_caller(name: str, passed: Mapping[str, Any], sources: Sequence[Any]) -> bool:
    """Whether option `name` is set in `passed` or in a config, other than to `GenerationConfig()`'s own default
    (transformers before 5.0 fills `repetition_penalty=1.0` into every config: not the caller's setting)."""
    value = setting(name, passed, sources)
    if value is None or passed.get(name) is not None:
        return value is not None
    default = getattr(_default_config(), name, None)
    return default is None or not isinstance(value, (int, float)) or value != default


@functools.cache
def _default_config() -> Any:
    from transformers import GenerationConfig

    return GenerationConfig()


def token_id_options(options: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Every `(option, token id)` pair in `options`, for the vocabulary check at the first step.

    >>> token_id_options({"eos_token_id": [2, 3], "bad_words_ids": [[4, 5]], "top_k": 5})
    [('eos_token_id', 2), ('eos_token_id', 3), ('bad_words_ids', 4), ('bad_words_ids', 5)]
    """
    pairs: list[tuple[str, int]] = []
    for name in TOKEN_ID_OPTIONS:
        value = options.get(name)
        if value is None:
            continue
        kind = HF_OPTION_ROWS[name].kind if name in HF_OPTION_ROWS else None
        if kind == "sequence_bias":
            items = value.items() if isinstance(value, Mapping) else value
            pairs += [(name, int(token)) for sequence, _ in items for token in sequence]
        elif kind == "id_sequences":
            pairs += [(name, int(token)) for sequence in value for token in sequence]
        elif name in ROWS:  # DRY's breakers: token-id sequences or strings
            pairs += [(name, int(token)) for sequence in value if not isinstance(sequence, str)
                      for token in (sequence.tolist() if hasattr(sequence, "tolist") else sequence)]
        elif is_int(value):
            pairs.append((name, int(value)))
        else:
            pairs += [(name, int(token)) for token in _as_list(value)]
    return pairs


def check_token_ids_in_vocab(options: Mapping[str, Any], vocab: int) -> None:
    """`ValueError` for a token id in `options` outside `[0, vocab)`.

    HF ignores such ids silently in some processors (`suppress_tokens`, `min_length`'s eos) and
    fails inside torch in others (`forced_bos_token_id`); an id the model cannot produce is always
    a mistake (another tokenizer, or `vocab_size` too small), so hfbridge names it.

    >>> check_token_ids_in_vocab({"suppress_tokens": [3, 100]}, 10)
    Traceback (most recent call last):
    ...
    ValueError: `suppress_tokens` holds token id 100, outside the vocabulary of 10 tokens (ids must be in [0, 10)).
    """
    for name, token in token_id_options(options):
        if not 0 <= token < vocab:
            verb = "is" if name in _ONE_ID else "holds"
            raise ValueError(
                f"`{name}` {verb} token id {token}, outside the vocabulary of {vocab} tokens "
                f"(ids must be in [0, {vocab}))."
            )


# difflib's default (0.6) offers `temperature` for `features` and `eos_token_id` for
# `position_ids`; at 0.75 only plausible misspellings remain (`temprature`, `attn_mask`, `top_P`).
_SUGGESTION_CUTOFF = 0.75


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """` Did you mean `x`?` for a plausible misspelling of one of `candidates`, else an empty string.

    >>> did_you_mean("temprature", ["temperature", "top_p"]), did_you_mean("features", ["temperature"])
    (' Did you mean `temperature`?', '')
    """
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    close = difflib.get_close_matches(name.lower(), sorted(by_lower), n=1, cutoff=_SUGGESTION_CUTOFF)
    return f" Did you mean `{by_lower[close[0]]}`?" if close else ""


def _check_id(name: str, value: Any) -> None:
    if not is_int(value):
        raise TypeError(f"`{name}` must be a token id (an int), got {got(value)}.")
    if value < 0:
        raise ValueError(f"`{name}` must be a token id >= 0, got {value!r}.")


def _as_list(value: Any) -> list:
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # a tensor of ids, as HF's own configs sometimes hold
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_ids(name: str, value: Any, *, allow_single: bool) -> None:
    if allow_single and is_int(value):
        return _check_id(name, value)
    if not isinstance(value, (list, tuple)) and not hasattr(value, "tolist"):
        expected = "a token id or a non-empty list of them" if allow_single else "a list of token ids"
        raise TypeError(f"`{name}` must be {expected}, got {got(value)}.")
    items = _as_list(value)
    if allow_single and not items:
        raise ValueError(f"`{name}` is an empty list; pass at least one token id, or None for no {name}.")
    for index, item in enumerate(items):
        _check_id(f"{name}[{index}]", item)
    return None


def _check_id_sequences(name: str, value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"`{name}` must be a non-empty list of lists of token ids, got {got(value)}.")
    for index, sequence in enumerate(value):
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise TypeError(f"`{name}[{index}]` must be a non-empty list of token ids, got {got(sequence)}.")
        for position, item in enumerate(sequence):
            _check_id(f"{name}[{index}][{position}]", item)


def _check_sequence_bias(value: Any) -> None:
    # HF validates the structure (dict of tuples -> floats, or list of [list, float] pairs); NaN or
    # inf biases pass it and turn scores into NaN.
    items = value.items() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else None
    if items is None:
        raise TypeError(f"`sequence_bias` must be a dict {{(token ids): bias}}, got {got(value)}.")
    for entry in items:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise TypeError(f"`sequence_bias` entries must be (token ids, bias) pairs, got {got(entry)}.")
        sequence, bias = entry
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise TypeError(f"`sequence_bias` keys must be non-empty tuples of token ids, got {got(sequence)}.")
        for item in sequence:
            _check_id("sequence_bias", item)
        check_number(f"sequence_bias[{tuple(sequence)}]", bias, positive=False)


def _check_decay(value: Any) -> None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise TypeError(
            f"`exponential_decay_length_penalty` must be a (start_index, decay_factor) pair, got {got(value)}."
        )
    check_count("exponential_decay_length_penalty[0] (start_index)", value[0], 0)
    check_number("exponential_decay_length_penalty[1] (decay_factor)", value[1], positive=True)


def _check_stop_strings(value: Any) -> None:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeError(f"`stop_strings` must be a string or a non-empty list of strings, got {got(value)}.")
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise TypeError(f"`stop_strings[{index}]` must be a non-empty string, got {got(item)}.")


# ---- the options of beam search and assisted / prompt-lookup decoding (`hf_option_rows`: kind "strategy") ----
STRATEGY_OPTIONS = {name: row.check for name, row in HF_OPTION_ROWS.items() if row.kind == "strategy"}


def check_strategy_options(config: Any) -> None:
    """`check_options` for the beam and draft options of a prepared `GenerationConfig` (or any object).

    >>> from transformers import GenerationConfig
    >>> check_strategy_options(GenerationConfig(num_beams=2, length_penalty=float("nan")))
    Traceback (most recent call last):
    ...
    ValueError: `length_penalty` must be a finite number, got nan.
    """
    check_options({name: getattr(config, name, None) for name in STRATEGY_OPTIONS})


def check_tokenizer(tokenizer: Any, name: str = "tokenizer") -> None:
    """`TypeError` unless `tokenizer` is None or has the `decode` of a HF tokenizer.

    >>> check_tokenizer("gpt2")
    Traceback (most recent call last):
    ...
    TypeError: `tokenizer` must be a tokenizer object with a .decode method, got str 'gpt2'; load it first: AutoTokenizer.from_pretrained('gpt2').
    """  # noqa: E501 (the doctest's output line)
    if tokenizer is None or callable(getattr(tokenizer, "decode", None)):
        return
    hint = (f"; load it first: AutoTokenizer.from_pretrained({tokenizer!r})" if isinstance(tokenizer, str)
            else " (a transformers tokenizer, e.g. AutoTokenizer.from_pretrained(...))")
    raise TypeError(f"`{name}` must be a tokenizer object with a .decode method, got {got(tokenizer)}{hint}.")
