# SPDX-License-Identifier: Apache-2.0
"""Draft acceptance set by construction: the token tables of the cost-realistic MTP checkpoint.

The checkpoint (make_mtp_cost_ckpt.py) makes the target's greedy next token a fixed permutation
``succ`` of the vocabulary and the MTP layer's draft of token ``x`` right exactly when ``x`` is a
*member*. This module builds those tables, with no torch and no vLLM, so that the acceptance a
decode sees is known before any GPU runs and can be checked against what the engine reports.
``draft`` stands in for the drafts: ``succ[x]`` for a member and, for a miss, a wrong token
(a derangement, so the table stays a permutation). The checkpoint's wrong drafts are other wrong
tokens; that changes nothing a decode counts, which stops at the first wrong draft.

The vocabulary is cut into cycles of ``succ``; a request stays on the cycle of its prompt.
Along each cycle, membership is drawn as a Markov chain on the length ``n`` of the run of
members just before a token: the token is a member with probability ``profile.rate(n)``
(``rates[n]``). A decode step that starts after a rejected draft therefore accepts its
draft at position ``p`` with probability ``rate(p)`` given the drafts before it were accepted:
the acceptance is partial and falls with position at the set rates. A step that follows one
whose drafts were all accepted starts inside a run, so it sees the later, lower rates: as in
text, predictability belongs to the content, not to the draft position (``simulate`` gives the
tokens per step this yields; ``expected_tokens_per_step`` is the fresh-run value). Cycles:

* ``prose``: rates 0.9, 0.8, 0.1, 0.05: two drafts usually land, later ones rarely; depth 2
  is the best fixed depth of 1-5 for a step cost ``1 + a * depth`` with ``a`` in [0.1, 0.6];
* ``code``: rates 0.99 falling to 0.97: depth 5 is the best fixed depth for the same costs;
* ``stream``: phases of ``phase_len`` tokens alternating code and prose (code first), the
  content of one request changing as it decodes;
* ``rest``: every other token (ids 0 and 1 among them), never a member.

``simulate`` decodes on the tables exactly as greedy speculative decoding does (a step drafts
``depth`` tokens by iterating ``draft``, accepts the longest prefix that matches ``succ``,
emits the accepted tokens plus the target's own).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Profile:
    """Acceptance of the draft at run position ``n`` (``n`` members just before it):
    ``rates[n]``, the last rate for every later position."""

    name: str
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.rates or not all(0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"profile {self.name}: rates must be in [0, 1], got {self.rates}")

    def rate(self, n: int) -> float:
        return self.rates[min(n, len(self.rates) - 1)]


PROFILES: dict[str, Profile] = {
    # two likely drafts, then little: depth 2 wins for a draft token costing 10-60 % of a step
    "prose": Profile("prose", (0.9, 0.8, 0.1, 0.05)),
    # nearly every draft lands: depth 5 wins for the same costs
    "code": Profile("code", (0.99, 0.99, 0.98, 0.98, 0.97)),
}
CYCLES = ("prose", "code", "stream", "rest")
SPECIAL_TOKENS = (0, 1)  # bos and eos of the checkpoint's config: never drawn into a cycle


@dataclass(frozen=True)
class Layout:
    """How the vocabulary is cut: cycle lengths and the stream's phases."""

    prose_len: int = 5000
    code_len: int = 5000
    phase_len: int = 768
    phases: int = 6

    @property
    def stream_len(self) -> int:
        return self.phase_len * self.phases

    def check(self, vocab: int) -> None:
        used = self.prose_len + self.code_len + self.stream_len + len(SPECIAL_TOKENS)
        if min(self.prose_len, self.code_len, self.phase_len, self.phases) < 2:
            raise ValueError(f"every cycle and phase needs >= 2 tokens: {self}")
        if used + 2 > vocab:
            raise ValueError(f"layout needs {used + 2} token ids, the vocabulary has {vocab}")


@dataclass
class Tables:
    """The permutations the checkpoint encodes and the cycles they form."""

    vocab: int
    succ: list[int]
    draft: list[int]
    member: list[bool]
    cycles: dict[str, list[int]] = field(default_factory=dict)
    phase_of: dict[str, list[str]] = field(default_factory=dict)
    """Per cycle, the profile name at every cycle position ("none" on ``rest``)."""

    def position(self, cycle: str, token: int) -> int:
        return self.cycles[cycle].index(token)


