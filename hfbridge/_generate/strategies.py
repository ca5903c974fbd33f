"""The strategy table: HF's generation mode -> its row, as HF's `GENERATION_MODES_MAPPING`.

Each mode has one row (`modes.Strategy`): the runner that decodes it, the loop options
(`check_every`, `synced_gpus`) the runner honours, whether it takes per-row values, how many rows a
prompt becomes, and its checks; the modes hfbridge does not run have a row that says why.
`call.prepare` looks the mode up once and keeps the row on the call; a runner takes the prepared
call and returns what `generate` returns. `STRATEGIES` below is the table; docs/generate.md shows it
(a test checks that page names every runner of it).

A new strategy is one runner in a module of its own and one row here (its import and its row):
`tests/generate/test_new_strategy.py` registers one at runtime and runs it through `generate`.

>>> from transformers import GenerationConfig
>>> strategy_for(GenerationConfig(num_beams=2), None).run.__name__
'run_beam'
>>> STRATEGIES["sample"].per_row, STRATEGIES["beam_search"].per_row
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import GenerationConfig

from hfbridge._generate.call import progress_bar
from hfbridge._generate.hf_loops.assisted import check_assisted, generate_assisted
from hfbridge._generate.hf_loops.beam import beam_search, check_beam
from hfbridge._generate.loop import LoopOptions, decode
from hfbridge._generate.modes import Strategy, strategy_of
from hfbridge._generate.options import GenerateOptions
from hfbridge._generate.prepared import Call
from hfbridge._hf.outputs import decoder_output
from hfbridge._models.adapters import ModelAdapter

__all__ = ["STRATEGIES", "Strategy", "check_loop_options", "run_assisted", "run_beam", "run_loop", "strategy_for"]

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
                           synced=loop.synced, unconditional=call.unconditional)
    finally:
        if bar is not None:
            bar.close()


def run_assisted(adapter: ModelAdapter, call: Call, options: GenerateOptions, loop: LoopOptions) -> Any:
    """Assisted and prompt-lookup decoding: HF's own assisted loop on the adapter."""
    return generate_assisted(adapter, call, assistant_model=options.assistant_model, streamer=options.streamer,
                             layout=options.layout, vocab_size=options.vocab_size, tokenizer=options.tokenizer,
                             progress=options.progress)


_LOOP = "greedy search and sampling"
_BEAMS = "beam search"
_CORE_ONLY = "hfbridge runs the strategies of HF's core loops only"
STRATEGIES: dict[str, Strategy] = {
    "greedy_search": Strategy(_LOOP, run_loop, check_every=True, synced_gpus=True, per_row=True, rolls_back=True),
    "sample": Strategy(_LOOP, run_loop, check_every=True, synced_gpus=True, per_row=True, rolls_back=True),
    "beam_search": Strategy(_BEAMS, run_beam, synced_gpus=True, beams=True, check=check_beam),
    "beam_sample": Strategy(_BEAMS, run_beam, synced_gpus=True, beams=True, check=check_beam),
    "assisted_generation": Strategy("assisted / prompt-lookup decoding", run_assisted, check=check_assisted),
    # transformers 5 moved these out of its core into `custom_generate` repositories on the Hub
    "group_beam_search": Strategy("group beam search", None, refused=(
        "num_beam_groups > 1", "transformers-community/group-beam-search", _CORE_ONLY)),
    "constrained_beam_search": Strategy("constrained beam search", None, refused=(
        "constraints / force_words_ids", "transformers-community/constrained-beam-search", _CORE_ONLY)),
    "dola_generation": Strategy("DoLa decoding", None, refused=(
        "dola_layers", "transformers-community/dola",
        "it also contrasts the hidden states of early layers, which a callable does not return")),
    "contrastive_search": Strategy("contrastive search", None, refused=(
        "penalty_alpha > 0 with top_k > 1", "transformers-community/contrastive-search",
        "it also re-ranks candidates with the model's hidden states")),
}


def strategy_for(config: GenerationConfig, assistant_model: Any, loop: LoopOptions | None = None) -> Strategy:
    """The row for the mode `config` (with `assistant_model`) selects, its loop options checked."""
    strategy = strategy_of(STRATEGIES, config, assistant_model)[1]
    if loop is not None:
        check_loop_options(strategy, loop)
    return strategy


def check_loop_options(strategy: Strategy, loop: LoopOptions) -> None:
    """Refuse loop options `strategy`'s runner ignores, rather than ignoring them silently."""
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
