# SPDX-License-Identifier: Apache-2.0
"""Proofs for vllm/0001: ``index_topk_pattern`` resolved from GLM-MoE-DSA ``indexer_types``.

Loads the shipped helper ``vllm/transformers_utils/dsa_index_pattern.py`` (standard library
only) from the patched tree.
"""

from __future__ import annotations

import pytest
from conftest import load_leaf
from hypothesis import given, settings
from hypothesis import strategies as st

LEAF = "vllm/transformers_utils/dsa_index_pattern.py"
TO_TYPE = {"F": "full", "S": "shared"}

# Valid layouts start with a full layer (a shared layer reuses a preceding full one).
layouts = st.builds(lambda rest: "F" + rest, st.text(st.sampled_from("FS"), max_size=120))
# Valid characters, their lower-case and look-alike neighbours, and arbitrary text.
pattern_chars = st.sampled_from(list("FSfsXT0 \n")) | st.characters()


@pytest.fixture(scope="module")
def leaf():
    return load_leaf(LEAF)


@given(layout=layouts)
def test_checkpoint_layout_round_trips(leaf, layout: str) -> None:
    """For any valid layout, the pattern derived from its indexer_types maps back to the
    same list, and without an IndexCache request it is the resolved pattern."""
    indexer_types = [TO_TYPE[c] for c in layout]
    n = len(layout)
    pattern = leaf.pattern_from_indexer_types(indexer_types, n)
    assert [TO_TYPE[c] for c in pattern] == indexer_types
    assert leaf.resolve_index_topk_pattern(n, indexer_types=indexer_types) == pattern
    assert (
        leaf.resolve_index_topk_pattern(n, indexer_types=indexer_types, index_topk_freq=1)
        == pattern
    )


@given(pattern=st.text(pattern_chars, max_size=40), n=st.integers(0, 40))
def test_validation_accepts_exactly_valid_patterns(leaf, pattern: str, n: int) -> None:
    """validate_index_topk_pattern accepts a string iff it has n characters, all F or S, the
    first one F; every rejection names the expected length and the valid characters."""
    valid = len(pattern) == n and set(pattern) <= {"F", "S"} and pattern[:1] in ("", "F")
    try:
        leaf.validate_index_topk_pattern(pattern, n)
        accepted = True
    except ValueError as e:
        accepted = False
        assert f"expected a string of {n} characters from ['F', 'S']" in str(e)
    assert accepted == valid


@given(layout=layouts, data=st.data())
def test_request_is_accepted_iff_it_shares_at_least_the_checkpoint(leaf, layout, data) -> None:
    """An IndexCache pattern is accepted iff every layer it makes full is full in the
    checkpoint, and then it is the resolved pattern; otherwise the error names the first
    layer that has no indexer weights."""
    n = len(layout)
    indexer_types = [TO_TYPE[c] for c in layout]
    request = "F" + data.draw(st.text(st.sampled_from("FS"), min_size=n - 1, max_size=n - 1))
    bad = [i for i in range(n) if request[i] == "F" and layout[i] == "S"]
    if not bad:
        got = leaf.resolve_index_topk_pattern(
            n, indexer_types=indexer_types, index_topk_pattern=request
        )
        assert got == request
        return
    with pytest.raises(ValueError, match=f"makes layer {bad[0]} a full indexer layer"):
        leaf.resolve_index_topk_pattern(n, indexer_types=indexer_types, index_topk_pattern=request)


@pytest.fixture(scope="module")
def glm_moe_dsa_config():
    return pytest.importorskip("transformers").GlmMoeDsaConfig


@settings(deadline=None)
@given(n=st.integers(0, 100), freq=st.integers(1, 12), offset=st.integers(1, 8))
def test_freq_schedule_matches_transformers_glm_moe_dsa_config(
    leaf, glm_moe_dsa_config, n, freq, offset
) -> None:
    """The pattern of the index_topk_freq schedule equals the indexer_types that
    transformers' GlmMoeDsaConfig derives from the same freq/offset (an independent
    implementation of the attention layers' rule)."""
    cfg = glm_moe_dsa_config(
        num_hidden_layers=n, index_topk_freq=freq, index_skip_topk_offset=offset
    )
    pattern = leaf.pattern_from_topk_freq(n, freq, offset)
    assert [TO_TYPE[c] for c in pattern] == cfg.indexer_types
    resolved = leaf.resolve_index_topk_pattern(
        n,
        indexer_types=cfg.indexer_types,
        index_topk_freq=freq,
        index_skip_topk_offset=offset,
    )
    assert resolved == pattern


@given(indexer_types=st.lists(st.text(max_size=8), min_size=1, max_size=20))
def test_unknown_indexer_types_are_rejected(leaf, indexer_types: list[str]) -> None:
    """An indexer_types list is accepted iff every entry is "full" or "shared"."""
    valid = all(t in ("full", "shared") for t in indexer_types)
    try:
        leaf.pattern_from_indexer_types(indexer_types, len(indexer_types))
        accepted = True
    except ValueError as e:
        accepted = False
        assert "valid values are ['full', 'shared']" in str(e)
    assert accepted == valid


@given(layout=layouts)
def test_loader_drops_exactly_the_unbuilt_indexers(leaf, layout: str) -> None:
    """With indexer parameters only on F layers, a checkpoint weight is dropped iff it is
    an indexer weight of an S layer; every other weight is kept."""
    params = []
    for i, c in enumerate(layout):
        params.append(f"model.layers.{i}.self_attn.kv_b_proj.weight")
        if c == "F":
            params += [
                f"model.layers.{i}.self_attn.indexer.wq_b.weight",
                f"model.layers.{i}.self_attn.indexer.wk_weights_proj.weight",
            ]
    owners = leaf.indexer_owner_prefixes(params)
    for i, c in enumerate(layout):
        for tail in ("indexer.wk.weight", "indexer.wk.weight_scale_inv", "indexer.k_norm.bias"):
            name = f"model.layers.{i}.self_attn.{tail}"
            assert leaf.is_unbuilt_indexer_weight(name, owners) == (c == "S")
        assert not leaf.is_unbuilt_indexer_weight(
            f"model.layers.{i}.self_attn.q_a_proj.weight", owners
        )


def test_glm52_pattern_counts(leaf) -> None:
    """The GLM-5.2 layout FFFSSS + (FSSS) x 18 resolves to a 78-layer pattern with 21 F and
    57 S, the same as the freq-4 schedule with offset 3."""
    types = ["full"] * 3 + ["shared"] * 3 + (["full"] + ["shared"] * 3) * 18
    pattern = leaf.resolve_index_topk_pattern(78, indexer_types=types)
    assert (len(pattern), pattern.count("F"), pattern.count("S")) == (78, 21, 57)
    assert pattern == leaf.pattern_from_topk_freq(78, 4, 3)
