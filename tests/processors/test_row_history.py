"""RowHistory: which earlier row and length each row of a call continues (repeat, continuation, fresh),
across rows, after `rollback` and `reorder`, with no host read."""

from __future__ import annotations

import torch
from _host_reads import HostReads

from hfbridge import accelerator_route
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
    with accelerator_route(), HostReads() as reads:  # what an accelerator runs (on CPU a host read is free)
        found = call(history, [[1, 2, 3], [1, 2, 4]], 0)
        history.states[:, -1, 0] = torch.tensor([30.0, 40.0])
        plain = history.lookup(torch.tensor([[1, 2, 3, 5], [1, 2, 4, 6]]))  # each row continues its own
    assert reads.count == 0, reads.ops
    assert found.before[:, 0].tolist() == [20.0, 20.0]
    on_host = history.lookup(torch.tensor([[1, 2, 3, 5], [1, 2, 4, 6]]))  # the CPU's shortcut: the same answer
    assert on_host.own and not plain.own
    for mine, general in zip(on_host[:4], plain[:4]):
        assert torch.equal(mine, general)
    assert on_host.before[:, 0].tolist() == [30.0, 40.0]


def test_rows_with_the_same_tokens_take_a_row_with_their_own_values():
    from hfbridge.processors._rows import RowParam

    history = RowHistory(RowParam("tau", [1.0, 1.0, 3.0, 3.0]), RowParam("eta", 0.1))
    call(history, [[5, 9, 1], [5, 9, 2], [5, 9, 2], [5, 9, 1]], 0)
    history.states[:, -1, 0] = torch.tensor([10.0, 20.0, 30.0, 40.0])
    found = history.lookup(torch.tensor([[5, 9, 1, 3], [5, 9, 2, 3], [5, 9, 1, 3], [5, 9, 2, 3]]))
    assert found.source.tolist() == [0, 1, 3, 2]  # rows 2 and 3: the rows of tau 3 (the first match is tau 1's)
    assert found.before[:, 0].tolist() == [10.0, 20.0, 40.0, 30.0]
    assert RowHistory(RowParam("tau", [2.0, 2.0])).kinds_for(2, torch.device("cpu")) is None  # one kind: no test
    history.reorder(torch.tensor([3, 3, 0, 0]))  # a loop that says where the rows went is followed
    found = history.lookup(torch.tensor([[5, 9, 1, 7], [5, 9, 1, 7], [5, 9, 1, 7], [5, 9, 1, 7]]))
    assert found.source.tolist() == [0, 1, 2, 3] and found.before[:, 0].tolist() == [40.0, 40.0, 10.0, 10.0]


def test_follow_takes_the_callers_rows_for_the_next_lookup_only():
    """`follow(source)`: row i continues row source[i] of the last call whatever its tokens (-1, or a row that is not
    there: fresh); the lookup after it matches by tokens again. No host read."""
    history = RowHistory()
    first = torch.tensor([[1, 2], [3, 4], [5, 6]])
    history.record(first, history.lookup(first), torch.tensor([[10.0], [20.0], [30.0]]))
    history.follow(torch.tensor([2, -1, 0, 7]))
    with HostReads() as reads:
        found = history.lookup(torch.tensor([[9], [9], [9], [9]]))  # only the last token is the caller's
    assert reads.count == 0
    assert found.previous.tolist() == [True, False, True, False] and found.repeat.tolist() == [False] * 4
    assert found.before[:, 0].tolist()[::2] == [30.0, 10.0] and found.source.tolist()[::2] == [2, 0]
    history.record(torch.tensor([[9], [9], [9], [9]]), found, torch.tensor([[31.0], [1.0], [11.0], [2.0]]))
    history.follow(torch.tensor([1, 2]))
    found = history.lookup(torch.tensor([[4], [5]]))
    assert found.previous.tolist() == [True, True] and found.before[:, 0].tolist() == [1.0, 11.0]
    found = history.lookup(torch.tensor([[8, 8]]))  # no follow pending: tokens again, which match nothing
    assert found.previous.tolist() == [False]


def test_mirostat_followed_equals_a_warper_per_sequence():
    """Two sequences in one `MirostatLogitsWarper`, swapped between calls and told so by `follow`, reading only
    each row's last token: each row's scores are those of a warper of its own fed the whole sequence."""
    from hfbridge.processors import MirostatLogitsWarper

    generator = torch.Generator().manual_seed(0)
    shared, alone = MirostatLogitsWarper(tau=2.0, eta=0.5), [MirostatLogitsWarper(tau=2.0, eta=0.5) for _ in range(2)]
    sequences = [[1, 2, 3], [4, 5]]
    order = [0, 1]
    for step in range(5):
        logits = torch.randn(2, 30, generator=generator) * 2
        if step:
            before = order
            order = order[::-1] if step % 2 else order
            shared.follow(torch.tensor([before.index(sequence) for sequence in order]))
        last = torch.tensor([[sequences[sequence][-1]] for sequence in order])
        out = shared(last, logits.clone())
        for row, sequence in enumerate(order):
            expected = alone[sequence](torch.tensor([sequences[sequence]]), logits[row:row + 1].clone())
            assert torch.equal(out[row:row + 1], expected), (step, sequence)
        for row, sequence in enumerate(order):
            kept = out[row].isfinite().nonzero().flatten()
            sequences[sequence].append(int(kept[torch.randint(len(kept), (1,), generator=generator)]))
