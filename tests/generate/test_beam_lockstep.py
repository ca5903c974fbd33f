"""Beam search with `synced_gpus`: two gloo ranks on CPU stay in lockstep and return HF's beams.

Rank 0 asks for 2 new tokens, rank 1 for 5, so alone they make different numbers of model calls. In
lockstep (`synced_gpus=True`) both must make rank 1's number, and each must still return what it
returns alone, which is what HF's own `model.generate(num_beams=3)` returns for the same prompt.
"""

from __future__ import annotations

import pytest
import torch
from _two_ranks import run_two_ranks

from hfbridge import Recompute, ReturnsCache, generate

from _tiny_models import recompute_callable, returns_cache_callable, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

RANKS = {0: dict(prompt=[[5, 9, 13, 2]], max_new_tokens=2), 1: dict(prompt=[[40, 3, 3, 18], [7, 7, 2, 4]], max_new_tokens=5)}
OPTIONS = dict(num_beams=3, num_return_sequences=2, eos_token_id=[0, 4, 8], pad_token_id=1)


def _forms(hf):
    """The model as a recompute callable and as a cache-returning one, each counting its calls."""
    calls = {"recompute": 0, "cache": 0}
    full, cached = recompute_callable(hf), returns_cache_callable(hf)

    def recompute(input_ids, attention_mask):
        calls["recompute"] += 1
        return full(input_ids, attention_mask)

    def cache(input_ids, cache, attention_mask):
        calls["cache"] += 1
        return cached(input_ids, cache, attention_mask)

    return calls, {"recompute": Recompute(recompute), "cache": ReturnsCache(cache)}


def _run_rank(rank: int, port: int) -> tuple:
    torch.set_num_threads(1)
    hf = tiny_llama()
    prompt = torch.tensor(RANKS[rank]["prompt"])
    options = dict(OPTIONS, max_new_tokens=RANKS[rank]["max_new_tokens"])
    mask = torch.ones_like(prompt)
    # the recompute form is HF without its cache, the cache form HF with it (their floats differ)
    expected = {"recompute": hf.generate(prompt, attention_mask=mask, use_cache=False, **options).tolist(),
                "cache": hf.generate(prompt, attention_mask=mask, **options).tolist()}
    calls, forms = _forms(hf)
    alone = {name: (generate(form, prompt, **options).tolist(), calls[name]) for name, form in forms.items()}
    # `run_two_ranks` destroys the group once this rank's values are sent
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls, forms = _forms(hf)
    synced = {name: (generate(form, prompt, synced_gpus=True, **options).tolist(), calls[name])
              for name, form in forms.items()}
    hf_synced = hf.generate(prompt, attention_mask=mask, synced_gpus=True, **options).tolist()
    return expected, alone, synced, hf_synced


def test_beam_search_synced_gpus_two_gloo_ranks():
    got = run_two_ranks(_run_rank, timeout=180)
    for rank in (0, 1):
        expected, alone, synced, hf_synced = got[rank]
        assert hf_synced == expected["cache"]  # HF's own lockstep changes no beam
        for name in alone:
            assert alone[name][0] == expected[name], (rank, name)
            assert synced[name][0] == expected[name], (rank, name)
    for name in got[0][1]:
        calls_alone = [got[rank][1][name][1] for rank in (0, 1)]
        assert calls_alone[0] < calls_alone[1], name  # alone, rank 0 stops first
        assert got[0][2][name][1] == got[1][2][name][1] == calls_alone[1], name  # in lockstep: rank 1's count
