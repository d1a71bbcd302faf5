# SPDX-License-Identifier: Apache-2.0
"""evidence/mtp_acceptance.py: the acceptance the cost-realistic MTP checkpoint encodes is
the one it was built for (pure Python; one property per test)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mtp_acceptance as acc  # noqa: E402

DEFAULT_VOCAB = 16384


@pytest.fixture(scope="module")
def tables() -> acc.Tables:
    return acc.build_tables(DEFAULT_VOCAB, 0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    prose=st.integers(2, 60),
    code=st.integers(2, 60),
    phase=st.integers(2, 20),
    phases=st.integers(2, 4),
    spare=st.integers(2, 30),
)
def test_tables_are_permutations_whose_drafts_match_membership(
    seed: int, prose: int, code: int, phase: int, phases: int, spare: int
) -> None:
    layout = acc.Layout(prose, code, phase, phases)
    vocab = prose + code + phase * phases + len(acc.SPECIAL_TOKENS) + spare
    t = acc.build_tables(vocab, seed, layout)
    assert acc.check_tables(t) == []
    assert sorted(x for c in t.cycles.values() for x in c) == list(range(vocab))
    for cyc in t.cycles.values():
        assert all(t.succ[a] == b for a, b in zip(cyc, cyc[1:] + cyc[:1], strict=True))


def test_layout_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="token ids"):
        acc.build_tables(100, 0, acc.Layout(50, 50, 10, 2))


def test_membership_follows_the_profile_rates(tables: acc.Tables) -> None:
    """Along every cycle, P(member | n members just before) is the profile's rate(n), within
    four binomial standard deviations, wherever at least 200 tokens sit at that state."""
    checked = 0
    for name in ("prose", "code", "stream"):
        cyc, phases = tables.cycles[name], tables.phase_of[name]
        hits: dict[tuple[str, int], list[int]] = {}
        run = 0
        for tok, prof in zip(cyc, phases, strict=True):
            key = (prof, min(run, 4))
            hits.setdefault(key, []).append(int(tables.member[tok]))
            run = run + 1 if tables.member[tok] else 0
        for (prof, n), xs in hits.items():
            if len(xs) < 200:
                continue
            rate = acc.PROFILES[prof].rate(n)
            sd = math.sqrt(max(rate * (1 - rate), 1e-4) / len(xs))
            assert abs(sum(xs) / len(xs) - rate) <= 4 * sd + 1e-9, (name, prof, n)
            checked += 1
    assert checked >= 6
    assert not any(tables.member[t] for t in tables.cycles["rest"])


@settings(max_examples=30, deadline=None)
@given(
    cycle=st.sampled_from(["prose", "code", "stream"]),
    start=st.integers(0, 4999),
    depth=st.integers(0, 6),
    n=st.integers(1, 200),
)
def test_simulated_decode_emits_the_target_chain_and_accepts_the_matching_prefix(
    tables: acc.Tables, cycle: str, start: int, depth: int, n: int
) -> None:
    last = tables.cycles[cycle][start]
    out, steps = acc.simulate(tables, last, n, depth)
    chain = [tables.succ[last]]
    while len(chain) < n:
        chain.append(tables.succ[chain[-1]])
    assert out == chain
    emitted = 1
    for s in steps:
        x = chain[emitted - 1]
        # independent count: drafts are draft^i(x), accepted while they equal succ^i(x)
        accepted, guess, truth = 0, x, x
        for _ in range(s.depth):
            guess, truth = tables.draft[guess], tables.succ[truth]
            if guess != truth:
                break
            accepted += 1
        assert s.accepted == accepted
        emitted += accepted + 1
    assert emitted >= n


def _tokens_per_step(tables: acc.Tables, cycle: str, depth: int) -> float:
    tokens = steps = 0
    for start in range(0, len(tables.cycles[cycle]), 250):
        out, st_ = acc.simulate(tables, tables.cycles[cycle][start], 400, depth)
        tokens += len(out) - 1
        steps += len(st_)
    return tokens / steps


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
def test_prose_is_best_at_depth_2_and_code_at_depth_5(tables: acc.Tables, alpha: float) -> None:
    """With a step costing ``1 + alpha * depth``, the best fixed depth of 1-5 is 2 on the prose
    cycle and 5 on the code cycle: depth is a trade-off that depends on the content."""
    best = {
        cycle: acc.best_fixed_depth(
            lambda d, c=cycle: _tokens_per_step(tables, c, d), lambda d: 1 + alpha * d, range(1, 6)
        )
        for cycle in ("prose", "code")
    }
    assert best == {"prose": 2, "code": 5}


def test_acceptance_falls_with_position(tables: acc.Tables) -> None:
    """Unconditional acceptance per draft position decreases on both profiles; prose keeps
    little beyond position 1, code keeps most."""
    for cycle, floor_last, ceil_last in (("prose", 0.0, 0.2), ("code", 0.8, 1.0)):
        steps = []
        for start in range(0, len(tables.cycles[cycle]), 250):
            steps += acc.simulate(tables, tables.cycles[cycle][start], 400, 5)[1]
        rates = acc.acceptance(steps, 5)["unconditional"]
        assert all(a >= b for a, b in itertools.pairwise(rates)), rates
        assert floor_last <= rates[-1] <= ceil_last, rates


def test_stream_alternates_code_then_prose(tables: acc.Tables) -> None:
    layout = acc.Layout()
    phases = tables.phase_of["stream"]
    starts = [phases[i * layout.phase_len] for i in range(layout.phases)]
    assert starts == ["code", "prose"] * (layout.phases // 2)
    assert len(phases) == layout.stream_len
