"""The fast path's float32 rounding helpers (plain arithmetic, so torch.compile traces them on the
torch floor) agree bit for bit with the `struct` round trip they replace."""

import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from hfbridge._step.fast.top_p.mask import float32, rounds_at_most

EDGES = [0.0, 1.0, 0.5, 0.1, 0.9, 1 - 0.9, 1 - 0.95, 2.0**-126, 2.0**-127, 2.0**-149, 3 * 2.0**-150,
         2.0**-150, 1.0 - 2.0**-25, 1.0 + 2.0**-24, 1.0 + 3 * 2.0**-24, 1e-45, 1e-40, 3.4028234663852886e38]


def struct_float32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def struct_rounds_at_most(threshold: float) -> tuple[float, bool]:
    bits = struct.unpack("<I", struct.pack("<f", threshold))[0]
    above = struct.unpack("<f", struct.pack("<I", bits + 1))[0]
    return (threshold + above) / 2, bits % 2 == 0


def same(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


def test_edges():
    for x in EDGES + [-x for x in EDGES]:
        assert same(float32(x), struct_float32(x)), x
    for x in EDGES[:-1]:  # below the largest float32, whose next one up is inf
        threshold = struct_float32(x)
        assert rounds_at_most(threshold) == struct_rounds_at_most(threshold), x
    assert math.isinf(float32(3.5e38)) and float32(math.inf) == math.inf and math.isnan(float32(math.nan))


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=-3.4e38, max_value=3.4e38, allow_nan=False))
def test_float32_matches_struct(x):
    assert same(float32(x), struct_float32(x))


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=0.0, max_value=3.4e38, allow_nan=False))
def test_rounds_at_most_matches_struct(x):
    threshold = struct_float32(x)
    assert rounds_at_most(threshold) == struct_rounds_at_most(threshold)
