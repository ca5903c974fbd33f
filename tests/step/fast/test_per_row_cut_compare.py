"""The per-row top-p test as one comparison, and the crowded row's partition, against their plain forms.

`survives` / `removed` with `(rows, 1)` cuts compare every row with `>` / `<=` against a float64 moved
one step down where the row's test is strict; `_descending` with a limit partitions before its sort.
Both must give exactly what the plain forms give: the scalar test of each row, the sort then the cut.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hfbridge._step.fast.top_p.floor_candidates import _descending
from hfbridge._step.fast.top_p.mask import removal_cut, removed, survives


def _running_near(cuts: list[float]) -> torch.Tensor:
    """`(rows, 12)` float64 running sums at, just above and just below each row's cut, and NaN, 0, 1."""
    rows = []
    for cut in cuts:
        down, up = math.nextafter(cut, -math.inf), math.nextafter(cut, math.inf)
        rows.append([cut, down, up, math.nextafter(down, -math.inf), math.nextafter(up, math.inf),
                     float("nan"), 0.0, 1.0, cut * (1 + 2**-30), cut * (1 - 2**-30), float("inf"), 1e-300])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(5))
def test_each_row_is_compared_as_its_scalar_cut(seed):
    g = torch.Generator().manual_seed(seed)
    top_p = torch.cat([torch.rand(6, 1, generator=g, dtype=torch.float64),
                       torch.tensor([[0.7], [0.9], [0.5], [1e-8], [0.999999]], dtype=torch.float64)])
    cut, inclusive = removal_cut(top_p)
    assert bool(inclusive.any()) and not bool(inclusive.all())  # both kinds of rows are here
    running = _running_near(cut[:, 0].tolist())  # [N, 12]
    kept, gone = survives(running, cut, inclusive), removed(running, cut, inclusive)
    for row, p in enumerate(top_p[:, 0].tolist()):
        one_cut, one_inclusive = removal_cut(p)
        assert (one_cut, one_inclusive) == (cut[row, 0].item(), bool(inclusive[row, 0]))
        assert torch.equal(kept[row], survives(running[row], one_cut, one_inclusive)), row
        assert torch.equal(gone[row], removed(running[row], one_cut, one_inclusive)), row


@pytest.mark.parametrize("limit", [1, 3, 100, 2048])
def test_the_limited_order_is_the_first_of_the_full_order(limit):
    rng = np.random.default_rng(limit)
    values = np.concatenate([rng.standard_normal(3000), np.repeat([0.5, -0.0, 0.0, 2.0], 50)]).astype(np.float32)
    ids = np.sort(rng.choice(128256, values.size, replace=False))
    order = rng.permutation(values.size)  # ties spread over the ids
    values = values[order]
    full = _descending(values.copy(), ids.copy())
    assert np.array_equal(_descending(values.copy(), ids.copy(), limit), full[:limit])
    assert np.array_equal(_descending(values[:limit].copy(), ids[:limit].copy(), limit),
                          _descending(values[:limit].copy(), ids[:limit].copy()))  # at the limit: no partition
