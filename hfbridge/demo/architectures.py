"""Every causal language model of the installed transformers, built tiny and checked against its own `generate`.

`python -m hfbridge doctor --all-architectures` and the test suite share this sweep. Each class of
transformers' `MODEL_FOR_CAUSAL_LM_MAPPING` is built offline from its config class with random
weights and shrunk sizes (two layers, width 32, a vocabulary of 128; `FAMILY_FIXES` for the
families whose defaults need more), passed to `hfbridge.generate` directly, and compared with its
own `model.generate`:

- greedy on a left-padded batch of two: equal tokens, equal logits at every step, and every model
  call fed what HF's own loop feeds it (the prompt once, then one token per call);
- sampling under one seed: equal tokens;
- beam search (3 beams): equal tokens.

A class HF's own `generate` cannot run (it raises) is `n/a` with HF's error; a class that cannot be
built tiny is skipped with the reason.

>>> row = check_architecture("GPT2LMHeadModel")
>>> row.built, row.status["greedy"], row.status["sampling"], row.status["beams"]
(True, 'ok', 'ok', 'ok')
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import torch
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from hfbridge import generate

__all__ = ["FAMILY_FIXES", "STRATEGIES", "ArchitectureCheck", "build_tiny", "causal_lm_classes", "check_architecture",
           "run_all_architectures", "sweep", "sweep_table"]

VOCAB, NEW = 128, 8
PAD = 0
STRATEGIES = ("greedy", "sampling", "beams")

#: config attribute -> the tiny value (set where the config class has the attribute)
SHRINK: dict[str, Any] = {
    "vocab_size": VOCAB,
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim", "n_embed", "d_embed", "emb_dim", "dim",
                     "model_dim", "word_embed_proj_dim", "embedding_size", "hidden_dim"), 32),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "d_ff", "d_inner", "ffn_hidden_size",
                     "decoder_ffn_dim", "inner_hidden_size", "mlp_dim"), 64),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_hidden_size",
                     "moe_ffn_hidden_size"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
                     "num_query_groups"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "attention_head_dim", "d_head", "qk_rope_head_dim",
                     "v_head_dim", "qk_nope_head_dim", "mamba_headdim"), 8),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length",
                     "max_seq_len"), 128),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k_experts"), 2),
    **dict.fromkeys(("state_size", "mamba_d_state", "ssm_state_size", "d_state"), 8),
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank"), 16),
    "n_shared_experts": 1,
    "rotary_dim": 4,
    "time_step_rank": 8,
    "mamba_n_heads": 8,
    "n_mamba_heads": 8,
}

#: class name -> {config attribute: value}: what a family needs beyond `SHRINK` to build tiny and run
FAMILY_FIXES: dict[str, dict[str, Any]] = {
    # hybrids: one layer of each kind, so that the cache has attention layers as well as recurrent ones
    "BambaForCausalLM": {"attn_layer_indices": [1]},
    "NemotronHForCausalLM": {"layers_block_type": ["linear_attention", "full_attention"]},
    "RecurrentGemmaForCausalLM": {"block_types": ["recurrent", "attention"]},
    "Dots3NoteForCausalLM": {"num_key_value_heads": 4},
    "Gemma4AssistantForCausalLM": {"hidden_size_per_layer_input": 0},
    "Mamba2ForCausalLM": {"num_heads": 8, "n_groups": 1},  # hidden_size * expand == num_heads * head_dim
    "ReformerModelWithLMHead": {"is_decoder": True, "axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 16],
                                "attn_layers": ["local", "local"]},
    # two hybrid layers: Zamba ties the shared transformer block of every hybrid layer to the first one's
    "ZambaForCausalLM": {"num_hidden_layers": 4,
                         "layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"]},
    "ZayaForCausalLM": {"num_experts_per_tok": 1},
    "JambaForCausalLM": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
                         "expert_layer_offset": 1},
    # the default suppresses token 220, outside the tiny vocabulary (hfbridge refuses such ids, HF ignores them)
    "WhisperForCausalLM": {"begin_suppress_tokens": None, "suppress_tokens": None},
}


@dataclasses.dataclass
class ArchitectureCheck:
    """One class of the sweep: built or why not, and each strategy's status ("ok", "MISMATCH", "n/a", "ERROR")."""

    name: str
    built: bool = False
    skipped: str = ""
    status: dict[str, str] = dataclasses.field(default_factory=dict)
    detail: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def matched(self) -> bool:
        """Built, and no strategy differs from or fails where HF's own `generate` runs."""
        return self.built and all(value in ("ok", "n/a") for value in self.status.values())


