"""``python -m hfbridge doctor``: does hfbridge give transformers' own tokens on the installed versions?

hfbridge runs transformers' own processors and loops, and transformers changes its private code
every few releases. The doctor checks, offline and in seconds, that ``hfbridge.generate`` still
returns exactly what ``model.generate`` returns: tiny random GPT-2 and Llama models are built from
configs with a fixed seed, and every strategy (greedy, sampling, beam search, beam sampling,
assisted decoding, prompt lookup) runs through hfbridge with the model in each form users pass —
a plain callable (``model(input_ids, attention_mask) -> logits``), a ``ReturnsCache`` model
(``model(input_ids, cache, attention_mask) -> (logits, cache)``) and the ``PreTrainedModel``
itself — and through transformers' ``model.generate``. It prints a table; the exit status is 1
when any check differs or raises, and the check is named.

>>> check = Check("greedy", "gpt2", "plain callable")
>>> run_check(check, lambda: torch.tensor([[1, 2, 3]]), lambda: torch.tensor([[1, 2, 4]])).status
'MISMATCH'
>>> check.detail
'row 0 differs from position 2: transformers 4, hfbridge 3'
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, TextIO

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import hfbridge
from hfbridge import ReturnsCache, generate

__all__ = ["FORMS", "STRATEGIES", "Check", "run_check", "run_doctor"]

VOCAB, NEW = 64, 10
EOS, PAD = 63, 0

#: strategy -> generate options (the same for hfbridge and transformers)
STRATEGIES: dict[str, dict[str, Any]] = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.2),
    "beam search": dict(num_beams=3),
    "beam sampling": dict(num_beams=3, do_sample=True, temperature=0.9),
    "assisted": dict(do_sample=False),  # + assistant_model: the same family, other weights
    "prompt lookup": dict(do_sample=False, prompt_lookup_num_tokens=3),
}
_ONE_PROMPT = ("assisted", "prompt lookup")  # HF's assisted loop takes one sequence

#: form name -> how a user would wrap the HF model for hfbridge
FORMS = ("plain callable", "ReturnsCache", "PreTrainedModel")


@dataclasses.dataclass
class Check:
    """One cell of the table: a strategy, a model and a form, and what came of it."""

    strategy: str
    model: str
    form: str
    status: str = "?"  # "ok", "MISMATCH", "ERROR"
    detail: str = ""

    @property
    def name(self) -> str:
        return f"{self.strategy} / {self.model} / {self.form}"


def _build(name: str, seed: int) -> Any:
    torch.manual_seed(seed)
    if name == "gpt2":
        config: Any = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                 bos_token_id=None, eos_token_id=None)
        return GPT2LMHeadModel(config).eval()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids from the mask, as HF's generate makes them (`(batch, seq)`)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _cache_name(hf: Any) -> str:
    parameters = inspect.signature(hf.forward).parameters
    return "cache" if "cache" in parameters and "past_key_values" not in parameters else "past_key_values"


def plain_callable(hf: Any) -> Callable[..., torch.Tensor]:
    """`hf` as a user's plain model: `model(input_ids, attention_mask) -> logits [B, T, V]`, no cache."""
    def model(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return hf(input_ids, attention_mask=attention_mask, position_ids=_positions(attention_mask),
                  use_cache=False).logits
    return model


def returns_cache(hf: Any) -> ReturnsCache:
    """`hf` as a user's KV-cache model: `model(input_ids, cache, attention_mask) -> (logits, cache)`."""
    name = _cache_name(hf)

    def model(input_ids: torch.Tensor, cache: Any, attention_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        position_ids = _positions(attention_mask)[:, -input_ids.shape[1]:]
        out = hf(input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                 **{name: cache})
        return out.logits, getattr(out, name)
    return ReturnsCache(model)


def _wrap(form: str, hf: Any) -> Any:
    if form == "plain callable":
        return plain_callable(hf)
    if form == "ReturnsCache":
        return returns_cache(hf)
    return hf


def _prompts(strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    if strategy in _ONE_PROMPT:
        ids = torch.tensor([[5, 9, 13, 5, 9, 13, 5, 9]])  # repeats: prompt lookup finds drafts
        return ids, torch.ones_like(ids)
    ids = torch.tensor([[5, 9, 13, 2, 7, 21], [PAD, PAD, 3, 4, 11, 40]])  # the second row left-padded
    return ids, torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])


def run_check(check: Check, ours: Callable[[], Any], theirs: Callable[[], Any]) -> Check:
    """Fill `check` from hfbridge's and transformers' results (each from a seeded call)."""
    try:
        torch.manual_seed(0)
        expected = theirs()
    except Exception as error:  # transformers' own generate failed: nothing to compare with
        check.status, check.detail = "n/a", f"transformers' own generate raised {_one_line(error)}"
        return check
    try:
        torch.manual_seed(0)
        got = ours()
    except Exception as error:
        check.status, check.detail = "ERROR", f"hfbridge raised {_one_line(error)}"
        return check
    if torch.equal(got, expected):
        check.status = "ok"
    else:
        check.status, check.detail = "MISMATCH", _difference(got, expected)
    return check


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    place = f" (at {where.name}, {where.filename.rsplit('/', 1)[-1]}:{where.lineno})" if where else ""
    return f"{type(error).__name__}: {text[0] if text else ''}{place}"


def _difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, transformers {tuple(expected.shape)}"
    for row in range(got.shape[0]):
        differ = (got[row] != expected[row]).nonzero()
        if differ.numel():
            at = int(differ[0, 0])
            return (f"row {row} differs from position {at}: transformers {int(expected[row, at])}, "
                    f"hfbridge {int(got[row, at])}")
    return "equal"  # pragma: no cover - torch.equal said otherwise


def checks(models: tuple[str, ...] = ("gpt2", "llama")) -> list[Check]:
    """Run every check (strategies x models x forms) and return them, in table order."""
    done = []
    for strategy, options in STRATEGIES.items():
        for name in models:
            hf = _build(name, seed=0)
            draft = _build(name, seed=1) if strategy == "assisted" else None
            ids, mask = _prompts(strategy)
            common = dict(attention_mask=mask, max_new_tokens=NEW, eos_token_id=EOS, pad_token_id=PAD, **options)
            # A plain callable recomputes every step: compare with transformers without its cache
            # (assisted decoding needs one in transformers).
            for form in FORMS:
                recompute = form == "plain callable" and strategy not in _ONE_PROMPT
                extra = {} if draft is None else {"assistant_model": _wrap(form, draft)}
                hf_extra = {} if draft is None else {"assistant_model": draft}

                def ours(form: str = form, extra: dict = extra) -> Any:
                    return generate(_wrap(form, hf), ids, **common, **extra)

                def theirs(recompute: bool = recompute, hf_extra: dict = hf_extra) -> Any:
                    saved = None if draft is None else copy.deepcopy(draft.generation_config)
                    try:
                        return hf.generate(ids, use_cache=not recompute, **common, **hf_extra)
                    finally:  # transformers writes into its assistant's generation_config
                        if draft is not None:
                            draft.generation_config = saved

                done.append(run_check(Check(strategy, name, form), ours, theirs))
    return done


def _versions() -> str:
    return (f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"hfbridge {hfbridge.__version__}")


def table(done: list[Check]) -> str:
    """The checks as a text table: one row per strategy and model, one column per form."""
    header = ["strategy", "model", *FORMS]
    rows = [header]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for check in done:
        cells.setdefault((check.strategy, check.model), {})[check.form] = check.status
    for (strategy, model), by_form in cells.items():
        rows.append([strategy, model, *(by_form.get(form, "") for form in FORMS)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def run_doctor(out: TextIO | None = None, *, threads: int = 1) -> int:
    """Print the versions, the table and any failure to `out` (stdout); returns the exit status (0: all ok)."""
    out = out if out is not None else sys.stdout
    print(f"hfbridge doctor: {_versions()}", file=out)
    print("hfbridge.generate vs transformers' model.generate, on tiny random models built offline "
          f"(vocabulary {VOCAB}, {NEW} new tokens, seed 0):\n", file=out, flush=True)
    start = time.perf_counter()
    saved_threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            verbosity = transformers.logging.get_verbosity()
            transformers.logging.set_verbosity_error()
            try:
                done = checks()
            finally:
                transformers.logging.set_verbosity(verbosity)
    finally:
        torch.set_num_threads(saved_threads)
        torch.set_grad_enabled(grad)
    print(table(done), file=out)
    failed = [check for check in done if check.status not in ("ok", "n/a")]
    skipped = [check for check in done if check.status == "n/a"]
    if skipped or failed:
        print(file=out)
    for check in skipped + failed:
        print(f"{check.status}  {check.name}: {check.detail}", file=out)
    seconds = time.perf_counter() - start
    if failed:
        print(f"\n{len(failed)} of {len(done)} checks FAILED ({seconds:.1f}s): on these versions hfbridge does not "
              "give transformers' tokens for the checks named above. Use a transformers release that passes (the "
              "README lists the tested ones) and report this output to hfbridge.", file=out)
        return 1
    print(f"\nall {len(done) - len(skipped)} checks passed ({seconds:.1f}s).", file=out)
    return 0
