"""The option registry: one row per numeric sampling option, HF's and `hfbridge.processors`' alike.

Each `OptionRow` says everything the step needs to know about one option: the processor it
configures (and the constructor argument it fills), its value that builds nothing (`off`), whether
it applies only when sampling, whether it takes one value per row, whether it is an integer, its
bounds, what its processor needs besides (a tokenizer, the prompt's length, the generator, the
temperature), its place in the chain and how it rides a `GenerationConfig` (an HF field, or an
extra attribute HF keeps). Every other table is derived from `ROWS`:

- `sampling_options()`: the options that turn sampling on when passed (HF's warpers and ours; a tuning option
  only with one of its `switches_of` on);
- `per_row_options()`: the options that take one value per row;
- `sampling_processors()`: the classes a greedy row never runs;
- `community_rows()`: the rows of `hfbridge.processors`' samplers (built by `community_options`).

`option_checks.check_option_values` checks a dict of option values from any source (keywords, a passed
`GenerationConfig`, a model's own `generation_config`) with these rows: every error names the public option.
A new sampler is one `LogitsProcessor` class in `hfbridge.processors` plus its rows here
(`register`).

>>> [name for name in per_row_options()][:3]
['temperature', 'top_k', 'top_p']
>>> ROWS["top_n_sigma"].check_value(-1.0)
Traceback (most recent call last):
...
ValueError: `top_n_sigma` must be > 0.0, got -1.0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from hfbridge._step.checks.row_checks import check_breakers, check_message, check_mirostat, check_tag, check_temperature
from hfbridge._step.plan import sampler_order
from hfbridge.processors import (
    AdaptivePLogitsWarper,
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    MirostatV1LogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    ThinkingBudgetLogitsProcessor,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)
from hfbridge.processors._rows import RowParam, described, plain
from hfbridge.processors._traits import own_trait
from hfbridge.processors.dry import DEFAULT_SEQUENCE_BREAKERS

__all__ = ["PLACES", "ROWS", "OptionRow", "community_rows", "order_members", "per_row_options", "phase_tags",
           "plain_options", "register", "sampling_options", "sampling_processors", "setting", "switches_of",
           "unregister", "without_effect"]

# Where a processor goes in HF's chain (`community_options.add_processors` places them): "hf": HF builds it;
# "first": first (after HF's guidance); "penalties": right after HF's repetition penalty; "temperature": in place
# of HF's temperature; "after_temperature": right after it; "after_truncation": after HF's top-k, top-p, min-p,
# ...; "last": before HF's watermark and `LogitNormalization`; "order": no processor, the chain's order.
PLACES = ("hf", "first", "penalties", "temperature", "after_temperature", "after_truncation", "last", "order")


@dataclasses.dataclass(frozen=True)
class OptionRow:
    """One option.

    Attributes:
        name: The public option (keyword, `GenerationConfig` attribute).
        processor: The class it configures: HF's class name (a string) for HF's options, the class for ours.
        argument: The constructor argument it fills (ours); None for HF's (HF builds them).
        off: The value that builds nothing (a switch's "off"); None: any value set builds it (or a tuning knob).
        default: The value when not set (ours: llama.cpp's `common/common.h`); None for HF's (HF's defaults).
        sampling: Applies only when sampling (a warper); passing it turns sampling on.
        per_row: Takes one value per row (a list, tuple, 1-D tensor or array).
        integer: Values are ints.
        bounds: `minimum` / `maximum` (inclusive), `above` (exclusive) for each value.
        switch: Setting it (to a value other than `off`) builds the processor; the others only tune it.
        needs: What the constructor takes besides: "tokenizer", "prompt_length", "generator", "temperature".
        place: Its place in the chain, one of `PLACES`.
        also_configures: Other classes whose values it decides (per-row groups differ in them too).
        check: An extra check `(name, value) -> None` (types the bounds cannot say).
        carried: "field" (a field of HF's `GenerationConfig`) or "attribute" (an extra attribute HF keeps).
        is_off: For a switch whose "off" is a range (`adaptive_target < 0`): `value -> bool`, instead of `off`.
        switched_by: For a tuning option, options besides its processor's switches that give it its effect
            (`penalty_last_n` with `repetition_penalty`); `switches_of` adds the switches.
        order_name: HF's processor's name in llama.cpp's `sampler_order` (`"typ_p"`); hfbridge's classes declare
            theirs as the trait `sampler_name` (`hfbridge/processors/_traits.py`).
        keeps_ids_intact: HF's processor reads the ids without writing or keeping them (ours: the class's trait).
        reads_ids: HF's processor reads the ids (their values or their length); False for HF's warpers, which
            take them and never look (ours: the class's trait `reads_ids`).
        chain: "head" for HF's processors that hfbridge's penalties follow (see `hf_option_rows`).
        token_ids: Its value may hold token ids (checked against the vocabulary at the first step).
        drops_top_k: `value -> bool`: this value turns HF's default `top_k=50` off unless `top_k` is passed.
        list_value: Its one value is a list by nature (token ids, tags, strings, an order): a list is that value,
            never one value per row.
        phase_tag: It marks where a row's thinking starts or ends: `thinking_options` finds the phases by it, so
            it is the same in both phases (and in use without a budget).
        shares_draw: With `fast=True`, per-row groups that differ only in options like this one share one draw,
            its values a `(n, 1)` tensor (`per_row.PerRowTemperature`, `per_row.tensor_top_p`).

    Every row may ride a serving engine's request (`hf_option_rows.request_options`).
    """

    name: str
    processor: Any
    argument: str | None = None
    off: Any = None
    default: Any = None
    sampling: bool = False
    per_row: bool = True
    integer: bool = False
    bounds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    switch: bool = False
    needs: tuple[str, ...] = ()
    place: str = "hf"
    also_configures: tuple[str, ...] = ()
    check: Callable[[str, Any], None] | None = None
    carried: str = "attribute"
    is_off: Callable[[Any], bool] | None = None
    switched_by: tuple[str, ...] = ()
    order_name: str | None = None
    keeps_ids_intact: bool = False
    reads_ids: bool = True
    chain: str | None = None
    token_ids: bool = False
    drops_top_k: Callable[[Any], bool] | None = None
    list_value: bool = False
    phase_tag: bool = False
    shares_draw: bool = False

    @property
    def community(self) -> bool:
        """One of `hfbridge.processors`' options (hfbridge builds and places its processor)."""
        return self.place != "hf"

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names whose values this option decides."""
        if self.processor is None:
            return self.also_configures
        kind = self.processor if isinstance(self.processor, str) else self.processor.__name__
        return (kind, *self.also_configures)

    def check_value(self, value: Any) -> None:
        """Check one value (or one per row, for a per-row option); errors name the option."""
        if self.check is not None:
            self.check(self.name, value)
            return
        if not self.per_row and (isinstance(plain(value), (list, tuple)) or bool(getattr(value, "ndim", 0))):
            raise TypeError(f"`{self.name}` must be {'an int' if self.integer else 'a number'} (one for every row), "
                            f"got {described(value)}.")
        RowParam(self.name, value, integer=self.integer, minimum=self.bounds.get("minimum"),
                 maximum=self.bounds.get("maximum"), above=self.bounds.get("above"))

    def active(self, value: Any) -> bool:
        """Whether `value` (a scalar or one per row) builds the processor."""
        if value is None:
            return False
        if self.is_off is not None:
            return any(not self.is_off(item) for item in RowParam(self.name, value, integer=self.integer).values)
        if self.off is None:
            return True
        items = RowParam(self.name, value, integer=self.integer).values
        return any(item != self.off for item in items)


def _hf(name: str, processor: str, off: Any, *, sampling: bool = True, integer: bool = False,
        **more: Any) -> OptionRow:
    # HF's warpers (its sampling options) take the ids and never read them (`tests/step/test_reads_ids.py`)
    return OptionRow(name, processor, off=off, sampling=sampling, integer=integer, carried="field",
                     keeps_ids_intact=True, reads_ids=not sampling, **more)


def _ours(name: str, processor: type, argument: str, default: Any, *, place: str, off: Any = None,
          switch: bool = False, sampling: bool = False, **more: Any) -> OptionRow:
    return OptionRow(name, processor, argument=argument, off=off, default=default, switch=switch,
                     sampling=sampling, place=place, **more)


_PENALTIES = PresenceFrequencyPenaltyLogitsProcessor
_ROWS = [
    # HF's numeric options (HF builds and places their processors; a row of these may vary per row)
    _hf("temperature", "TemperatureLogitsWarper", 1.0, order_name="temperature", check=check_temperature,
        also_configures=("DynamicTemperatureLogitsWarper",), shares_draw=True),
    _hf("top_k", "TopKLogitsWarper", 0, order_name="top_k", integer=True),
    _hf("top_p", "TopPLogitsWarper", 1.0, order_name="top_p", shares_draw=True),
    _hf("min_p", "MinPLogitsWarper", None, order_name="min_p"),
    _hf("typical_p", "TypicalLogitsWarper", 1.0, order_name="typ_p"),
    _hf("epsilon_cutoff", "EpsilonLogitsWarper", 0.0),
    _hf("eta_cutoff", "EtaLogitsWarper", 0.0),
    _hf("top_h", "TopHLogitsWarper", None),
    _hf("repetition_penalty", "RepetitionPenaltyLogitsProcessor", 1.0, sampling=False, order_name="penalties",
        chain="head",
        also_configures=(_PENALTIES.__name__,)),  # with `penalty_last_n`, ours takes it over
    _hf("no_repeat_ngram_size", "NoRepeatNGramLogitsProcessor", 0, sampling=False, integer=True),
    # hfbridge.processors' samplers, in their order within each place
    _ours("presence_penalty", _PENALTIES, "presence_penalty", 0.0, off=0.0, switch=True, place="penalties",
          needs=("prompt_length",)),
    _ours("frequency_penalty", _PENALTIES, "frequency_penalty", 0.0, off=0.0, switch=True, place="penalties"),
    _ours("penalty_last_n", _PENALTIES, "penalty_last_n", None, integer=True, bounds={"minimum": -1},
          place="penalties", switched_by=("repetition_penalty",)),
    _ours("dry_multiplier", DRYLogitsProcessor, "multiplier", 0.0, off=0.0, switch=True, place="penalties",
          bounds={"minimum": 0.0}, needs=("tokenizer",)),
    _ours("dry_base", DRYLogitsProcessor, "base", 1.75, bounds={"minimum": 1.0}, place="penalties"),
    _ours("dry_allowed_length", DRYLogitsProcessor, "allowed_length", 2, integer=True, bounds={"minimum": 1},
          place="penalties"),
    _ours("dry_penalty_last_n", DRYLogitsProcessor, "penalty_last_n", -1, integer=True, bounds={"minimum": -1},
          place="penalties"),
    _ours("dry_sequence_breakers", DRYLogitsProcessor, "sequence_breakers", DEFAULT_SEQUENCE_BREAKERS,
          per_row=False, check=check_breakers, place="penalties", token_ids=True, list_value=True),
    _ours("dynatemp_range", DynamicTemperatureLogitsWarper, "range", 0.0, off=0.0, switch=True, sampling=True,
          bounds={"minimum": 0.0}, place="temperature", needs=("temperature",)),
    _ours("dynatemp_exponent", DynamicTemperatureLogitsWarper, "exponent", 1.0, sampling=True,
          bounds={"above": 0.0}, place="temperature"),
    _ours("smoothing_factor", SmoothingLogitsWarper, "factor", 0.0, off=0.0, switch=True, sampling=True,
          bounds={"minimum": 0.0}, place="after_temperature"),
    _ours("smoothing_curve", SmoothingLogitsWarper, "curve", 1.0, sampling=True, bounds={"minimum": 1.0},
          place="after_temperature"),
    _ours("top_n_sigma", TopNSigmaLogitsWarper, "n", None, switch=True, sampling=True, bounds={"above": 0.0},
          place="after_temperature", drops_top_k=lambda value: value is not None),
    _ours("xtc_threshold", XTCLogitsWarper, "threshold", 0.1, sampling=True, bounds={"above": 0.0, "maximum": 1.0},
          place="after_truncation"),
    _ours("xtc_probability", XTCLogitsWarper, "probability", 0.0, off=0.0, switch=True, sampling=True,
          bounds={"minimum": 0.0, "maximum": 1.0}, place="after_truncation", needs=("generator",)),
    # mirostat 2 (`mirostat=2`) or 1 (`mirostat=1`, with `mirostat_m`): `community_options.build` picks the class
    _ours("mirostat", MirostatLogitsWarper, "", 0, off=0, switch=True, sampling=True, per_row=False, integer=True,
          check=check_mirostat, place="last", drops_top_k=lambda value: value in (1, 2),
          also_configures=(MirostatV1LogitsWarper.__name__,)),
    _ours("mirostat_tau", MirostatLogitsWarper, "tau", 5.0, sampling=True, bounds={"above": 0.0}, place="last",
          also_configures=(MirostatV1LogitsWarper.__name__,)),
    _ours("mirostat_eta", MirostatLogitsWarper, "eta", 0.1, sampling=True, bounds={"above": 0.0}, place="last",
          also_configures=(MirostatV1LogitsWarper.__name__,)),
    _ours("mirostat_m", MirostatV1LogitsWarper, "m", 100, sampling=True, integer=True, bounds={"minimum": 1},
          place="last"),
    _ours("adaptive_target", AdaptivePLogitsWarper, "target", -1.0, switch=True, sampling=True,
          bounds={"maximum": 1.0}, place="last", is_off=lambda value: value < 0),
    _ours("adaptive_decay", AdaptivePLogitsWarper, "decay", 0.9, sampling=True,
          bounds={"minimum": 0.0, "maximum": 0.99}, place="last"),
    # a thinking budget (greedy or sampling), first in the chain
    _ours("thinking_budget", ThinkingBudgetLogitsProcessor, "budget", None, switch=True, integer=True,
          bounds={"minimum": 0}, place="first", needs=("tokenizer", "prompt_length")),
    _ours("thinking_start", ThinkingBudgetLogitsProcessor, "start_ids", "<think>", per_row=False, check=check_tag,
          place="first", list_value=True, phase_tag=True),
    _ours("thinking_end", ThinkingBudgetLogitsProcessor, "end_ids", "</think>", per_row=False, check=check_tag,
          place="first", list_value=True, phase_tag=True),
    _ours("thinking_budget_message", ThinkingBudgetLogitsProcessor, "message_ids", None, per_row=False,
          check=check_message, place="first", list_value=True),
    # the order of llama.cpp's samplers in the chain (`_step/plan/sampler_order.py`; greedy or sampling): no processor
    OptionRow("sampler_order", None, per_row=False, check=lambda name, value: _check_order(value), place="order",
              list_value=True),
]

ROWS: dict[str, OptionRow] = {row.name: row for row in _ROWS}


def register(*rows: OptionRow) -> None:
    """Add the rows of a new sampler (its options); a name already in the table is refused."""
    for row in rows:
        if row.name in ROWS:
            raise ValueError(f"the option `{row.name}` is already in the table.")
        if row.place not in PLACES:
            raise ValueError(f"`place` must be one of {PLACES}, got {row.place!r}.")
    for row in rows:
        ROWS[row.name] = row
        if row.community:
            _COMMUNITY_ROWS[row.name] = row


def unregister(*names: str) -> None:
    """Remove rows added with `register`."""
    for name in names:
        ROWS.pop(name, None)
        _COMMUNITY_ROWS.pop(name, None)


def order_members() -> dict[str, list[tuple[str, str]]]:
    """llama.cpp's sampler name (`sampler_order`) -> `(class name, option)` for each row that builds or switches that
    class: HF's rows by their `order_name`, hfbridge's switches by their class's trait `sampler_name`."""
    found: dict[str, list[tuple[str, str]]] = {}
    for row in ROWS.values():
        kind = row.processor
        name = row.order_name if isinstance(kind, str) else own_trait(kind, "sampler_name") if row.switch else None
        if name is not None:
            found.setdefault(name, []).append((kind if isinstance(kind, str) else kind.__name__, row.name))
    return found


def _check_order(value: Any) -> None:
    sampler_order.parse_order(value, order_members())


def sampling_options() -> tuple[str, ...]:
    """The options that turn sampling on when passed (`do_sample` left to hfbridge), as HF's warpers do."""
    return tuple(name for name, row in ROWS.items() if row.sampling)


def hf_sampling_options() -> tuple[str, ...]:
    """HF's own options among `sampling_options` (HF's warpers)."""
    return tuple(name for name, row in ROWS.items() if row.sampling and not row.community)


def switches_of(name: str) -> tuple[str, ...]:
    """The options that give a tuning option its effect: the switches of the processors it configures (and its
    `switched_by`); () for an option that acts alone (a switch, HF's options, `sampler_order`).

    >>> switches_of("xtc_threshold"), switches_of("penalty_last_n"), switches_of("top_k")
    (('xtc_probability',), ('presence_penalty', 'frequency_penalty', 'repetition_penalty'), ())
    """
    row = ROWS[name]
    if row.switch or not row.community or row.place == "order":
        return ()
    classes = set(row.classes)
    switches = [other.name for other in ROWS.values() if other.switch and classes & set(other.classes)]
    return (*switches, *row.switched_by)


def without_effect(passed: Mapping[str, Any], sources: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """The tuning options in `passed` (set, not None) that do nothing, each with the options that would switch
    them on (`switches_of`), none of which is on in `passed` or `sources` (configs, in the order they take
    precedence). Such an option does not turn sampling on; `option_checks.warn_without_effect` says so.

    >>> without_effect({"xtc_threshold": 0.2}, []), without_effect({"xtc_threshold": 0.2, "xtc_probability": 0.5}, [])
    ({'xtc_threshold': ('xtc_probability',)}, {})
    """
    idle = {}
    for name, given in passed.items():
        switches = switches_of(name) if given is not None and name in ROWS else ()
        if switches and not any(_on(switch, setting(switch, passed, sources)) for switch in switches):
            idle[name] = switches
    return idle


def setting(name: str, passed: Mapping[str, Any], sources: Sequence[Any]) -> Any:
    """The value of option `name`: `passed`'s, else the first of `sources` (configs) that sets it, else None."""
    if passed.get(name) is not None:
        return passed[name]
    return next((getattr(source, name) for source in sources if getattr(source, name, None) is not None), None)


def _on(name: str, value: Any) -> bool:
    try:
        return ROWS[name].active(plain(value))
    except (TypeError, ValueError):  # a wrong value: its own check names it, later
        return True


def phase_tags() -> tuple[str, ...]:
    """The options that mark a row's thinking phase (the rows' `phase_tag`).

    >>> phase_tags()
    ('thinking_start', 'thinking_end')
    """
    return tuple(name for name, row in ROWS.items() if row.phase_tag)


def per_row_options() -> tuple[str, ...]:
    """The options that take one value per row."""
    return tuple(name for name, row in ROWS.items() if row.per_row)


def sampling_processors() -> frozenset[str]:
    """The class names of every warper (HF's and ours): a greedy row runs none of them."""
    return frozenset(kind for row in ROWS.values() if row.sampling for kind in row.classes)


def idless_processors() -> frozenset[str]:
    """The class names of HF's processors that never read the token ids (the rows' `reads_ids`)."""
    return frozenset(row.processor for row in ROWS.values() if not row.reads_ids and isinstance(row.processor, str))


_COMMUNITY_ROWS: dict[str, OptionRow] = {name: row for name, row in ROWS.items() if row.community}  # kept by `register`


def community_rows() -> Mapping[str, OptionRow]:
    """The rows of `hfbridge.processors`' samplers: a live, read-only view (`register` / `unregister` keep it)."""
    return MappingProxyType(_COMMUNITY_ROWS)


def plain_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with NumPy values made Python's: `np.float32(0.7)` -> 0.7, `np.array([1, 2])` -> [1, 2].

    >>> import numpy as np
    >>> plain_options({"temperature": np.float32(0.5), "top_k": np.array([1, 2])})
    {'temperature': 0.5, 'top_k': [1, 2]}
    """
    return {name: plain(value) for name, value in options.items()}
