"""Layouts: parsing, last-position rows and the way back, against a plain reference."""

import pytest
import torch
from einops import rearrange
from hypothesis import given, settings
from hypothesis import strategies as st

from hfbridge import Layout, from_rows, sample_step, to_rows


def reference_rows(canonical: torch.Tensor, has_seq: bool) -> torch.Tensor:
    """canonical is [*batch, (T,) V]: take the last position, flatten the batch."""
    last = canonical[..., -1, :] if has_seq else canonical
    return last.reshape(-1, last.shape[-1])


@st.composite
def layouts(draw):
    batch_names = draw(st.lists(st.sampled_from(["b", "k", "h", "n"]), max_size=3, unique=True))
    has_seq = draw(st.booleans())
    order = draw(st.permutations(batch_names + (["t"] if has_seq else []) + ["v"]))
    # Batch axes flatten in the order the layout names them.
    names = [n for n in order if n in batch_names] + (["t"] if has_seq else []) + ["v"]
    sizes = {name: draw(st.integers(1, 4)) for name in batch_names}
    if has_seq:
        sizes["t"] = draw(st.integers(1, 4))
    sizes["v"] = draw(st.integers(2, 9))
    return names, list(order), sizes, has_seq


@settings(max_examples=80, deadline=None)
@given(layouts(), st.integers(0, 2**31 - 1))
def test_random_layouts_match_plain_reference(drawn, seed):
    canonical_names, order, sizes, has_seq = drawn
    canonical = torch.randn(*[sizes[n] for n in canonical_names], generator=torch.Generator().manual_seed(seed))
    logits = rearrange(canonical, f"{' '.join(canonical_names)} -> {' '.join(order)}")
    rows, batch_shape = to_rows(logits, " ".join(order))
    expected = reference_rows(canonical, has_seq)
    assert torch.equal(rows, expected)
    batch_names = [n for n in canonical_names if n not in ("t", "v")]
    assert batch_shape == tuple(sizes[n] for n in batch_names)
    tokens = sample_step(logits, layout=" ".join(order))
    assert tokens.shape == batch_shape
    assert torch.equal(from_rows(tokens.reshape(-1), batch_shape).reshape(-1), expected.argmax(-1))


@pytest.mark.parametrize(
    "pattern, shape, rows_shape, batch_shape",
    [
        ("b t v", (2, 3, 5), (2, 5), (2,)),
        ("t b v", (3, 2, 5), (2, 5), (2,)),
        ("b v t", (2, 5, 3), (2, 5), (2,)),
        ("b v", (2, 5), (2, 5), (2,)),
        ("v", (5,), (1, 5), ()),
        ("t v", (3, 5), (1, 5), ()),
        ("b k t v", (2, 4, 3, 5), (8, 5), (2, 4)),
    ],
)
def test_listed_layouts(pattern, shape, rows_shape, batch_shape):
    logits = torch.randn(shape)
    rows, got_batch = to_rows(logits, pattern)
    assert rows.shape == rows_shape and got_batch == batch_shape


def test_defaults_by_rank():
    assert Layout.for_tensor(torch.zeros(3)).pattern == "v"
    assert Layout.for_tensor(torch.zeros(2, 3)).pattern == "b v"
    assert Layout.for_tensor(torch.zeros(2, 3, 4)).pattern == "b t v"


def test_rows_are_views_of_the_last_position_when_strides_allow():
    logits = torch.randn(2, 3, 5)
    rows, _ = to_rows(logits)
    assert rows.data_ptr() == logits[:, -1].data_ptr()


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("b t", "`layout` 'b t' is not a valid layout: it has no vocabulary axis 'v'."),
        ("b v v", "`layout` 'b v v' is not a valid layout: axis 'v' appears more than once."),
        ("b t-1 v", "`layout` 'b t-1 v' is not a valid layout: axis name 't-1' is not an identifier (write axes like 'b t v')."),
        ("", "`layout` '' is not a valid layout: it names no axes."),
    ],
)
def test_bad_patterns(pattern, message):
    with pytest.raises(ValueError) as error:
        Layout(pattern)
    assert str(error.value) == message


def test_layout_that_does_not_fit_the_tensor():
    with pytest.raises(ValueError) as error:
        to_rows(torch.zeros(2, 5), "b t v")
    assert str(error.value) == "`layout` 'b t v' names 3 axes but the logits have shape (2, 5) (2 axes)."


def test_no_default_for_four_axes():
    with pytest.raises(ValueError, match=r"logits of shape \(1, 2, 3, 4\) have 4 axes and no default layout"):
        to_rows(torch.zeros(1, 2, 3, 4))


def test_empty_axis():
    with pytest.raises(ValueError, match=r"have an empty `t` axis \(layout 'b t v'\)"):
        to_rows(torch.zeros(2, 0, 4))


def test_layout_type_error():
    with pytest.raises(TypeError, match="`layout` must be a string such as 'b t v', got int."):
        Layout(3)
