# SPDX-License-Identifier: Apache-2.0
"""Proofs for vllm/0001: which DSA layers share the top-k (``compute_skip_topk_layers``).

vLLM 0.34 decides the layers in ``compute_skip_topk_layers`` of
``vllm/model_executor/models/utils.py``, which 0001 extends (IndexCache request over
``indexer_types`` under ``use_index_cache``, validation). That module imports much of vLLM,
so this proof executes only the three functions of the patched tree's file,
``_index_cache_skip_topk_layers``, ``_use_index_cache`` and ``compute_skip_topk_layers``,
taken from its syntax tree with nothing but the builtins in scope: they need nothing else,
and the code under test is the shipped text of the file. (The loaders' filter of indexer
weights is vllm/0017, inline in the model files; the tree's
``tests/models/deepseek_v32/test_shared_indexer_weights.py`` covers it.)
"""

from __future__ import annotations

import ast
import builtins
from types import SimpleNamespace

import pytest
from conftest import patched_tree
from hypothesis import given, settings
from hypothesis import strategies as st

SOURCE = "vllm/model_executor/models/utils.py"
FUNCTIONS = ("_index_cache_skip_topk_layers", "_use_index_cache", "compute_skip_topk_layers")
TO_TYPE = {"F": "full", "S": "shared"}

# Valid layouts start with a full layer (a shared layer reuses a preceding full one).
layouts = st.builds(lambda rest: "F" + rest, st.text(st.sampled_from("FS"), max_size=120))
# Valid characters, their lower-case and look-alike neighbours, and arbitrary text.
pattern_chars = st.sampled_from(list("FSfsXT0 \n")) | st.characters()
# What a config.json or --hf-overrides may hold for use_index_cache besides true/false.
not_bools = (
    st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.lists(st.booleans(), max_size=2)
)


@pytest.fixture(scope="module")
def skip_topk_layers():
    """``compute_skip_topk_layers`` executed from the patched tree's source text."""
    path = patched_tree() / SOURCE
    if not path.is_file():
        pytest.fail(f"{path} not found: run `make apply` (or set DCP_VLLM_TREE) first")
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS
    ]
    if sorted(node.name for node in found) != sorted(FUNCTIONS):
        pytest.fail(f"{path} does not define {FUNCTIONS}: is 0001 applied?")
    namespace: dict = {"__builtins__": builtins}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["compute_skip_topk_layers"]


def _config(n: int, **fields) -> SimpleNamespace:
    return SimpleNamespace(num_hidden_layers=n, index_topk=2048, **fields)


def _shared(pattern: str) -> set[int]:
    return {i for i, c in enumerate(pattern) if c == "S"}


@given(layout=layouts)
def test_checkpoint_layout_without_a_request(skip_topk_layers, layout: str) -> None:
    """Without an IndexCache request (no pattern, index_topk_freq unset, null or 1) the shared
    layers are exactly the 'shared' entries of indexer_types."""
    types = [TO_TYPE[c] for c in layout]
    n = len(layout)
    for extra in ({}, {"index_topk_freq": None}, {"index_topk_freq": 1}):
        config = _config(n, indexer_types=types, **extra)
        assert skip_topk_layers(config) == _shared(layout)


@given(
    layout=layouts,
    switch=st.sampled_from([{}, {"use_index_cache": None}, {"use_index_cache": False}]),
    pattern=st.none() | st.text(st.sampled_from("FSX"), max_size=130),
    freq=st.none() | st.integers(1, 12),
    offset=st.none() | st.integers(0, 8),
)
def test_without_use_index_cache_the_checkpoint_layout_holds(
    skip_topk_layers, layout: str, switch: dict, pattern, freq, offset
) -> None:
    """With indexer_types and use_index_cache unset, null or false, whatever index_topk_*
    fields the config carries (the checkpoint's own, valid or not), the shared layers are
    exactly the 'shared' entries of indexer_types."""
    types = [TO_TYPE[c] for c in layout]
    fields = dict(index_topk_pattern=pattern, index_topk_freq=freq, index_skip_topk_offset=offset)
    config = _config(len(layout), indexer_types=types, **switch, **fields)
    assert skip_topk_layers(config) == _shared(layout)


@given(value=not_bools, layout=layouts, with_indexer_types=st.booleans())
def test_use_index_cache_is_accepted_exactly_when_a_bool(
    skip_topk_layers, value, layout: str, with_indexer_types: bool
) -> None:
    """use_index_cache other than true, false or unset/null is refused, naming the valid
    values, with or without indexer_types."""
    extra = {"indexer_types": [TO_TYPE[c] for c in layout]} if with_indexer_types else {}
    config = _config(len(layout), use_index_cache=value, **extra)
    with pytest.raises(ValueError, match="use_index_cache must be true or false"):
        skip_topk_layers(config)
    for ok in (True, False, None):
        skip_topk_layers(_config(len(layout), use_index_cache=ok, **extra))


