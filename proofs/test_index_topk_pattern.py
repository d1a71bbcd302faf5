# SPDX-License-Identifier: Apache-2.0
"""Proofs for vllm/0001: ``index_topk_pattern`` derived from GLM-5 ``indexer_types``.

Loads the shipped helper ``vllm/transformers_utils/dsa_index_pattern.py`` from the patched tree.
"""

from __future__ import annotations

import pytest
from conftest import load_leaf
from hypothesis import given
from hypothesis import strategies as st

LEAF = "vllm/transformers_utils/dsa_index_pattern.py"
TO_TYPE = {"F": "full", "S": "shared"}

indexer_types_lists = st.lists(st.sampled_from(["full", "shared"]), max_size=200)
# Valid characters, their lower-case and look-alike neighbours, and arbitrary text.
pattern_chars = st.sampled_from(list("FSfsXT0 \n")) | st.characters()


@pytest.fixture(scope="module")
def leaf():
    return load_leaf(LEAF)


@given(indexer_types=indexer_types_lists)
def test_derived_pattern_round_trips(leaf, indexer_types: list[str]) -> None:
    """Deriving a pattern from any full/shared list and mapping it back gives the list, and
    the derived pattern is what resolve returns with or without it given explicitly."""
    pattern = leaf.pattern_from_indexer_types(indexer_types)
    n = len(indexer_types)
    assert [TO_TYPE[c] for c in pattern] == indexer_types
    leaf.validate_index_topk_pattern(pattern, n)
    assert leaf.resolve_index_topk_pattern(None, indexer_types, n) == pattern
    assert leaf.resolve_index_topk_pattern(pattern, indexer_types, n) == pattern
    assert leaf.resolve_index_topk_pattern(pattern, None, n) == pattern


@given(pattern=st.text(pattern_chars, max_size=40), n=st.integers(0, 40))
def test_validation_accepts_exactly_valid_patterns(leaf, pattern: str, n: int) -> None:
    """validate_index_topk_pattern accepts a string iff it has n characters, all F or S."""
    valid = len(pattern) == n and set(pattern) <= {"F", "S"}
    try:
        leaf.validate_index_topk_pattern(pattern, n)
        accepted = True
    except ValueError as e:
        accepted = False
        assert f"expected {n} characters from ['F', 'S']" in str(e)
    assert accepted == valid


@given(
    indexer_types=indexer_types_lists.filter(bool),
    data=st.data(),
)
def test_any_contradicting_pattern_is_rejected(leaf, indexer_types: list[str], data) -> None:
    """Any valid pattern other than the derived one is rejected at its first differing layer."""
    n = len(indexer_types)
    derived = leaf.pattern_from_indexer_types(indexer_types)
    other = data.draw(st.text(st.sampled_from("FS"), min_size=n, max_size=n))
    if other == derived:
        assert leaf.resolve_index_topk_pattern(other, indexer_types, n) == derived
        return
    first = next(i for i in range(n) if other[i] != derived[i])
    with pytest.raises(ValueError, match=f"contradicts indexer_types at layer {first}:"):
        leaf.resolve_index_topk_pattern(other, indexer_types, n)


@given(
    indexer_types=st.lists(st.text(max_size=8), min_size=1, max_size=20),
)
def test_unknown_indexer_types_are_rejected(leaf, indexer_types: list[str]) -> None:
    """An indexer_types list is accepted iff every entry is "full" or "shared"."""
    valid = all(t in ("full", "shared") for t in indexer_types)
    try:
        leaf.pattern_from_indexer_types(indexer_types)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == valid


def test_glm52_pattern_counts(leaf) -> None:
    """The GLM-5.2 layout FFFSSS + (FSSS) x 18 derives a 78-layer pattern with 21 F and 57 S."""
    types = ["full"] * 3 + ["shared"] * 3 + (["full"] + ["shared"] * 3) * 18
    pattern = leaf.resolve_index_topk_pattern(None, types, 78)
    assert (len(pattern), pattern.count("F"), pattern.count("S")) == (78, 21, 57)
