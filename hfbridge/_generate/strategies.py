"""The strategy table: HF's generation mode -> the runner that decodes it, as HF's `GENERATION_MODES_MAPPING`.

`modes.py` says which mode a prepared config selects and refuses the modes hfbridge does not run;
here each mode it runs has one row: its runner and the loop options (`check_every`, `synced_gpus`)
the runner honours. A runner takes the prepared call and returns what `generate` returns.

| mode | runner | loop options |
| --- | --- | --- |
| `greedy_search`, `sample` | `run_loop`: hfbridge's own loop (`loop.py`) | `check_every`, `synced_gpus` |
| `beam_search`, `beam_sample` | `run_beam`: HF's `_beam_search` (`hf_loops/beam.py`) | `synced_gpus` |
| `assisted_generation` | `run_assisted`: HF's `_assisted_decoding`, draft or lookup (`hf_loops/assisted.py`) | - |

A new strategy is one runner and one row here (and its mode's name in `modes.SUPPORTED`).

>>> from transformers import GenerationConfig
>>> strategy_for(GenerationConfig(num_beams=2), None).run.__name__
'run_beam'
>>> sorted(STRATEGIES)
['assisted_generation', 'beam_sample', 'beam_search', 'greedy_search', 'sample']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from transformers import GenerationConfig

from hfbridge._generate.call import Call, decode, progress_bar
from hfbridge._generate.hf_loops.assisted import generate_assisted
from hfbridge._generate.hf_loops.beam import beam_search
from hfbridge._generate.loop import LoopOptions
from hfbridge._generate.modes import mode_of
from hfbridge._generate.options import GenerateOptions
from hfbridge._hf.outputs import decoder_output
from hfbridge._models.adapters import ModelAdapter

__all__ = ["STRATEGIES", "Strategy", "run_assisted", "run_beam", "run_loop", "strategy_for"]

Runner = Callable[[ModelAdapter, Call, GenerateOptions, LoopOptions], Any]


def run_loop(adapter: ModelAdapter, call: Call, options: GenerateOptions, loop: LoopOptions) -> Any:
    """Greedy search and sampling: hfbridge's own one-token loop, HF's `_sample`."""
    streamer = options.streamer
    bar = progress_bar(options.progress, max((call.config.max_length or 0) - call.sequences.shape[1], 0))
    try:
        if streamer is not None:
            streamer.put(call.sequences.cpu())  # the prompt first, as HF
        decode(adapter, call, streamer, bar, loop)
    except BaseException:
        if streamer is not None:
            streamer.end()  # so that a TextIteratorStreamer's reader stops instead of waiting forever
        raise
    finally:
        if bar is not None:
            bar.close()
    if streamer is not None:
        streamer.end()
    if call.config.return_dict_in_generate:
        return decoder_output(sequences=call.sequences, scores=call.scores, logits=call.raw_logits,
                              cache=adapter.cache(call.state))
    return call.sequences


def run_beam(adapter: ModelAdapter, call: Call, options: GenerateOptions, loop: LoopOptions) -> Any:
    """Beam search and beam sampling: HF's own beam loop on the adapter."""
    bar = progress_bar(options.progress, max((call.config.max_length or 0) - call.sequences.shape[1], 0))
    try:
        return beam_search(adapter, input_ids=call.sequences, attention_mask=call.mask, state=call.state,
                           config=call.config, sampler=call.sampler, criteria=call.criteria,
                           prompts=call.prompts, on_step=None if bar is None else lambda: bar.update(1),
                           synced=loop.synced)
    finally:
        if bar is not None:
            bar.close()


def run_assisted(adapter: ModelAdapter, call: Call, options: GenerateOptions, loop: LoopOptions) -> Any:
    """Assisted and prompt-lookup decoding: HF's own assisted loop on the adapter."""
    return generate_assisted(adapter, call, assistant_model=options.assistant_model, processors=options.processors,
                             streamer=options.streamer, layout=options.layout, vocab_size=options.vocab_size,
                             generator=options.generator, fast=options.fast, progress=options.progress)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One row of the table: the runner, and the loop options it honours (others are refused)."""

    name: str  # as the error messages name it
    run: Runner
    check_every: bool  # reads `check_every` (checks finished rows every n steps)
    synced_gpus: bool  # keeps the ranks of torch.distributed in lockstep


_LOOP = "greedy search and sampling"
STRATEGIES: dict[str, Strategy] = {
    "greedy_search": Strategy(_LOOP, run_loop, check_every=True, synced_gpus=True),
    "sample": Strategy(_LOOP, run_loop, check_every=True, synced_gpus=True),
    "beam_search": Strategy("beam search", run_beam, check_every=False, synced_gpus=True),
    "beam_sample": Strategy("beam search", run_beam, check_every=False, synced_gpus=True),
    "assisted_generation": Strategy("assisted / prompt-lookup decoding", run_assisted, check_every=False,
                                    synced_gpus=False),
}


def strategy_for(config: GenerationConfig, assistant_model: Any, loop: LoopOptions | None = None) -> Strategy:
    """The row for the mode `config` (with `assistant_model`) selects; refuses loop options its runner
    ignores, rather than ignoring them silently. The mode is one `modes.check_strategy` accepted."""
    strategy = STRATEGIES[mode_of(config, assistant_model)]
    if loop is None:
        return strategy
    if loop.check_every != 1 and not strategy.check_every:
        raise ValueError(
            f"`check_every`={loop.check_every} applies to greedy search and sampling; {strategy.name} runs HF's "
            "own loop, which checks every step. Drop check_every."
        )
    if loop.synced and not strategy.synced_gpus:
        raise ValueError(
            f"`synced_gpus` is on (ranks of torch.distributed kept in lockstep), which hfbridge supports for greedy "
            f"search, sampling and beam search, not yet for {strategy.name}; use one of those, or synced_gpus=False "
            "when every rank makes the same number of model calls anyway."
        )
    return strategy
