"""Two `torch.distributed` ranks (gloo, CPU) in forked processes, for the `synced_gpus` tests."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp


def run_two_ranks(run_rank: Callable[[int, int], Any], timeout: float = 120) -> dict[int, Any]:
    """`{rank: run_rank(rank, port)}` for ranks 0 and 1, each in its own process.

    `run_rank` (a module-level function) joins the gloo group on `127.0.0.1:port` itself and leaves
    it to this harness to destroy, after the value is sent: under torch 2.6, gloo's
    `destroy_process_group` hung now and then in the rank that finished last, so a rank still
    tearing down once both values are in is killed. A rank that raises fails the test with its
    error instead of leaving the other waiting. Spawned, not forked: a fork copies whatever locks
    the suite's earlier threads held at that moment, at the price of importing torch again.
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = [context.Process(target=_worker, args=(run_rank, rank, port, results)) for rank in (0, 1)]
    for process in processes:
        process.start()
    got = {}
    try:
        for _ in processes:
            rank, failed, value = results.get(timeout=timeout)
            assert not failed, f"rank {rank}: {value}"
            got[rank] = value
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():  # its value is in (or the test failed already): only the teardown is left
                process.kill()
    return got


def _worker(run_rank: Callable[[int, int], Any], rank: int, port: int, results: Any) -> None:
    try:
        results.put((rank, False, run_rank(rank, port)))
    except BaseException as error:  # report instead of leaving the test waiting
        results.put((rank, True, f"{type(error).__name__}: {error}"))
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