def causal_lm_classes() -> list[tuple[str, str]]:
    """`(model_type, class name)` of every entry of the installed `MODEL_FOR_CAUSAL_LM_MAPPING`, in its order."""
    found: dict[str, str] = {}
    for model_type, names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        name = names[0] if isinstance(names, (tuple, list)) else names
        found.setdefault(name, model_type)  # a class listed under two model types is checked once
    return [(model_type, name) for name, model_type in found.items()]


def _shrunk(config_class: Any, overrides: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """Keyword arguments for `config_class(...)`: every `SHRINK` attribute it has, and its sub-configs shrunk."""
    try:
        default = config_class()
    except Exception:  # a config class whose defaults do not validate takes the family's fixes first
        default = config_class(**overrides)
    kwargs: dict[str, Any] = {}
    for name, value in SHRINK.items():
        if name in default.__dict__ or name in getattr(default, "attribute_map", {}):
            kwargs[name] = value
    for name in getattr(config_class, "sub_configs", None) or {}:
        sub = getattr(default, name, None)
        if depth < 2 and sub is not None and hasattr(sub, "to_dict"):
            kwargs[name] = {"model_type": sub.model_type, **_shrunk(type(sub), {}, depth + 1)}
    layers = _layer_count(default)
    for name, value in vars(default).items():
        if layers is not None and isinstance(value, (list, tuple)) and len(value) == layers and layers > 2:
            kwargs[name] = _two_layers(list(value))
        elif name not in ("id2label", "label2id") and isinstance(value, dict) and value \
                and all(isinstance(key, int) for key in value):  # per-layer entries
            kwargs[name] = {key: entry for key, entry in value.items() if key < 2}
        elif isinstance(value, int) and not isinstance(value, bool) and name.endswith(("_token_id", "_token_index")) \
                and value >= VOCAB:
            kwargs[name] = VOCAB - 1 - len([k for k in kwargs if k.endswith(("_token_id", "_token_index"))])
    if "kv_lora_rank" in default.__dict__:  # multi-head latent attention: as many key/value heads as heads
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    kwargs.update(overrides)
    return kwargs


_LAYER_NAMES = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")


def _layer_count(config: Any) -> int | None:
    for name in _LAYER_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _two_layers(types: list[Any]) -> list[Any]:
    """Two layers' entries of a per-layer list, each kind of layer once where there are two kinds."""
    kinds = list(dict.fromkeys(map(repr, types)))
    first = [types[[repr(t) for t in types].index(kind)] for kind in kinds[:2]]
    return (first * 2)[:2]


def build_tiny(model_type: str, name: str, seed: int = 0) -> Any:
    """The class `name` of transformers, built with random weights (`seed`) from its tiny config, in eval mode."""
    cls = getattr(transformers, name)
    config_class = cls.config_class
    config = config_class(**_shrunk(config_class, FAMILY_FIXES.get(name, {})))
    config.pad_token_id = PAD
    for text in (config, getattr(config, "text_config", None)):
        if text is not None:
            text.pad_token_id = PAD
    torch.manual_seed(seed)
    return cls(config).eval()


@dataclasses.dataclass
class _Fed:
    """The sequence lengths of every model call (`input_ids` or `inputs_embeds`), recorded by a forward pre-hook."""

    lengths: list[tuple[int, ...]] = dataclasses.field(default_factory=list)

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        self.lengths.append(tuple(ids.shape[:2]) if ids is not None else ())


@dataclasses.dataclass
class _Run:
    result: Any
    fed: list[tuple[int, ...]]


def _run(model: Any, call: Callable[[], Any]) -> _Run:
    fed = _Fed()
    handle = model.register_forward_pre_hook(fed, with_kwargs=True)
    try:
        torch.manual_seed(0)
        return _Run(call(), fed.lengths)
    finally:
        handle.remove()


PROMPTS = torch.tensor([[5, 9, 13, 2, 7, 21], [PAD, PAD, 3, 4, 11, 40]])  # [2, 6], the second row left-padded
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])

_OPTIONS: dict[str, dict[str, Any]] = {
    "greedy": dict(do_sample=False, output_logits=True, return_dict_in_generate=True),
    "sampling": dict(do_sample=True, temperature=0.9, top_k=20),
    "beams": dict(num_beams=3, do_sample=False),
}


