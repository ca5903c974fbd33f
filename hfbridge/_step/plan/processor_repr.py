"""How hfbridge shows processors: each one with the settings it was built with.

HF's processor classes have no `__repr__`, so a printed `LogitsProcessorList` is a row of
`<... object at 0x...>`. The processor lists hfbridge returns print as

    CheckedProcessorList([
        RepetitionPenaltyLogitsProcessor(penalty=1.2),
        TemperatureLogitsWarper(temperature=0.7),
    ])

and render as a numbered list in a notebook. Nothing of HF's is patched: only hfbridge's own
list class uses these functions.

>>> from transformers import TopPLogitsWarper
>>> processor_label(TopPLogitsWarper(0.9))
'TopPLogitsWarper(top_p=0.9, min_tokens_to_keep=1)'
"""

from __future__ import annotations

import html
import inspect
import types
from collections.abc import Iterable
from typing import Any

import torch

from hfbridge.processors._rows import RowParam

MAX_LIST_PARAM = 8  # longer lists or tensors (vocabulary-sized masks) are not shown as parameters


def processor_name(processor: Any) -> str:
    """HF's class name (``TopPLogitsWarper``), hfbridge's samplers' too (``DRYLogitsProcessor``: they
    are `transformers.LogitsProcessor`s), a function's own name; other packages' classes get their
    package in front (``xgrammar.LogitsProcessor``).

    >>> processor_name(len)
    'len'
    """
    if isinstance(processor, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return processor.__qualname__
    display = getattr(processor, "display_name", None)  # hfbridge's stand-ins for HF's model-bound processors
    if isinstance(display, str):
        return display
    cls = type(processor)
    package = cls.__module__.split(".")[0]
    ours = ("transformers", "hfbridge", "__main__", "builtins")
    return cls.__name__ if package in ours else f"{package}.{cls.__name__}"


def processor_params(processor: Any, *, structured: bool = False) -> dict[str, Any]:
    """The processor's settings: attributes named like its constructor's parameters, if readable.

    HF's processors store their arguments under the same names (``top_p``, ``penalty``), so this
    shows what the processor was built with, and not the state a stateful one keeps (a grammar
    matcher's internals). Only numbers, flags, strings and short lists of them are kept; with
    `structured=True` also short lists of such lists (``bad_words_ids``) and small dicts
    (``sequence_bias``).

    >>> from transformers import TemperatureLogitsWarper
    >>> processor_params(TemperatureLogitsWarper(0.5))
    {'temperature': 0.5}
    """
    display = getattr(processor, "display_params", None)  # hfbridge's stand-ins say what they were built with
    if isinstance(display, dict):
        return {name: value for name, value in display.items()
                if is_plain(value) or (structured and _is_small_structure(value))}
    try:
        accepted = set(inspect.signature(type(processor).__init__).parameters) - {"self"}
    except (TypeError, ValueError):
        accepted = set()
    try:
        attributes = vars(processor)
    except TypeError:  # objects with __slots__, builtins
        return {}
    params: dict[str, Any] = {}
    for name, value in attributes.items():
        if _STORED_AS.get(name, name) not in accepted or name == "filter_value" or value is None:
            continue
        if isinstance(value, RowParam):  # hfbridge.processors' one value or one per row
            value = value.values[0] if value.scalar else list(value.values)
        if structured and _is_small_structure(value):
            params[_STORED_AS.get(name, name)] = value
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() > MAX_LIST_PARAM or (value.is_floating_point() and value.dim() > 0):
                continue
            value = value.item() if value.dim() == 0 else value.tolist()
        elif isinstance(value, (list, tuple)):
            if not value or len(value) > MAX_LIST_PARAM or not all(is_plain(v) for v in value):
                continue
            value = list(value)
        elif not is_plain(value):
            continue
        params[name] = value
    return params


# Constructor arguments HF stores under another attribute name.
_STORED_AS = {"bad_word_ids": "bad_words_ids"}


def _is_small_structure(value: Any) -> bool:
    if isinstance(value, dict):
        return 0 < len(value) <= MAX_LIST_PARAM and all(
            is_plain(key) and is_plain(item) for key, item in value.items()
        )
    if isinstance(value, (list, tuple)):
        return 0 < len(value) <= MAX_LIST_PARAM and all(is_plain(item) for item in value)
    return False


def is_plain(value: Any) -> bool:
    """A number, flag or string, or a short list of them: a value worth showing as a setting."""
    if isinstance(value, (list, tuple)):
        return len(value) <= MAX_LIST_PARAM and all(isinstance(v, (bool, int, float, str)) for v in value)
    return isinstance(value, (bool, int, float, str))


def format_value(value: Any) -> str:
    """A setting as it reads best: floats without float32 noise (``0.7``, not ``0.699999988``)."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(format_value(v) for v in value) + (",)" if len(value) == 1 else ")")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_value(k)}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def processor_label(processor: Any) -> str:
    """``Name(setting=value, ...)``: one processor on one line; a plain function by its name."""
    if isinstance(processor, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return processor_name(processor)
    params = processor_params(processor, structured=True)
    return f"{processor_name(processor)}({', '.join(f'{k}={format_value(v)}' for k, v in params.items())})"


def processor_list_repr(processors: Iterable[Any], list_name: str) -> str:
    """``list_name([...])`` with one processor per line (``list_name([])`` when empty).

    >>> from transformers import TemperatureLogitsWarper
    >>> print(processor_list_repr([TemperatureLogitsWarper(0.5)], "Processors"))
    Processors([
        TemperatureLogitsWarper(temperature=0.5),
    ])
    """
    labels = [processor_label(processor) for processor in processors]
    if not labels:
        return f"{list_name}([])"
    return f"{list_name}([\n" + "".join(f"    {label},\n" for label in labels) + "])"


def processor_list_html(processors: Iterable[Any], list_name: str) -> str:
    """The same as a numbered HTML list, in HF's order (the order they run in)."""
    items = [
        f"<li><code>{html.escape(processor_name(processor))}</code>"
        + "".join(
            f" <span style='opacity:0.75'>{html.escape(name)}=</span>{html.escape(format_value(value))}"
            for name, value in processor_params(processor, structured=True).items()
        )
        + "</li>"
        for processor in processors
    ]
    body = f"<ol style='margin:0.2em 0'>{''.join(items)}</ol>" if items else " <i>(empty)</i>"
    return f"<div><code>{html.escape(list_name)}</code>{body}</div>"
