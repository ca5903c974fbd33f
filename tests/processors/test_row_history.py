"""RowHistory: which earlier row and length each row of a call continues (repeat, continuation, fresh),
across rows, after `rollback` and `reorder`, with no host read."""

from __future__ import annotations

import torch
from _host_reads import HostReads

from hfbridge.processors._row_history import RowHistory


def call(history, ids, value, **kwargs):
    ids = torch.tensor(ids)
    found = history.lookup(ids, **kwargs)
    history.record(ids, found, torch.full((ids.shape[0], 1), float(value)))
    return found


def test_repeat_continuation_and_fresh():
    history = RowHistory()
    call(history, [[1, 2]], 10)
    call(history, [[1, 2, 3]], 11)
    found = call(history, [[1, 2, 3, 4]], 12)
    assert found.previous.tolist() == [True] and found.before[0, 0] == 11
    found = history.lookup(torch.tensor([[1, 2, 3]]))  # a length seen before, same tokens: a repeat
    assert found.repeat.tolist() == [True] and found.at[0, 0] == 11
    found = history.lookup(torch.tensor([[1, 2, 5]]))  # another token at the last place: continues length 2
    assert (found.repeat.tolist(), found.previous.tolist(), found.before[0, 0].item()) == ([False], [True], 10.0)
    assert history.lookup(torch.tensor([[1, 2, 5]]), last_only=True).previous.tolist() == [False]
    found = history.lookup(torch.tensor([[9, 2, 3, 4, 5]]))  # another prefix: fresh
    assert (found.repeat.tolist(), found.previous.tolist()) == ([False], [False])
    found = history.lookup(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]))  # too far ahead: fresh
    assert (found.repeat.tolist(), found.previous.tolist()) == ([False], [False])


def test_rows_matched_across_the_batch_same_row_first():
    history = RowHistory()
    call(history, [[1, 2], [1, 2], [3, 4]], 0)
    history.states[:, -1, 0] = torch.tensor([10.0, 20.0, 30.0])
    found = history.lookup(torch.tensor([[3, 4, 0], [1, 2, 0], [1, 2, 0]]))
    assert found.source.tolist() == [2, 1, 0]  # row 1 keeps itself among equal rows; row 2 takes the first
    assert found.before[:, 0].tolist() == [30.0, 20.0, 10.0]


def test_rollback_forgets_what_came_after():
    history = RowHistory()
    for n in range(1, 6):
        call(history, [list(range(n)), list(range(1, n + 1))], n)
    history.rollback(torch.tensor([3, 5]))
    found = history.lookup(torch.tensor([[0, 1, 2], [1, 2, 3]]))
    assert found.repeat.tolist() == [True, True] and found.at[:, 0].tolist() == [3.0, 3.0]
    found = history.lookup(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]))
    assert found.repeat.tolist() == [False, True]  # row 0 no longer knows length 4
    assert found.source.tolist()[1] == 1
    # a row whose tokens equal another row's takes that row's state (it is a function of the tokens)
    assert history.lookup(torch.tensor([[1, 2, 3, 4]])).repeat.tolist() == [True]


def test_reorder_and_no_host_reads():
    history = RowHistory()
    call(history, [[1, 2], [1, 2]], 0)
    history.states[:, -1, 0] = torch.tensor([10.0, 20.0])
    history.reorder(torch.tensor([1, 1]))
    with HostReads() as reads:
        found = call(history, [[1, 2, 3], [1, 2, 4]], 0)
    assert reads.count == 0, reads.ops
    assert found.before[:, 0].tolist() == [20.0, 20.0]