def _compare(strategy: str, ours: _Run, theirs: _Run) -> str:
    """"" when equal, else what differs first."""
    if strategy == "greedy":
        got, expected = ours.result.sequences, theirs.result.sequences
    else:
        got, expected = ours.result, theirs.result
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, transformers {tuple(expected.shape)}"
    if not torch.equal(got, expected):
        row, at = (got != expected).nonzero()[0].tolist()
        return (f"row {row} differs at position {at}: transformers {int(expected[row, at])}, "
                f"hfbridge {int(got[row, at])}")
    if strategy == "greedy":
        for step, (a, b) in enumerate(zip(ours.result.logits, theirs.result.logits)):
            if not torch.equal(a, b):
                return f"logits of step {step} differ by {float((a - b).abs().max()):.2g}"
        if ours.fed != theirs.fed:
            return f"model calls fed {ours.fed}, transformers feeds {theirs.fed}"
    return ""


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    place = f" (at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})" if where else ""
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}{place}"


def check_architecture(name: str, model_type: str | None = None, strategies: tuple[str, ...] = STRATEGIES
                       ) -> ArchitectureCheck:
    """Build the class `name` tiny and compare `hfbridge.generate` with its own `generate` for each strategy."""
    if model_type is None:
        model_type = next(kind for kind, cls in causal_lm_classes() if cls == name)
    row = ArchitectureCheck(name)
    with warnings.catch_warnings(), torch.no_grad(), _quiet():
        warnings.simplefilter("ignore")
        try:
            model = build_tiny(model_type, name)
        except Exception as error:
            row.skipped = f"does not build tiny offline: {_one_line(error)}"
            return row
        row.built = True
        for strategy in strategies:
            options = dict(attention_mask=MASK, max_new_tokens=NEW, pad_token_id=PAD, eos_token_id=None,
                           **_OPTIONS[strategy])
            try:
                theirs = _run(model, lambda: model.generate(PROMPTS, **options))
            except Exception as error:
                row.status[strategy] = "n/a"
                row.detail[strategy] = f"transformers' own generate raised {_one_line(error)}"
                continue
            try:
                ours = _run(model, lambda: generate(model, PROMPTS, **options))
            except Exception as error:
                row.status[strategy], row.detail[strategy] = "ERROR", f"hfbridge raised {_one_line(error)}"
                continue
            difference = _compare(strategy, ours, theirs)
            row.status[strategy] = "MISMATCH" if difference else "ok"
            if difference:
                row.detail[strategy] = difference
    return row


class _quiet:
    """transformers' logging at error level for the sweep (its warnings about tiny configs are noise here)."""

    def __enter__(self) -> None:
        self.level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()

    def __exit__(self, *exc: Any) -> None:
        transformers.logging.set_verbosity(self.level)


def sweep(names: list[str] | None = None) -> Iterator[ArchitectureCheck]:
    """`check_architecture` for every causal-LM class (or those in `names`), in the mapping's order."""
    for model_type, name in causal_lm_classes():
        if names is None or name in names:
            yield check_architecture(name, model_type)


def sweep_table(rows: list[ArchitectureCheck]) -> str:
    """The rows as a text table (class, greedy, sampling, beams), then a line per skipped, n/a or failed check."""
    header = ["class", *STRATEGIES]
    lines = [header] + [[row.name, *(row.status.get(s, "skipped" if not row.built else "")
                                     for s in STRATEGIES)] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    notes = []
    for row in rows:
        if not row.built:
            notes.append(f"skipped   {row.name}: {row.skipped}")
        for strategy, detail in row.detail.items():
            notes.append(f"{row.status[strategy]:<9} {row.name} / {strategy}: {detail}")
    return "\n".join(text + ([""] + notes if notes else []))


def counts(rows: list[ArchitectureCheck]) -> str:
    """One line: classes in the mapping, built, matched, skipped (and HF's own failures)."""
    built = [row for row in rows if row.built]
    matched = [row for row in built if row.matched]
    hf_fails = [row for row in built if row.status and all(value == "n/a" for value in row.status.values())]
    return (f"{len(rows)} causal-LM classes: {len(built)} built tiny, {len(matched)} match transformers wherever its "
            f"own generate runs ({len(hf_fails)} of them where it runs none of the strategies), "
            f"{len(built) - len(matched)} differ or fail, {len(rows) - len(built)} skipped (not built)")


def run_all_architectures(out: TextIO | None = None, names: list[str] | None = None) -> int:
    """Print the sweep's table and counts to `out` (stdout); returns 1 when any built class differs or fails."""
    out = out if out is not None else sys.stdout
    print("hfbridge.generate(model, ...) vs model.generate(...) for every causal LM of transformers "
          f"{transformers.__version__}, built tiny offline (vocabulary {VOCAB}, {NEW} new tokens, seed 0): greedy "
          "on a left-padded batch (tokens, step logits, lengths fed to each model call), sampling, beam search\n",
          file=out, flush=True)
    rows = list(sweep(names))
    print(sweep_table(rows), file=out)
    print(f"\n{counts(rows)}", file=out)
    return 0 if all(row.matched for row in rows if row.built) else 1
