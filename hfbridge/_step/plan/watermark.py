"""`watermarking_config=`: HF's own watermark processors, built for the vocabulary hfbridge sees.

HF's `_get_logits_processor` builds the watermark processor from `watermarking_config` with the
vocabulary size of the model's config (`config.construct_processor(vocab_size, device)`), at its
own place in the chain (4.46: before the sampling warpers; 5.x: after them). hfbridge has no model
config, but it sees the logits: `deferred` hands HF's builder a stand-in whose `construct_processor`
returns a `VocabularyWatermark`, which builds HF's processor (`WatermarkLogitsProcessor` or
`SynthIDTextWatermarkLogitsProcessor`, of the installed transformers) from the width of the first
scores it receives. So the processor sits where the installed version puts it, and is HF's own.

>>> import torch
>>> from transformers import WatermarkingConfig
>>> watermark = VocabularyWatermark(WatermarkingConfig(bias=2.0), torch.device("cpu"))
>>> out = watermark(torch.tensor([[3]]), torch.zeros(1, 8))        # 8 tokens: 2 green ones get +2
>>> type(watermark.processor).__name__, sorted(set(out[0].tolist()))
('WatermarkLogitsProcessor', [0.0, 2.0])
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import LogitsProcessor, SynthIDTextWatermarkingConfig, WatermarkingConfig

from hfbridge._step.checks.value_checks import check_flag, check_number, got, is_int

__all__ = ["VocabularyWatermark", "check_watermarking_config", "deferred", "is_synthid"]


def _int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> None:
    if not is_int(value):
        raise TypeError(f"`watermarking_config.{name}` must be an int, got {got(value)}.")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "" if minimum is None else f">= {minimum}"
        high = "" if maximum is None else f"<= {maximum}"
        raise ValueError(f"`watermarking_config.{name}` must be an int {' and '.join(filter(None, (low, high)))}, "
                         f"got {value!r}.")


def _real(name: str, value: Any) -> None:
    check_number(f"watermarking_config.{name}", value, positive=False)


def _flag(name: str, value: Any) -> None:
    check_flag(f"watermarking_config.{name}", value, optional=False)


def check_watermarking_config(value: Any) -> None:
    """`TypeError` / `ValueError` for a `watermarking_config` HF would fail on later, or mid-generation.

    Accepts None, a `WatermarkingConfig`, a `SynthIDTextWatermarkingConfig`, or a dict of
    `WatermarkingConfig`'s arguments (which HF turns into one).

    >>> check_watermarking_config(SynthIDTextWatermarkingConfig(ngram_len=5, keys=[1, 2]))
    >>> check_watermarking_config(SynthIDTextWatermarkingConfig(ngram_len=5, keys="654, 400"))
    Traceback (most recent call last):
    ...
    TypeError: `watermarking_config.keys` must be a non-empty list of int keys (one per depth), got str '654, 400'.
    """
    if value is None:
        return
    if isinstance(value, dict):
        try:
            value = WatermarkingConfig(**value)
        except TypeError as error:
            raise TypeError(f"`watermarking_config` as a dict takes WatermarkingConfig's arguments (greenlist_ratio, "
                            f"bias, hashing_key, seeding_scheme, context_width): {error}") from None
    if isinstance(value, WatermarkingConfig):
        _check_green_list(value)
    elif isinstance(value, SynthIDTextWatermarkingConfig):
        _check_synthid(value)
    else:
        raise TypeError(
            "`watermarking_config` must be a transformers.WatermarkingConfig, a SynthIDTextWatermarkingConfig or a "
            f"dict of WatermarkingConfig's arguments, got {type(value).__name__}."
        )


def _check_green_list(config: WatermarkingConfig) -> None:
    _real("greenlist_ratio", config.greenlist_ratio)
    if not 0.0 < config.greenlist_ratio < 1.0:
        raise ValueError(f"`watermarking_config.greenlist_ratio` must lie strictly between 0 and 1 (the share of "
                         f"green tokens), got {config.greenlist_ratio!r}.")
    _real("bias", config.bias)
    _int("hashing_key", config.hashing_key)
    if config.seeding_scheme not in ("lefthash", "selfhash"):
        raise ValueError(f"`watermarking_config.seeding_scheme` must be 'lefthash' or 'selfhash', "
                         f"got {got(config.seeding_scheme)}.")
    _int("context_width", config.context_width, minimum=1)


def _check_synthid(config: SynthIDTextWatermarkingConfig) -> None:
    keys = config.keys
    if not isinstance(keys, (list, tuple)) or not keys:
        raise TypeError(f"`watermarking_config.keys` must be a non-empty list of int keys (one per depth), "
                        f"got {got(keys)}.")
    for index, key in enumerate(keys):
        if not is_int(key):
            raise TypeError(f"`watermarking_config.keys[{index}]` must be an int, got {got(key)}.")
    _int("ngram_len", config.ngram_len, minimum=2)
    _int("context_history_size", config.context_history_size, minimum=1)
    _int("sampling_table_seed", config.sampling_table_seed)
    _int("sampling_table_size", config.sampling_table_size, minimum=1, maximum=2**24)
    _flag("skip_first_ngram_calls", config.skip_first_ngram_calls)
    _flag("debug_mode", config.debug_mode)


def is_synthid(config: Any) -> bool:
    """Whether `config` is a SynthID Text watermark (stateful from step to step)."""
    return isinstance(config, SynthIDTextWatermarkingConfig)


class VocabularyWatermark(LogitsProcessor):
    """HF's watermark processor for `watermarking_config`, built for the vocabulary of the scores it sees.

    The first call builds `watermarking_config.construct_processor(vocab, device)` with `vocab` the
    scores' width (padded columns already dropped by `vocab_size=`), and every call runs it. A later
    call with another width is refused: the green lists (and SynthID's state) belong to one vocabulary.

    Args:
        watermarking_config: A `WatermarkingConfig` or `SynthIDTextWatermarkingConfig`.
        device: Where HF's processor keeps its tables.

    Attributes:
        processor: HF's processor once built (None before the first call).
    """

    def __init__(self, watermarking_config: WatermarkingConfig | SynthIDTextWatermarkingConfig,
                 device: torch.device | str):
        self.watermarking_config = watermarking_config
        self.device = torch.device(device)
        self.processor: Any = None
        self.vocab_size: int | None = None

    @property
    def display_name(self) -> str:
        """The class of HF's processor this runs (for views and errors)."""
        synthid = is_synthid(self.watermarking_config)
        return "SynthIDTextWatermarkLogitsProcessor" if synthid else "WatermarkLogitsProcessor"

    @property
    def display_params(self) -> dict[str, Any]:
        """The watermark's settings (and the vocabulary once known), for views."""
        params = {name: value for name, value in vars(self.watermarking_config).items()
                  if not name.startswith("_") and (name != "debug_mode" or value)}
        if self.vocab_size is not None:
            params["vocab_size"] = self.vocab_size
        return params

    def __repr__(self) -> str:
        text = ", ".join(f"{name}={value!r}" for name, value in self.display_params.items())
        return f"{self.display_name}({text})"

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vocab = scores.shape[-1]  # [N, V]
        if self.processor is None:
            self.processor = self.watermarking_config.construct_processor(vocab, self.device)
            self.vocab_size = vocab
        elif vocab != self.vocab_size:
            raise ValueError(
                f"the watermark was built for a vocabulary of {self.vocab_size} tokens at the first step, but the "
                f"scores now have {vocab} columns; a watermark belongs to one vocabulary (pass `vocab_size=` "
                "for a padded one)."
            )
        return self.processor(input_ids, scores)


class _Deferred:
    """What HF's `_get_logits_processor` reads as `watermarking_config`: its `construct_processor`
    returns a `VocabularyWatermark` (HF's vocabulary size, from a model config hfbridge lacks, is ignored)."""

    def __init__(self, config: WatermarkingConfig | SynthIDTextWatermarkingConfig):
        self.config = config

    def construct_processor(self, vocab_size: Any, device: Any) -> VocabularyWatermark:
        return VocabularyWatermark(self.config, device if device is not None else "cpu")


def deferred(config: Any, host: Any) -> Any:
    """A shallow copy of the prepared `GenerationConfig` whose watermark HF builds as a `VocabularyWatermark`
    (`config` itself when it has none).

    HF reads the vocabulary size from the model config of `host` (a `ProcessorHost`) before it
    calls `construct_processor`; the host gets a copy of its config with `vocab_size=None` (unused).
    """
    watermark = getattr(config, "watermarking_config", None)
    if watermark is None:
        return config
    model_config = copy.copy(host.config)
    model_config.vocab_size = None
    host.config = model_config
    if isinstance(watermark, dict):
        watermark = WatermarkingConfig(**watermark)
    copied = config.__class__.__new__(config.__class__)
    copied.__dict__.update(config.__dict__)
    copied.__dict__["watermarking_config"] = _Deferred(watermark)
    return copied
