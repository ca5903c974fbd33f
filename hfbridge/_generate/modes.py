"""Which decoding mode a prepared `GenerationConfig` selects, and the row of the strategy table for it.

HF's `GenerationConfig.get_generation_mode()` names the mode; `strategy_of` looks it up in a strategy
table (`strategies.STRATEGIES`: mode -> `Strategy`, as HF's `GENERATION_MODES_MAPPING`) once, when
`generate`'s call is prepared (`call.prepare`), and the row travels on the call. A row says how its
runner works (rows per prompt, per-row values, the loop options it honours, its checks) or, for the
modes hfbridge does not run, why not: group beam search, constrained beam search, DoLa and
contrastive search, which transformers 5 moved out of its core into `custom_generate` repositories
on the Hub (DoLa and contrastive search also read hidden states a plain callable does not return).

>>> mode_of(GenerationConfig(num_beams=3)), mode_of(GenerationConfig(prompt_lookup_num_tokens=3))
('beam_search', 'assisted_generation')
>>> row = Strategy("beam search", run=None, beams=True)
>>> row.rows_per_prompt(GenerationConfig(num_beams=3, num_return_sequences=2))
3
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from transformers import GenerationConfig

__all__ = ["Strategy", "mode_of", "strategy_of"]


def mode_of(config: GenerationConfig, assistant_model: Any = None) -> str:
    """The name of the mode `config` selects (HF's `GenerationMode` value), with a draft model or not."""
    mode = config.get_generation_mode(assistant_model)
    return str(getattr(mode, "value", mode))


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One row of the strategy table.

    Attributes:
        name: The strategy as error messages name it.
        run: The runner `(adapter, call, options, loop) -> what generate returns`; None for a
            refused mode (and for the draft's own loop, whose host decodes it directly).
        check_every: Its runner reads `check_every` (checks finished rows every n steps).
        synced_gpus: Its runner keeps the ranks of torch.distributed in lockstep.
        per_row: It takes one value per prompt for the per-row options and one generator per row
            (else both are refused before any model call).
        beams: Its rows are `num_beams` per prompt (else `num_return_sequences`).
        rolls_back: Its runner rolls rows back for banned strings (`banned_loop.py`); else they are refused.
        check: `check(adapter, config, options, rows=..., model_inputs=...)`, run when the call is
            prepared, before any model call: what this strategy cannot honour.
        refused: For a mode hfbridge does not run: `(the options that select it, HF's Hub
            repository since transformers 5, what else stands in the way)`.
    """

    name: str
    run: Callable[..., Any] | None
    check_every: bool = False
    synced_gpus: bool = False
    per_row: bool = False
    beams: bool = False
    rolls_back: bool = False
    check: Callable[..., None] | None = None
    refused: tuple[str, str, str] | None = None

    def rows_per_prompt(self, config: GenerationConfig) -> int:
        """How many rows each prompt becomes (HF's `_expand_inputs_for_generation`)."""
        return int(config.num_beams) if self.beams else int(config.num_return_sequences or 1)


def strategy_of(table: Mapping[str, Strategy], config: GenerationConfig,
                assistant_model: Any = None) -> tuple[str, Strategy]:
    """`(mode, row)` for what `config` (and a draft model) select; `ValueError` for a mode not run, saying why."""
    mode = mode_of(config, assistant_model)
    drafted = assistant_model is not None or config.prompt_lookup_num_tokens is not None
    row = table.get(mode)
    if drafted and row is not None and row.beams:
        raise ValueError(
            f"`assistant_model` / `prompt_lookup_num_tokens` draft tokens for greedy search and sampling only; with "
            f"num_beams={config.num_beams} HF would ignore them and run beam search. Pass one or the other."
        )
    if row is not None and row.refused is None:
        return mode, row
    name = {"dola_generation": "DoLa decoding"}.get(mode, mode.replace("_", " "))
    if row is not None and row.refused is not None:
        options, repo, why = row.refused
        raise ValueError(
            f"generate() does not support {name} (selected by {options}): transformers 5 moved it out of its "
            f"core into the Hub repository {repo} (loaded by HF's generate with custom_generate= and "
            f"trust_remote_code=True), and {why}. Use greedy search, sampling, or beam search (num_beams > 1 "
            "without num_beam_groups, constraints or force_words_ids)."
        )
    runs = ", ".join(sorted({row.name for row in table.values() if row.refused is None}))
    raise ValueError(f"generate() does not support {name} (num_beams={config.num_beams}); it runs {runs}.")
