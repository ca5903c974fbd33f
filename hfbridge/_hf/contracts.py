"""The contracts with transformers' private code that decide correctness, checked.

hfbridge runs transformers' own loops on stand-in hosts. If a release changes what those loops do
with the objects hfbridge hands them (a renamed keyword, a cache no longer reordered), the loop
would still run and give wrong tokens. These checks turn that into `TransformersContractError`,
naming the installed version and the contract, before a wrong token reaches the caller:

- at run time, where it is cheap: the beam loop reordered the cache between two model calls
  (`check_reordered`, an integer comparison), the assisted loop cropped the rejected draft tokens
  (`check_cropped`, one flag read where HF's loop reads the accepted count), the candidate
  generator handed the assistant's cache back (`check_handed_back`);
- at first use, where a look at a class suffices: an output class has the fields hfbridge fills
  (`check_fields`), a loop takes the keyword arguments hfbridge passes (`check_parameters`).

>>> check_reordered(step=1, reorders=1, cache_name="past_key_values")
>>> try:
...     check_reordered(step=2, reorders=0, cache_name="cache")
... except TransformersContractError as error:
...     print(error.contract)
beam-reorder
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from hfbridge._hf import names

__all__ = ["CONTRACTS", "TransformersContractError", "check_crop_amount", "check_cropped", "check_fed",
           "check_fields", "check_handed_back", "check_parameters", "check_reordered", "check_slicing_names"]

CONTRACTS = {
    "beam-first-call": "HF's beam loop calls the model on the whole prompt first",
    "beam-reorder": "HF's beam loop reorders the cache it was given (model_kwargs[{cache}]) after every step",
    "assisted-cache": "HF's assisted loop finds the cache hfbridge passes as model_kwargs[{cache}]",
    "assisted-crop": "HF's assisted loop crops the rejected draft tokens from the target's cache (its model "
                     "output's `{output}`) and from the assistant's",
    "draft-cache": "HF's candidate generator hands the assistant's cache back to its next "
                   "`assistant_model.generate({cache}=...)`",
    "output-fields": "HF's output classes have the fields hfbridge fills",
    "loop-signature": "HF's loops take the arguments hfbridge passes",
    "model-inputs": "a model's `prepare_inputs_for_generation` feeds only the positions its cache has not seen, "
                    "given the arguments HF's `generate` passes it",
}


class TransformersContractError(RuntimeError):
    """The installed transformers broke a contract hfbridge relies on: no result rather than a wrong one.

    Attributes:
        contract: The key of the contract in `CONTRACTS` (e.g. `"beam-reorder"`).
    """

    def __init__(self, contract: str, detail: str):
        self.contract = contract
        rule = CONTRACTS[contract].format(cache=repr(names.LOOP_CACHE), output=names.OUTPUT_CACHE)
        super().__init__(
            f"transformers {names.TRANSFORMERS_VERSION_TEXT} broke a contract hfbridge relies on ({contract}: "
            f"{rule}): {detail}. hfbridge stopped rather than return tokens that could be wrong; install a "
            "transformers release listed in hfbridge's docs/versions.md, run `python -m hfbridge doctor`, and "
            "report this version."
        )


def check_reordered(*, step: int, reorders: int, cache_name: str) -> None:
    """Before model call `step` (> 0) of beam search: HF must have reordered the cache once since the last call.

    `reorders` counts the reorders since the previous model call.
    """
    if step > 0 and reorders != 1:
        raise TransformersContractError(
            "beam-reorder",
            f"before model call {step} of beam search, the beam loop had reordered the cache hfbridge gave it as "
            f"{cache_name!r} {reorders} time(s) since the call before, expected once; its beams would continue "
            "from the wrong rows of the model's cache",
        )


def check_cropped(*, role: str, kept: int, seen: Any, input_ids: Any, output_name: str) -> None:
    """Before a model call of assisted decoding: the cache must hold only tokens of the new sequence.

    `kept` positions are in the cache after HF's loop cropped it, `seen` (`(1, seq)`, or None before the
    first call) are the ids of the call before, `input_ids` `(1, seq')` those of this call. HF crops only
    when a draft was rejected (5.14+), so the check is on the tokens, not on the number of crops; it
    reads one flag from the device, where HF's loop has just read the number of accepted tokens.
    """
    if seen is None or kept == 0:
        return
    if kept >= input_ids.shape[1] or not bool((input_ids[:, :kept] == seen[:, :kept].to(input_ids.device)).all()):
        raise TransformersContractError(
            "assisted-crop",
            f"the {role} model's cache (returned as `{output_name}`) still holds {kept} positions, but the "
            f"sequence it is called with next ({input_ids.shape[1]} ids) differs from them: the assisted loop did "
            "not crop the rejected draft tokens from it",
        )


def check_fed(model: Any, prepared: Any, *, total: int, held: int | None, decides: bool) -> None:
    """After the prefill: the inputs `prepare_inputs_for_generation` made must not be the whole sequence again.

    `total` positions make the sequence; the model's cache holds `held` of them (None: a recurrent
    state, whose length cannot be read). Inputs of all `total` positions on top of a cache that holds
    any would count them twice: wrong logits, no error. Exempt: a cache that holds nothing (a model that
    keeps none), and a model whose own override `decides` the slicing (it names the argument and asks for
    the whole sequence, as CPM-Ant's forward slices the cached prefix itself). A look at a shape, no device read.
    """
    ids = prepared.get("input_ids") if isinstance(prepared, dict) else None
    if ids is None and isinstance(prepared, dict):
        ids = prepared.get("inputs_embeds")
    if ids is None or ids.ndim < 2 or ids.shape[1] < total or held == 0 or decides:
        return
    raise TransformersContractError(
        "model-inputs",
        f"{type(model).__name__}.prepare_inputs_for_generation, called as transformers' generate calls it after the "
        f"prefill, prepared all {total} positions again while the model's cache holds "
        f"{'a recurrent state' if held is None else f'{held} positions'}; the model would see the sequence twice",
    )


def check_slicing_names(passes: Iterable[str]) -> None:
    """The installed `prepare_inputs_for_generation` must take what `generate` slices the new tokens by."""
    raise TransformersContractError(
        "model-inputs",
        "GenerationMixin.prepare_inputs_for_generation takes neither `next_sequence_length` (5.x) nor "
        f"`cache_position` (4.x) (of those, it takes {sorted(passes) or 'none'}); hfbridge cannot tell it which "
        "tokens are new, and a model passed directly would be fed the whole sequence on top of its cache",
    )


def check_crop_amount(amount: int) -> None:
    """HF's loop called `crop(amount)` on a cache: in the installed convention (`names.CROP_TAKES_REMOVED`:
    minus the positions to remove, never > 0), or a length to keep (any int is readable)."""
    if names.CROP_TAKES_REMOVED and amount > 0:
        raise TransformersContractError(
            "assisted-crop",
            f"the assisted loop called crop({amount}) on the target's cache, but the installed Cache.crop takes "
            "minus the number of positions to remove (<= 0); the loop and the cache disagree on what crop means",
        )


def check_handed_back(*, drafts: int, handed_back: bool, stray: Iterable[str], cache_name: str) -> None:
    """At draft `drafts` (0 = the first): HF must pass the assistant's cache back under `cache_name`."""
    stray = list(stray)
    if stray or (drafts > 0 and not handed_back):
        got = f"it came back as {stray[0]!r}" if stray else "it did not come back"
        raise TransformersContractError(
            "draft-cache",
            f"at draft {drafts} the assistant's cache was expected as `{cache_name}=` of its generate call, but "
            f"{got}; the assistant would restart from nothing or from a cache holding rejected tokens",
        )


