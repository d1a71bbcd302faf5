# SPDX-License-Identifier: Apache-2.0
"""CPU proofs for vllm/0012 (on the pinned vLLM base, pins.toml): the adaptive speculation-depth
controller (k-ladder 2/4/5).

The controller is loaded by path from the patched tree
(``vllm/v1/spec_decode/adaptive_depth.py``, stdlib only; ``$DCP_VLLM_TREE``). Acceptance
traces are generated with hypothesis. A trace is a list of steps; each step lists, per request,
its *accept length* ``a``: the draft at position ``p`` (0-based) would be accepted iff
``p < a``, so a verification of ``d`` drafts accepts ``min(a, d)`` tokens.

The cost model (stated in design/mtp.md): one decode step at depth ``d`` costs
``1 + alpha * d`` (target verification of ``d + 1`` tokens plus ``d`` draft steps; the
verify cost grows with depth) and yields ``1 + min(a, d)`` tokens; the drafts verified in a
step were made at the depth chosen in the previous step. Prose-like phases draw ``a`` with
a per-position conditional acceptance ``q0 * decay**p``, ``q0`` in [0.50, 0.70], ``decay``
in [0.85, 1.0]; code-like phases ``q0`` in [0.90, 0.99], ``decay`` in [0.95, 1.0];
``alpha`` in [0.15, 0.20].
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import ModuleType

import pytest
from conftest import load_leaf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

LADDER = (2, 4, 5)
WINDOWS = {2: 32, 4: 16, 5: 16}
MAX_ACCEPT = 5


@pytest.fixture(scope="module")
def ad() -> ModuleType:
    return load_leaf("vllm/v1/spec_decode/adaptive_depth.py")


# --------------------------------------------------------------------------------------
# The facts table, written out literally (independent of the module's generic rules).
# --------------------------------------------------------------------------------------
def table_next_depth(depth: int, accepted: list[int], drafted: list[int], n: int) -> int:
    def rate(p: int) -> float:
        return accepted[p] / n

    if depth == 2:
        return 4 if sum(accepted) / sum(drafted) >= 0.85 else 2
    if depth == 4:
        g = rate(2) + rate(3)
        return 5 if g >= 0.70 else 4 if g >= 0.35 else 2
    assert depth == 5
    if rate(4) >= 0.15:
        return 5
    return 4 if rate(2) + rate(3) >= 0.35 else 2


@dataclass
class Reference:
    """A from-scratch model of the controller: windows, table and epochs."""

    depth: int = 2
    epoch: int = 0
    steps: int = 0

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.n = 0
        self.accepted = [0] * self.depth
        self.drafted = [0] * self.depth

    def step(self, verifications: list[tuple[int, int, int]]) -> bool:
        """``verifications``: (epoch, drafted, accepted). Returns True at a window end."""
        fresh = [(d, a) for e, d, a in verifications if e == self.epoch]
        if not fresh:
            return False
        for d, a in fresh:
            self.n += 1
            for p in range(d):
                self.drafted[p] += 1
            for p in range(a):
                self.accepted[p] += 1
        self.steps += 1
        if self.steps < WINDOWS[self.depth]:
            return False
        new = table_next_depth(self.depth, self.accepted, self.drafted, self.n)
        if new != self.depth:
            self.depth = new
            self.epoch += 1
        self.reset()
        return True


@st.composite
def acceptance_traces(draw):
    """Steps of per-request accept lengths, with phases of different acceptance."""
    seed = draw(st.integers(0, 2**32 - 1))
    num_phases = draw(st.integers(1, 4))
    phases = [
        (draw(st.integers(10, 150)), draw(st.floats(0.0, 1.0)), draw(st.floats(0.5, 1.0)))
        for _ in range(num_phases)
    ]
    batch = draw(st.integers(1, 3))
    rng = random.Random(seed)
    trace = []
    for length, q0, decay in phases:
        for _ in range(length):
            trace.append([accept_length(rng, q0, decay) for _ in range(batch)])
    return trace


def accept_length(rng: random.Random, q0: float, decay: float) -> int:
    a, q = 0, q0
    while a < MAX_ACCEPT and rng.random() < q:
        a += 1
        q *= decay
    return a


def drive(ad: ModuleType, trace: list[list[int]], stale_every: int = 0, seed: int = 0):
    """Run the controller over ``trace``, verifying each step the drafts of the previous
    step (made at that step's depth and epoch). With ``stale_every`` > 0, stale
    verifications tagged with a wrong epoch are injected. Returns the depth per step and
    the indices of the steps after which the depth was decided."""
    rng = random.Random(seed)
    ctl = ad.AdaptiveDepthController()
    ref = Reference()
    prev = (ctl.epoch, ctl.depth)
    depths, decided = [], []
    for i, step in enumerate(trace):
        verifs = [(prev[0], prev[1], min(a, prev[1])) for a in step]
        if stale_every and i % stale_every == 0:
            wrong = ctl.epoch - 1 - rng.randrange(3) if ctl.epoch else ctl.epoch + 1
            verifs.append((wrong, 1, rng.randrange(2)))
        for epoch, drafted, accepted in verifs:
            if epoch != ctl.epoch:
                assert not ctl.observe(epoch, drafted, accepted)
            else:
                assert ctl.observe(epoch, drafted, accepted)
        decision = ctl.end_step()
        ref_decided = ref.step(verifs)
        assert (decision is not None) == ref_decided
        assert (ctl.depth, ctl.epoch) == (ref.depth, ref.epoch)
        if decision is not None:
            decided.append(i)
        depths.append(ctl.depth)
        prev = (ctl.epoch, ctl.depth)
    return depths, decided


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=acceptance_traces())
def test_depth_follows_the_table_on_the_ladder_at_window_ends(ad, trace):
    """For any acceptance trace the depth is always a ladder value, starts at 2, changes only
    when a window of 32 (at k2) or 16 (at k4/k5) counted steps closes, and equals the depth
    the facts table gives for that window."""
    depths, decided = drive(ad, trace)
    assert all(d in LADDER for d in depths)
    prev, last_decision = 2, -1
    for i, d in enumerate(depths):
        if d != prev:
            assert i in decided
        prev = d
    # Windows are non-overlapping: consecutive decisions are >= the window length apart
    # (steps that count only stale frames do not advance a window).
    depth_at = [2] + depths
    for i in decided:
        assert i - last_decision >= WINDOWS[depth_at[last_decision + 1]]
        last_decision = i


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=acceptance_traces(), in_flight=st.integers(0, 3))
def test_request_bookkeeping_counts_exactly_the_current_epochs_drafts(ad, trace, in_flight):
    """With 0-3 frames in flight between scheduling a step and processing its output (async
    scheduling, pipeline parallelism), the request-keyed bookkeeping the scheduler uses
    (``drafts_proposed`` per scheduled request, ``verify`` per verification) counts a
    verification iff its drafts were proposed in the current epoch, and gives the depth
    trajectory of tagging each verification with the epoch of the frame that proposed it."""
    keyed = ad.AdaptiveDepthController()
    tagged = ad.AdaptiveDepthController()
    pending: list[tuple[int, int]] = []  # (epoch, depth) of frames scheduled, not processed
    proposer: tuple[int, int] | None = None  # frame whose drafts the requests carry
    keyed_depths, tagged_depths = [], []
    for step in trace:
        pending.append((keyed.epoch, keyed.depth))  # schedule the next frame
        if len(pending) <= in_flight:
            continue
        frame = pending.pop(0)  # process the oldest frame
        for req, a in enumerate(step):
            if proposer is not None:
                epoch, depth = proposer
                fresh = epoch == tagged.epoch
                assert keyed.verify(str(req), depth, min(a, depth)) == fresh
                assert tagged.observe(epoch, depth, min(a, depth)) == fresh
            keyed.drafts_proposed(str(req), frame[0])
        proposer = frame
        keyed.end_step()
        tagged.end_step()
        keyed_depths.append(keyed.depth)
        tagged_depths.append(tagged.depth)
    assert keyed_depths == tagged_depths
    assert keyed.num_stale_verifications == tagged.num_stale_verifications
    # Each depth change makes the drafts of the frame just processed and of the frames in
    # flight stale, for every request; a new window needs fresh steps, so only the last
    # change can be cut short by the end of the trace.
    per_change = len(trace[0]) * (in_flight + 1)
    changes = keyed.epoch
    assert per_change * max(changes - 1, 0) <= keyed.num_stale_verifications
    assert keyed.num_stale_verifications <= per_change * changes


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=acceptance_traces(), stale_every=st.integers(1, 5), seed=st.integers(0, 99))
def test_stale_frames_change_nothing(ad, trace, stale_every, seed):
    """Verifications tagged with another epoch (frames in flight when the depth changed) are
    ignored: injecting them anywhere leaves the depth trajectory unchanged."""
    clean, _ = drive(ad, trace)
    noisy, _ = drive(ad, trace, stale_every=stale_every, seed=seed)
    assert noisy == clean


# --------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------
def throughput_fixed(trace: list[int], depth: int, alpha: float) -> float:
    tokens = sum(1 + min(a, depth) for a in trace)
    return tokens / (len(trace) * (1 + alpha * depth))


def throughput_adaptive(ad: ModuleType, trace: list[int], alpha: float) -> float:
    ctl = ad.AdaptiveDepthController()
    prev_epoch, prev_depth = ctl.epoch, ctl.depth
    tokens, time = 0, 0.0
    for a in trace:
        accepted = min(a, prev_depth)
        tokens += 1 + accepted
        time += 1 + alpha * prev_depth
        ctl.observe(prev_epoch, prev_depth, accepted)
        ctl.end_step()
        prev_epoch, prev_depth = ctl.epoch, ctl.depth
    return tokens / time


PROSE = dict(q0=st.floats(0.50, 0.70), decay=st.floats(0.85, 1.0))
CODE = dict(q0=st.floats(0.90, 0.99), decay=st.floats(0.95, 1.0))
ALPHA = st.floats(0.15, 0.20)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["prose", "code"]),
    data=st.data(),
    alpha=ALPHA,
    seed=st.integers(0, 2**32 - 1),
)
def test_adaptive_within_3_percent_of_best_fixed_on_stationary_profiles(
    ad, kind, data, alpha, seed
):
    """On every stationary prose-like or code-like profile (2,000 steps), adaptive decode
    throughput is at least 97% of the best fixed depth of the ladder."""
    family = PROSE if kind == "prose" else CODE
    q0, decay = data.draw(family["q0"]), data.draw(family["decay"])
    rng = random.Random(seed)
    trace = [accept_length(rng, q0, decay) for _ in range(2000)]
    best = max(throughput_fixed(trace, d, alpha) for d in LADDER)
    assert throughput_adaptive(ad, trace, alpha) >= 0.97 * best


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    alpha=ALPHA,
    num_switches=st.integers(2, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_adaptive_beats_every_fixed_depth_on_prose_code_mixtures(
    ad, data, alpha, num_switches, seed
):
    """On every mixture of prose-like and code-like phases (500-1500 steps each, alternating,
    starting with either), adaptive decode throughput exceeds every fixed depth 1..5."""
    rng = random.Random(seed)
    first = data.draw(st.sampled_from(["prose", "code"]))
    trace: list[int] = []
    for i in range(num_switches + 1):
        kind = first if i % 2 == 0 else ("code" if first == "prose" else "prose")
        family = PROSE if kind == "prose" else CODE
        q0, decay = data.draw(family["q0"]), data.draw(family["decay"])
        length = data.draw(st.integers(500, 1500))
        trace += [accept_length(rng, q0, decay) for _ in range(length)]
    adaptive = throughput_adaptive(ad, trace, alpha)
    for depth in range(1, 6):
        assert adaptive > throughput_fixed(trace, depth, alpha)
