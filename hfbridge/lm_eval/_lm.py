"""`HFBridgeLM`: lm-evaluation-harness's `LM` for any model `hfbridge.generate` takes.

It is HFLM's behaviour (`lm_eval/models/huggingface.py`) without HFLM's loading: the same
tokenization (`tok_encode`, lm-eval's own `_encode_pair` and empty-context rule, inherited from
`TemplateLM`), the same batching (lm-eval's `Collator`, longest first), the same maximum length and
truncation, the same rolling windows (lm-eval's `get_rolling_token_windows`), the same stop-sequence
handling and post-processing; only the model call differs. Scoring is one forward pass per batch
(`_scoring.py`); generation is `hfbridge.generate` (`_generation.py`), so every hfbridge option and
sampler is available.

>>> import torch
>>> from tokenizers import Tokenizer, models, pre_tokenizers
>>> from transformers import PreTrainedTokenizerFast
>>> words = {w: i for i, w in enumerate(["<eos>", "a", "b", "c"])}
>>> raw = Tokenizer(models.WordLevel(words, unk_token="<eos>"))
>>> raw.pre_tokenizer = pre_tokenizers.Whitespace()
>>> tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
>>> lm = HFBridgeLM(lambda ids: torch.zeros(*ids.shape, 4), tok, max_length=16)
>>> lm.tok_encode("a b c"), lm.max_length, lm.prefix_token_id
([1, 2, 3], 16, 0)
"""

from __future__ import annotations

import logging
from typing import Any

import jinja2
import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import has_bos_prefix, resolve_max_length

from hfbridge import ModelAdapter, Recompute
from hfbridge.lm_eval import _distributed
from hfbridge.lm_eval._building import resolve_model, resolve_tokenizer
from hfbridge.lm_eval._generation import generate_until
from hfbridge.lm_eval._scoring import ModelScorer, loglikelihood_tokens

__all__ = ["HFBridgeLM"]

_log = logging.getLogger(__name__)
DEFAULT_MAX_LENGTH = 2048  # lm-eval's DEFAULT_MAX_LENGTH, HFLM's fallback


