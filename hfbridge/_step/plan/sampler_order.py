"""`sampler_order`: llama.cpp's `--samplers` list, the chain's samplers in the order given.

llama.cpp names its samplers (`common/sampling.cpp`, `common_sampler_types_from_names`, with the
alternative names its command line accepts) and runs them in the order of `--samplers`, by default
`penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature`. Each name stands for the
processors that do that sampler's work in the chain hfbridge builds:

| name | processors |
| --- | --- |
| `penalties` | HF's `RepetitionPenaltyLogitsProcessor`, `PresenceFrequencyPenaltyLogitsProcessor` |
| `dry` | `DRYLogitsProcessor` |
| `top_n_sigma` | `TopNSigmaLogitsWarper` |
| `top_k`, `typ_p` | HF's `TopKLogitsWarper`, `TypicalLogitsWarper` |
| `top_p`, `min_p` | HF's `TopPLogitsWarper`, `MinPLogitsWarper` |
| `xtc` | `XTCLogitsWarper` |
| `temperature` | HF's `TemperatureLogitsWarper`, or `DynamicTemperatureLogitsWarper` (`dynatemp_range`) |
| `adaptive_p` | `AdaptivePLogitsWarper` (llama.cpp always runs it last: it must be the last name) |

The named processors trade places in the chain (the places they hold in HF's order are refilled in
the order given); every other processor (no-repeat-n-gram, bad words, minimum length, guidance,
smoothing, epsilon, a thinking budget, your own `processors=`) keeps its place. Without
`sampler_order` the chain is HF's order. The names come from the registry (`option_table.order_members`):
HF's rows say their processor's name (`order_name`), hfbridge's classes declare theirs (the trait
`sampler_name`). Refused, with a message saying what to change: an unknown
name, a name given twice (llama.cpp would run the sampler twice), `infill` (not provided), a sampler
the options turn on but the order leaves out (llama.cpp would silently drop it; note that
transformers turns `top_k=50` on by default when sampling), `adaptive_p` anywhere but last, and an
order with `mirostat` (llama.cpp ignores the order then).

>>> from hfbridge._step.plan.option_table import order_members
>>> parse_order("top_k;temperature;min-p", order_members())
('top_k', 'temperature', 'min_p')
>>> parse_order(["top_k", "top-k"], order_members())
Traceback (most recent call last):
...
ValueError: `sampler_order` names 'top_k' twice (at 0 and 1): each sampler runs once.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from hfbridge.processors._rows import described

__all__ = ["DEFAULT_SAMPLERS", "Members", "apply_order", "groups", "parse_order"]

DEFAULT_SAMPLERS = "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"  # llama.cpp's `--samplers`

# What a sampler's name stands for comes from the registry (`option_table.order_members`): llama.cpp's name ->
# `(class name, option)` for each row that builds or switches that class (the callers pass it).
Members = Mapping[str, Sequence[tuple[str, str]]]


def groups(members: Members) -> dict[str, tuple[str, ...]]:
    """llama.cpp's name -> the class names of the processors that do its work here.

    >>> from hfbridge._step.plan.option_table import order_members
    >>> groups(order_members())["temperature"], groups(order_members())["xtc"]
    (('TemperatureLogitsWarper', 'DynamicTemperatureLogitsWarper'), ('XTCLogitsWarper',))
    """
    return {name: tuple(dict.fromkeys(kind for kind, _ in found)) for name, found in members.items()}


# llama.cpp's alternative names (`sampler_alt_name_map`)
_ALTERNATIVES = {
    "top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "nucleus": "top_p", "typical-p": "typ_p",
    "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p", "temp": "temperature",
    "adaptive-p": "adaptive_p",
}

def _option(members: Members, group: str) -> str:
    """The options that turn `group` on, for the message when the order leaves it out."""
    return " / ".join(dict.fromkeys(option for _, option in members[group]))


def parse_order(order: Any, members: Members) -> tuple[str, ...]:
    """llama.cpp's names, canonical, from `"a;b;c"` or a list of names (those of `members`); errors name the
    option."""
    if isinstance(order, str):
        items: Sequence[Any] = [item.strip() for item in order.split(";")]
        if items == [""]:
            raise ValueError("`sampler_order` is empty: name the samplers in their order, e.g. "
                             f"{DEFAULT_SAMPLERS!r}.")
    elif isinstance(order, (list, tuple)):
        items = order
        if not items:
            raise ValueError("`sampler_order` is empty: name the samplers in their order.")
    else:
        raise TypeError(f"`sampler_order` must be a string of names separated by ';' or a list of names, "
                        f"got {described(order)}.")
    names: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"`sampler_order[{index}]` must be a sampler's name (a string), got {described(item)}.")
        name = _ALTERNATIVES.get(item, item)
        if name == "infill":
            raise ValueError("`sampler_order` names 'infill', llama.cpp's fill-in-the-middle sampler, which hfbridge "
                             "does not provide.")
        known = members
        if name not in known:
            close = difflib.get_close_matches(item, [*known, *_ALTERNATIVES], n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"`sampler_order[{index}]` is {item!r}, not one of llama.cpp's sampler names;{hint} "
                             f"Names: {', '.join(sorted(known))}.")
        if name in names:
            raise ValueError(f"`sampler_order` names {name!r} twice (at {names.index(name)} and {index}): each "
                             "sampler runs once.")
        names.append(name)
    if "adaptive_p" in names and names[-1] != "adaptive_p":
        raise ValueError("`sampler_order` puts 'adaptive_p' before other samplers: it chooses from the final "
                         "distribution, so llama.cpp always runs it last; put it last.")
    return tuple(names)


def apply_order(processors: list[Any], order: Any, members: Members) -> list[Any]:
    """`processors` with the named ones refilled into their places in `order` (see the module).

    >>> from transformers import TemperatureLogitsWarper, TopKLogitsWarper
    >>> chain = [TemperatureLogitsWarper(0.5), TopKLogitsWarper(3)]
    >>> from hfbridge._step.plan.option_table import order_members
    >>> [type(p).__name__ for p in apply_order(chain, "top_k;temperature", order_members())]
    ['TopKLogitsWarper', 'TemperatureLogitsWarper']
    """
    names = parse_order(order, members)
    group_of = {cls: group for group, classes in groups(members).items() for cls in classes}
    slots = [index for index, processor in enumerate(processors) if type(processor).__name__ in group_of]
    for index in slots:
        group = group_of[type(processors[index]).__name__]
        if group not in names:
            raise ValueError(
                f"`sampler_order` leaves out {group!r}, which the options turn on ({type(processors[index]).__name__}, "
                f"from `{_option(members, group)}`{_DEFAULT_NOTE.get(group, '')}): add {group!r} to the order, "
                "or turn it off.")
    ranked = sorted(slots, key=lambda index: (names.index(group_of[type(processors[index]).__name__]), index))
    result = list(processors)
    for slot, source in zip(slots, ranked):
        result[slot] = processors[source]
    return result


_DEFAULT_NOTE = {"top_k": "; transformers samples with top_k=50 unless told otherwise: top_k=0 turns it off"}
