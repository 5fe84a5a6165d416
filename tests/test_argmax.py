"""rlx_lm.argmax: agreement with numpy, tie and NaN policy, typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx_lm
from rlx_lm import DtypeError, InvalidLogitsError, ShapeError

finite_rows = hnp.arrays(
    np.float32,
    st.integers(1, 300),
    elements=st.floats(width=32, allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, 1.0, -1.0]),
)


@given(finite_rows)
def test_matches_numpy_on_finite_rows(row: np.ndarray) -> None:
    assert rlx_lm.argmax(row) == int(np.argmax(row))


@given(
    hnp.arrays(
        np.float32,
        st.integers(1, 200),
        elements=st.sampled_from([np.float32(-np.inf), np.float32(np.inf), 0.0, 2.0]),
    ).filter(lambda r: bool(np.any(r != -np.inf)))
)
def test_infinities_follow_numpy(row: np.ndarray) -> None:
    assert rlx_lm.argmax(row) == int(np.argmax(row))


def test_lowest_index_wins_ties() -> None:
    row = np.zeros(1000, np.float32)
    row[[900, 123, 500]] = 7.0
    assert rlx_lm.argmax(row) == 123


@given(st.integers(2, 300), st.data())
def test_nan_names_the_first_position(n: int, data: st.DataObject) -> None:
    row = np.ones(n, np.float32)
    positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, unique=True))
    row[positions] = np.nan
    with pytest.raises(InvalidLogitsError, match=f"NaN at position {min(positions)}\\b"):
        rlx_lm.argmax(row)


def test_empty_and_all_banned_rows_raise() -> None:
    with pytest.raises(InvalidLogitsError, match="empty"):
        rlx_lm.argmax(np.zeros(0, np.float32))
    with pytest.raises(InvalidLogitsError, match="banned"):
        rlx_lm.argmax(np.full(10, -np.inf, np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
def test_other_dtypes_raise_with_the_conversion(dtype: type) -> None:
    with pytest.raises(DtypeError, match=r"astype\(np.float32\)"):
        rlx_lm.argmax(np.zeros(4, dtype))
    with pytest.raises(TypeError):
        rlx_lm.argmax(np.zeros(4, dtype))


def test_strided_and_non_array_inputs_raise() -> None:
    with pytest.raises(DtypeError, match="ascontiguousarray"):
        rlx_lm.argmax(np.zeros(8, np.float32)[::2])
    with pytest.raises(DtypeError, match=r"np\.asarray"):
        rlx_lm.argmax([1.0, 2.0])  # type: ignore[arg-type]


def test_two_dimensional_input_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match="1-D"):
        rlx_lm.argmax(np.zeros((2, 3), np.float32))


def test_input_is_not_modified() -> None:
    row = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    before = row.copy()
    rlx_lm.argmax(row)
    np.testing.assert_array_equal(row, before)
