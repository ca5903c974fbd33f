"""Data-parallel evaluation: two `torch.distributed` ranks (gloo, CPU), each with its own copy of the model."""

from __future__ import annotations

import functools
import os

import pytest

pytest.importorskip("lm_eval.api", reason="lm-eval is not installed (pip install -e '.[lm-eval]')")

import torch
from _two_ranks import run_two_ranks
from lm_eval.api.instance import Instance

from hfbridge.lm_eval import HFBridgeLM

from _lm_eval_fixtures import CORPUS

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = {0: [" ".join(CORPUS)], 1: [CORPUS[1], " ".join(reversed(CORPUS))]}  # uneven windows per rank


def build(folder):
    from transformers import AutoTokenizer, GPT2LMHeadModel
    return HFBridgeLM(GPT2LMHeadModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder),
                      batch_size=2)


def evaluate(lm, folder):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    results = simple_evaluate(model=lm, tasks=["tiny_choice"], random_seed=0, bootstrap_iters=0,
                              task_manager=TaskManager(include_path=folder, include_defaults=False))
    return None if results is None else results["results"]["tiny_choice"]["acc,none"]


def rolling(lm, texts):
    return lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)])


def _run_rank(folder, rank, port):
    torch.set_num_threads(1)
    if rank == 0:  # the caller's own process group
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    else:  # a launcher's variables (torchrun's): HFBridgeLM starts the group itself
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    # `run_two_ranks` destroys the group once this rank's values are sent
    lm = build(folder)
    return (lm.rank, lm.world_size), evaluate(lm, folder), rolling(lm, TEXTS[rank])


def test_two_ranks_give_the_single_process_results(folder):
    alone = build(str(folder))
    assert (alone.rank, alone.world_size) == (0, 1)
    got = run_two_ranks(functools.partial(_run_rank, str(folder)), timeout=300)
    assert [got[rank][0] for rank in (0, 1)] == [(0, 2), (1, 2)]
    assert got[0][1] == evaluate(alone, str(folder))  # rank 0 gathers every rank's documents
    assert got[1][1] is None
    for rank in (0, 1):
        assert got[rank][2] == pytest.approx(rolling(alone, TEXTS[rank]), abs=1e-4)
