"""Which decoding strategy a prepared `GenerationConfig` selects, and the ones `generate` refuses.

HF's `GenerationConfig.get_generation_mode()` names the strategy; `strategies.py` maps each one
hfbridge runs (`SUPPORTED`) to its runner: greedy search and sampling in hfbridge's own loop,
beam search and beam sampling in HF's own loop (`hf_loops/beam.py`), assisted and prompt-lookup
decoding in HF's own loop too (`hf_loops/assisted.py`). Group
beam search, constrained beam search, DoLa and contrastive search are refused: transformers 5
moved them out of its core into `custom_generate` repositories on the Hub
(`transformers-community/...`, loaded with `trust_remote_code=True`; 4.x still ran them from its
core), and DoLa and contrastive search also read hidden states that a plain callable does not return.
"""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig

GREEDY_AND_SAMPLING = ("greedy_search", "sample")
BEAM = ("beam_search", "beam_sample")
ASSISTED = "assisted_generation"
SUPPORTED = (*GREEDY_AND_SAMPLING, *BEAM, ASSISTED)  # the rows of `strategies.STRATEGIES` (a test checks)

# mode -> (the options that select it, HF's Hub repository since transformers 5, what else stands in the way)
MOVED_OUT_OF_HF_CORE = {
    "group_beam_search": ("num_beam_groups > 1", "transformers-community/group-beam-search",
                          "hfbridge runs the strategies of HF's core loops only"),
    "constrained_beam_search": ("constraints / force_words_ids", "transformers-community/constrained-beam-search",
                                "hfbridge runs the strategies of HF's core loops only"),
    "dola_generation": ("dola_layers", "transformers-community/dola",
                        "it also contrasts the hidden states of early layers, which a callable does not return"),
    "contrastive_search": ("penalty_alpha > 0 with top_k > 1", "transformers-community/contrastive-search",
                           "it also re-ranks candidates with the model's hidden states"),
}


def mode_of(config: GenerationConfig, assistant_model: Any = None) -> str:
    """The name of the strategy `config` selects (HF's `GenerationMode` value), with a draft model or not.

    >>> mode_of(GenerationConfig(num_beams=3)), mode_of(GenerationConfig(prompt_lookup_num_tokens=3))
    ('beam_search', 'assisted_generation')
    """
    mode = config.get_generation_mode(assistant_model)
    return str(getattr(mode, "value", mode))


def is_beam(config: GenerationConfig) -> bool:
    """Whether `config` selects beam search or beam sampling."""
    return mode_of(config) in BEAM


def is_assisted(config: GenerationConfig, assistant_model: Any = None) -> bool:
    """Whether `config` (and an assistant model) select assisted or prompt-lookup decoding."""
    return mode_of(config, assistant_model) == ASSISTED


def check_strategy(config: GenerationConfig, assistant_model: Any = None) -> None:
    """Raise `ValueError` for a strategy `generate` does not run, saying why and what to use instead."""
    mode = mode_of(config, assistant_model)
    drafted = assistant_model is not None or config.prompt_lookup_num_tokens is not None
    if drafted and mode in BEAM:
        raise ValueError(
            f"`assistant_model` / `prompt_lookup_num_tokens` draft tokens for greedy search and sampling only; with "
            f"num_beams={config.num_beams} HF would ignore them and run beam search. Pass one or the other."
        )
    if mode in SUPPORTED:
        return
    name = {"dola_generation": "DoLa decoding"}.get(mode, mode.replace("_", " "))
    if mode in MOVED_OUT_OF_HF_CORE:
        options, repo, why = MOVED_OUT_OF_HF_CORE[mode]
        raise ValueError(
            f"generate() does not support {name} (selected by {options}): transformers 5 moved it out of its "
            f"core into the Hub repository {repo} (loaded by HF's generate with custom_generate= and "
            f"trust_remote_code=True), and {why}. Use greedy search, sampling, or beam search (num_beams > 1 "
            "without num_beam_groups, constraints or force_words_ids)."
        )
    raise ValueError(
        f"generate() does not support {name} (num_beams={config.num_beams}); it runs greedy search, sampling, "
        "beam search and beam sampling."
    )