def phase_profiles(layout: Layout) -> list[str]:
    """The stream cycle's profile at each of its positions: code, prose, code, ..."""
    names = ("code", "prose")
    return [names[(i // layout.phase_len) % 2] for i in range(layout.stream_len)]


def build_tables(vocab: int, seed: int = 0, layout: Layout | None = None) -> Tables:
    """The tables of a checkpoint of ``vocab`` token ids (seeded; deterministic)."""
    layout = layout or Layout()
    layout.check(vocab)
    rng = random.Random(seed)
    ids = [t for t in range(vocab) if t not in SPECIAL_TOKENS]
    rng.shuffle(ids)
    cut = {"prose": layout.prose_len, "code": layout.code_len, "stream": layout.stream_len}
    cycles: dict[str, list[int]] = {}
    at = 0
    for name in ("prose", "code", "stream"):
        cycles[name] = ids[at : at + cut[name]]
        at += cut[name]
    cycles["rest"] = list(SPECIAL_TOKENS) + ids[at:]
    phase_of = {
        "prose": ["prose"] * layout.prose_len,
        "code": ["code"] * layout.code_len,
        "stream": phase_profiles(layout),
        "rest": ["none"] * len(cycles["rest"]),
    }
    succ = [-1] * vocab
    member = [False] * vocab
    for name, cyc in cycles.items():
        run = 0
        for i, tok in enumerate(cyc):
            succ[tok] = cyc[(i + 1) % len(cyc)]
            prof = phase_of[name][i]
            hit = prof != "none" and rng.random() < PROFILES[prof].rate(run)
            member[tok] = hit
            run = run + 1 if hit else 0
    draft = list(succ)
    misses = [t for t in range(vocab) if not member[t]]
    # a derangement of the misses' successors: every miss drafts a wrong token, and the
    # draft table stays a permutation (one head row per drafted token)
    for i, tok in enumerate(misses):
        draft[tok] = succ[misses[(i + 1) % len(misses)]]
    return Tables(vocab, succ, draft, member, cycles, phase_of)


def check_tables(t: Tables) -> list[str]:
    """What is wrong with ``t``: the tables must be permutations, a member's draft must be its
    successor and a miss's draft must not be."""
    errors = []
    if sorted(t.succ) != list(range(t.vocab)):
        errors.append("succ is not a permutation")
    if sorted(t.draft) != list(range(t.vocab)):
        errors.append("draft is not a permutation")
    wrong = [x for x in range(t.vocab) if (t.draft[x] == t.succ[x]) != t.member[x]]
    if wrong:
        errors.append(f"{len(wrong)} tokens whose draft disagrees with membership, e.g. {wrong[0]}")
    return errors


def prompt(t: Tables, cycle: str, start: int, length: int) -> list[int]:
    """``length`` consecutive tokens of ``cycle`` ending at position ``start``: the first
    generated token is the one after ``start``."""
    cyc = t.cycles[cycle]
    return [cyc[(start - length + 1 + i) % len(cyc)] for i in range(length)]


@dataclass
class Step:
    depth: int
    accepted: int


def simulate(
    t: Tables, last: int, num_tokens: int, depth: int | Callable[[list[Step]], int]
) -> tuple[list[int], list[Step]]:
    """Greedy speculative decoding on the tables from the prompt's last token ``last`` until
    ``num_tokens`` tokens are out (the engine's ``max_tokens``): the tokens and the steps.
    ``depth`` is a fixed depth or a function of the steps so far. The prefill emits the first
    token without drafts; each later step drafts from the last emitted token."""
    out = [t.succ[last]]
    steps: list[Step] = []
    while len(out) < num_tokens:
        d = depth if isinstance(depth, int) else depth(steps)
        x, guess, accepted = out[-1], out[-1], 0
        for _ in range(d):
            guess = t.draft[guess]
            if guess != t.succ[x]:
                break
            accepted += 1
            x = guess
        steps.append(Step(d, accepted))
        for _ in range(accepted + 1):
            out.append(t.succ[out[-1]])
    return out[:num_tokens], steps


def acceptance(steps: Iterable[Step], max_depth: int) -> dict[str, list[float]]:
    """Per draft position: ``unconditional`` accepted / verifications that drafted it and
    ``conditional`` accepted / verifications whose earlier drafts were all accepted."""
    drafted = [0] * max_depth
    reached = [0] * max_depth
    accepted = [0] * max_depth
    for s in steps:
        for p in range(min(s.depth, max_depth)):
            drafted[p] += 1
            if p <= s.accepted:
                reached[p] += 1
            if p < s.accepted:
                accepted[p] += 1
    return {
        "unconditional": [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)],
        "conditional": [a / r if r else 0.0 for a, r in zip(accepted, reached, strict=True)],
    }


def expected_tokens_per_step(profile: Profile, depth: int) -> float:
    """Tokens a step of ``depth`` emits when it starts a fresh run: 1 + sum over positions of
    the probability that every draft up to it is accepted."""
    total, reach = 1.0, 1.0
    for p in range(depth):
        reach *= profile.rate(p)
        total += reach
    return total


def best_fixed_depth(
    tokens_per_step: Callable[[int], float],
    step_cost: Callable[[int], float],
    depths: Sequence[int],
) -> int:
    """The depth with the most tokens per unit of step cost."""
    return max(depths, key=lambda d: tokens_per_step(d) / step_cost(d))