def check_fields(output_class: Any, fields: tuple[str, ...]) -> None:
    """`output_class` (a dataclass, HF's `ModelOutput`) must have every field in `fields`; checked once."""
    _check_fields(output_class, fields)


@functools.cache
def _check_fields(output_class: Any, fields: tuple[str, ...]) -> None:
    known = {field.name for field in dataclasses.fields(output_class)} if dataclasses.is_dataclass(output_class) \
        else set()
    missing = [name for name in fields if name not in known]
    if missing:
        raise TransformersContractError(
            "output-fields",
            f"{output_class.__name__} has no field {', '.join(repr(name) for name in missing)} (its fields: "
            f"{sorted(known)})",
        )


def check_parameters(function: Callable[..., Any], passed: Iterable[str], *, what: str) -> None:
    """`function` (one of HF's loops) must name every keyword in `passed` as a parameter.

    A loop's `**model_kwargs` would swallow a renamed argument silently, so it does not count.
    """
    parameters = _parameters(function)
    missing = [name for name in passed if name not in parameters]
    if missing:
        raise TransformersContractError(
            "loop-signature",
            f"{what} takes no {', '.join(repr(name) for name in missing)} (its parameters: "
            f"{sorted(parameters - {'**', 'self'})})",
        )


@functools.cache
def _parameters(function: Callable[..., Any]) -> frozenset[str]:
    found = set()
    for parameter in inspect.signature(function).parameters.values():
        found.add("**" if parameter.kind is inspect.Parameter.VAR_KEYWORD else parameter.name)
    return frozenset(found)