@given(pattern=st.text(pattern_chars, max_size=40), n=st.integers(1, 40))
def test_pattern_is_accepted_exactly_when_valid(skip_topk_layers, pattern: str, n: int) -> None:
    """Without indexer_types an index_topk_pattern is accepted iff it has n characters, all F
    or S, the first one F; then its S layers share. Every rejection names the expected
    length and the valid characters."""
    valid = len(pattern) == n and set(pattern) <= {"F", "S"} and pattern[0] == "F"
    try:
        got = skip_topk_layers(_config(n, index_topk_pattern=pattern))
    except ValueError as e:
        assert not valid
        assert f"must be a string of {n} characters" in str(e)
        assert "['F', 'S']" in str(e)
        return
    assert valid
    assert got == _shared(pattern)


@given(layout=layouts, data=st.data())
def test_request_is_accepted_iff_it_shares_at_least_the_checkpoint(
    skip_topk_layers, layout: str, data
) -> None:
    """With indexer_types and use_index_cache, an IndexCache pattern is accepted iff every
    layer it makes full is full in the checkpoint, and then its S layers share; otherwise the
    error lists exactly the layers that have no indexer weights."""
    n = len(layout)
    request = "F" + data.draw(st.text(st.sampled_from("FS"), min_size=n - 1, max_size=n - 1))
    types = [TO_TYPE[c] for c in layout]
    config = _config(n, indexer_types=types, use_index_cache=True, index_topk_pattern=request)
    unbacked = [i for i in range(n) if request[i] == "F" and layout[i] == "S"]
    if not unbacked:
        assert skip_topk_layers(config) == _shared(request)
        return
    with pytest.raises(ValueError) as excinfo:
        skip_topk_layers(config)
    assert f"top-k on layers {unbacked}, which indexer_types marks 'shared'" in str(excinfo.value)


@pytest.fixture(scope="module")
def glm_moe_dsa_config():
    return pytest.importorskip("transformers").GlmMoeDsaConfig


@settings(deadline=None)
@given(n=st.integers(1, 100), freq=st.integers(2, 12), offset=st.integers(0, 8))
def test_freq_request_matches_transformers_glm_moe_dsa_config(
    skip_topk_layers, glm_moe_dsa_config, n: int, freq: int, offset: int
) -> None:
    """An index_topk_freq > 1 request shares the layers that transformers' GlmMoeDsaConfig
    (an independent implementation of the schedule) marks 'shared', without indexer_types or
    with an all-full one and use_index_cache; an offset that would share layer 0 (offset 0)
    is refused."""
    reference = glm_moe_dsa_config(
        num_hidden_layers=n, index_topk_freq=freq, index_skip_topk_offset=offset
    ).indexer_types
    for extra in ({}, {"indexer_types": ["full"] * n, "use_index_cache": True}):
        config = _config(n, index_topk_freq=freq, index_skip_topk_offset=offset, **extra)
        if offset == 0:
            assert reference[0] == "shared"
            with pytest.raises(ValueError, match="index_skip_topk_offset must be a positive"):
                skip_topk_layers(config)
            continue
        expected = {i for i, t in enumerate(reference) if t == "shared"}
        assert skip_topk_layers(config) == expected


@given(indexer_types=st.lists(st.text(max_size=8), min_size=1, max_size=20))
def test_unknown_indexer_types_are_rejected(skip_topk_layers, indexer_types: list[str]) -> None:
    """An indexer_types list is accepted iff every entry is "full" or "shared"."""
    valid = all(t in ("full", "shared") for t in indexer_types)
    config = _config(len(indexer_types), indexer_types=indexer_types)
    try:
        skip_topk_layers(config)
    except ValueError as e:
        assert not valid
        assert "only supports 'full' and 'shared'" in str(e)
        return
    assert valid


def test_glm52_layout_and_the_issue_case(skip_topk_layers) -> None:
    """GLM-5.2 (FFFSSS + (FSSS) x 18) shares 57 of 78 layers; the IndexCache request
    FFFSSSSSSSSF (with use_index_cache) on the checkpoint layout FFFFSSSFSSSF builds
    FFFSSSSSSSSF (stock vLLM 0.34.0 builds FFFFSSSFSSSF)."""
    glm52 = "FFFSSS" + "FSSS" * 18
    got = skip_topk_layers(_config(78, indexer_types=[TO_TYPE[c] for c in glm52]))
    assert (len(got), 78 - len(got)) == (57, 21)
    config = _config(
        12,
        indexer_types=[TO_TYPE[c] for c in "FFFFSSSFSSSF"],
        use_index_cache=True,
        index_topk_pattern="FFFSSSSSSSSF",
    )
    assert skip_topk_layers(config) == _shared("FFFSSSSSSSSF")