class HFBridgeLM(TemplateLM):
    """An lm-evaluation-harness `LM` for any model form `hfbridge.generate` takes.

    `loglikelihood`, `loglikelihood_rolling` and `generate_until` give HFLM's results for an HF
    model, and the same computations for a plain callable `model(input_ids) -> logits`, an adapter
    (`Recompute`, `InputPos`, `ReturnsCache`, `Hooks`, your own `ModelAdapter`) or a
    `PreTrainedModel`. Registered with lm-eval as `"hfbridge"` when `hfbridge.lm_eval` is imported.

    Args:
        model: The model, or (from lm-eval's command line) a string `"package.module:function"`
            naming a function that returns it (called without arguments).
        tokenizer: A transformers tokenizer, or a name or path for `AutoTokenizer.from_pretrained`.
            Never modified (HFLM sets a pad token on it; this reads one: pad, else unk, else eos).
        batch_size: Requests per forward pass or `generate` call, a positive int (or its string,
            as the command line passes it). Default: 1.
        max_length: The longest sequence the model is fed, in tokens. Default: as HFLM
            (`model.config`'s `n_positions` / `max_position_embeddings` / `n_ctx`, else the
            tokenizer's `model_max_length`, else 2048); a `Recompute(model, max_context=N)` gives N.
        max_gen_toks: New tokens per `generate_until` request when the task does not say. Default: 256.
        device: Where the token ids go; a model given as a string that is an `nn.Module` is moved
            there (a CUDA device on a machine without CUDA means the CPU, as in HFLM). Default: the
            device of the model's first parameter, else the CPU.
        add_bos_token: As HFLM's: `add_special_tokens` for every encoding. Default: the tokenizer's.
        prefix_token_id: The token an empty context is replaced by. Default: bos, else eos.
        truncation: As HFLM's: let the tokenizer truncate prompts for `generate_until`. Default: False.
        logits_cache: As HFLM's: score one-token continuations of one context with one forward
            pass. Default: True.
        think_end_token: As HFLM's: keep only the generated text after this string or token id.
        chat_template_args: Extra keyword arguments of `tokenizer.apply_chat_template`.
        max_batch_size: Accepted and ignored (lm-eval passes it; there is no automatic batch size).
        **generate_defaults: Options for every `hfbridge.generate` call (`top_k`, `repetition_penalty`,
            `dry_multiplier`, `fast`, `check_every`, ...; a request's own `gen_kwargs` win).
            `layout` and `vocab_size` also apply to scoring.

    Raises:
        TypeError / ValueError: for a bad argument, naming it.

    >>> import torch
    >>> from tokenizers import Tokenizer, models
    >>> from transformers import PreTrainedTokenizerFast
    >>> raw = Tokenizer(models.WordLevel({"<eos>": 0, "x": 1}, unk_token="<eos>"))
    >>> tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    >>> HFBridgeLM(lambda ids: torch.zeros(*ids.shape, 2), tok, batch_size="4").batch_size
    4
    """

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int | str = 1, max_length: int | None = None,
                 max_gen_toks: int = 256, device: str | torch.device | None = None,
                 add_bos_token: bool | None = None, prefix_token_id: int | None = None, truncation: bool = False,
                 logits_cache: bool = True, think_end_token: str | int | None = None,
                 chat_template_args: dict[str, Any] | None = None, max_batch_size: int | None = None,
                 **generate_defaults: Any):
        super().__init__()
        # the cheap checks first: a bad argument is named before any model is built
        self.batch_size_per_gpu = _positive_int("batch_size", batch_size)
        self._max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
        self._max_length = None if max_length is None else _positive_int("max_length", max_length)
        for name, flag in (("add_bos_token", add_bos_token), ("truncation", truncation),
                           ("logits_cache", logits_cache)):
            if flag is not None and not isinstance(flag, bool):
                raise TypeError(f"`{name}` must be True or False, got {flag!r}.")
        self.add_bos_token = add_bos_token
        self.truncation = truncation
        self.logits_cache = logits_cache
        if prefix_token_id is not None and (isinstance(prefix_token_id, bool) or not isinstance(prefix_token_id, int)):
            raise TypeError(f"`prefix_token_id` must be a token id (int), got {prefix_token_id!r}.")
        self.custom_prefix_token_id = prefix_token_id
        self.think_end_token = (int(think_end_token) if isinstance(think_end_token, str) and think_end_token.isdigit()
                                else think_end_token)
        if chat_template_args is not None and not isinstance(chat_template_args, dict):
            raise TypeError(f"`chat_template_args` must be a dict, got {type(chat_template_args).__name__}.")
        self.chat_template_args = dict(chat_template_args or {})
        _check_generate_defaults(generate_defaults)
        self.generate_defaults = generate_defaults
        requested = _requested_device(device)
        self._rank, self._world_size = _distributed.rank_and_size()
        requested = _distributed.rank_device(requested, self._world_size)
        self.model = resolve_model(model, requested)
        self.tokenizer = resolve_tokenizer(tokenizer)
        self._device = requested or _device_of(self.model)
        self.scorer = ModelScorer(self.model, layout=generate_defaults.get("layout"),
                                  vocab_size=generate_defaults.get("vocab_size"))
        inner = self.model.model if isinstance(self.model, ModelAdapter) else self.model
        if isinstance(inner, torch.nn.Module) and inner.training:  # HFLM calls eval() on it; this leaves it as given
            _log.warning("the model is in training mode (dropout is on): call model.eval() before evaluating it.")
        del max_batch_size  # lm-eval's evaluator passes it to every model; no automatic batch size here

    # --- what lm-eval reads -------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return self._max_length
        if isinstance(self.model, Recompute) and self.model.max_context is not None:
            return self.model.max_context
        inner = self.model.model if isinstance(self.model, ModelAdapter) else self.model
        return resolve_max_length(getattr(inner, "config", None), self.tokenizer, default=DEFAULT_MAX_LENGTH)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_gpu

    @property
    def pad_token_id(self) -> int:
        """The id that pads prompts and finished rows: the tokenizer's pad, else unk, else eos, else 0."""
        for name in ("pad_token_id", "unk_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, name, None)
            if value is not None:
                return value
        return 0

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    # --- tokens -------------------------------------------------------------------------------
    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        """HFLM's `tok_encode`: no special tokens when `string` starts with the prefix token's text."""
        special = ({"add_special_tokens": add_special_tokens} if add_special_tokens is not None
                   else {"add_special_tokens": self.add_bos_token} if self.add_bos_token is not None else {})
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        encoding = self.tokenizer.encode(string, **special)
        return encoding[-left_truncate_len:] if left_truncate_len else encoding

    def tok_batch_encode(self, strings: list[str], left_truncate_len: int | None = None,
                         truncation: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """HFLM's `tok_batch_encode`: left-padded ids and mask `(batch, seq)`, the last `left_truncate_len`
        columns. The tokenizer is not touched (HFLM sets its padding side and pad token)."""
        special: dict[str, bool] = {}
        if has_bos_prefix(strings[0], getattr(self.tokenizer, "bos_token", None)):  # HFLM reads the first only
            special = {"add_special_tokens": False}
        elif self.add_bos_token is not None:
            special = {"add_special_tokens": self.add_bos_token}
        rows = self.tokenizer(strings, truncation=truncation, padding=False, **special)["input_ids"]
        if left_truncate_len:
            rows = [row[-left_truncate_len:] for row in rows]
        width = max(len(row) for row in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)  # [B, T]
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
                mask[i, width - len(row):] = 1
        return ids, mask

    def tok_decode(self, tokens: list[int] | int, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    # --- the three request types --------------------------------------------------------------
    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False, override_bs: int | None = None,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        return loglikelihood_tokens(self, requests, batch_size=override_bs or self.batch_size,
                                    disable_tqdm=disable_tqdm or self.rank != 0)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """HFLM's `loglikelihood_rolling`: each text in disjoint windows of `max_length` tokens, summed."""
        windows = []  # (request index, (None, context tokens, continuation tokens))
        counts = []
        for index, (string,) in enumerate(request.args for request in requests):
            pairs = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1))
            mine = [(index, (None, *pair)) for pair in pairs]
            windows.extend(mine)
            counts.append(len(mine))
        padding = _distributed.pad_to_longest_rank(self, windows)
        scores: list[float] = []
        for start in range(0, len(windows), self.batch_size):
            batch = [window for _, window in windows[start:start + self.batch_size]]
            scores.extend(score for score, _ in loglikelihood_tokens(
                self, batch, batch_size=len(batch), disable_tqdm=True))
        if padding:
            scores = scores[:-padding]
        totals = []
        position = 0
        for index, count in enumerate(counts):
            total = sum(scores[position:position + count])
            position += count
            totals.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (requests[index].args[0],), total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        return generate_until(self, requests, disable_tqdm=disable_tqdm or self.rank != 0)

    # --- chat templates -----------------------------------------------------------------------
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """HFLM's: the tokenizer's chat template; without the system turns when the template refuses them."""
        options = {"tokenize": False, "add_generation_prompt": add_generation_prompt,
                   "continue_final_message": not add_generation_prompt, **self.chat_template_args}
        try:
            return self.tokenizer.apply_chat_template(chat_history, **options)
        except jinja2.exceptions.TemplateError:
            _log.warning("Failed to apply chat template. removing the system role in chat history.")
            kept = [message for message in chat_history if message["role"] != "system"]
            return self.tokenizer.apply_chat_template(kept, **options)

    # --- data parallel (see `_distributed.py`) ------------------------------------------------
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return _distributed.all_gather(tensor, self.world_size)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return _distributed.gather_object(obj, self.rank, self.world_size, dst)

    def barrier(self) -> None:
        _distributed.barrier(self.world_size)

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval writes into its results' `config`: the model's class and parameter count."""
        inner = self.model.model if isinstance(self.model, ModelAdapter) else self.model
        parameters = sum(p.numel() for p in inner.parameters()) if isinstance(inner, torch.nn.Module) else -1
        return {"model_class": type(inner).__name__, "model_num_parameters": parameters}


# generate keywords that each request sets itself, and what to pass instead
_PER_REQUEST = {"max_new_tokens": "max_gen_toks=", "max_length": "max_gen_toks=", "attention_mask": None,
                "input_ids": None, "num_return_sequences": None, "return_dict_in_generate": None, "streamer": None}


def _check_generate_defaults(options: dict[str, Any]) -> None:
    for name in options:
        if name in _PER_REQUEST:
            instead = _PER_REQUEST[name]
            raise ValueError(f"`{name}` cannot be a generate default of HFBridgeLM: each request sets it"
                             + (f"; pass {instead} (new tokens per request) instead." if instead else "."))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        hint = " (no automatic batch size: pass a number)" if name == "batch_size" else ""
        raise ValueError(f"`{name}` must be a positive int{hint}, got {value!r}.")
    return value


def _requested_device(device: str | torch.device | None) -> torch.device | None:
    """`device` as a `torch.device`; a CUDA device without CUDA is the CPU, as HFLM treats lm-eval's default
    `--device cuda:0` on a machine without one."""
    if device is None:
        return None
    try:
        requested = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"`device` must name a torch device ('cpu', 'cuda', 'cuda:1'), got {device!r}.") from error
    if requested.type == "cuda" and not torch.cuda.is_available():
        _log.warning("`device`=%r, but CUDA is not available: using the CPU.", str(device))
        return torch.device("cpu")
    return requested


def _device_of(model: Any) -> torch.device:
    """The device of the model's first parameter, else the CPU."""
    inner = model.model if isinstance(model, ModelAdapter) else model
    if isinstance(inner, torch.nn.Module):
        for parameter in inner.parameters():
            return parameter.device
    return torch.device("cpu")
