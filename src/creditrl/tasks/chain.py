"""Long chains of small arithmetic steps: the long-output setting.

A problem ``"31~040="`` gives two digits and asks for 40 steps of the recurrence
``(a, b) -> (b, (a op b) mod m)`` (``m`` = ``modulus``, 5 by default) from ``(3, 1)``. Step ``i``
(its counter running down from ``n`` to 1) is written ``{i:03d}:{a}{op}{b}={c}``; its operator is
``+`` when the counter's last digit is 0-4 and ``-`` when it is 5-9 (:func:`step_operator`), so
the sequence depends on where the count starts, not only on the two digits. Steps are joined with
``";"`` and the completion ends with ``";#"`` and the last three values::

    "31~003="  ->  "003:3+1=4;002:1+4=0;001:4+0=4;#404"

Every step is ten characters with its ``";"``: the response of an ``n``-step problem is
``10 n + 4`` characters and the eos (``n = 6, 25, 51, 99``: about 64, 256, 512 and 1,000 tokens
under the character tokenizer). Each step is local -- copy the previous step's second operand
and result, decrement the counter, read the operator off its last digit, look up one of ``2 m^2``
single-digit facts -- so per-step accuracy is high while a whole solution is right only if all
``n`` steps are: the regime in which a sequence-level reward says least about which step went
wrong. The answer is right by luck with probability about ``m^-3``.

**The outcome** (``outcome``). ``"answer"`` (the default) reads only the last three values after
the ``"#"``, so an answer can be "correct" with a wrong step before it. ``"steps"`` is right only
for the canonical solution: its ``n`` steps, each right, in order, then the right answer and
nothing after it; an outcome of 1 is then exactly "every step label is right".

**The held-out split** (``heldout``). ``"prompt"`` (the default) holds out prompts by a hash of
the prompt, so a held-out ``"31~045="`` is the 45-step suffix of any training chain that passes
through the pair ``(3, 1)`` at counter 45. ``"cycle"`` holds out computations instead. A step
depends only on the state ``(a, b, counter mod 10)``, and the step map ``(a, b, k) -> (b, (a op_k
b) mod m, k - 1 mod 10)`` is a bijection of the ``10 m^2`` states (``a`` is recovered from ``b``
and the result), so the states fall into disjoint cycles and a chain walks along the cycle of its
first state (:func:`state_cycles`). A cycle is held out iff the SHA-256 of
``"chain-cycle/{m}/{a}{b}{k}"`` at its least state is divisible by ``heldout_mod``, and a prompt
is held out iff its first state's cycle is. No state of a held-out chain then occurs in any
training chain, so no held-out computation is a contiguous run of a training one (nor, once it
has 5 or more steps, without its counters: 5 operators in a row fix the counter's last digit).
Every single-digit fact ``a op b`` still occurs in training (the config refuses a split that
would hold one out), so a held-out chain asks for known facts in an order SFT never saw. With mod
10 and ``heldout_mod=5``, 9 of the 50 cycles are held out, 21 of the 100 prompts of every length
(``heldout_mod`` 2, 3 and 4 hold out the all-zero cycle, the only one with ``0+0`` and ``0-0``).

**Training on unseen computations** (``train_unseen``, with ``heldout="cycle"``). The cycles held
out above are split in two halves of about equal size: taken longest first (ties by least state),
the first, third, ... stay held out and the second, fourth, ... become the train split; the cycles
an SFT with the same ``heldout_mod`` trains on belong to neither (split ``"seen"``). RL then trains on chains
whose every state SFT never saw, and is evaluated on chains that neither SFT nor RL saw: the start
solves its RL prompts about as rarely as its held-out ones, which is what a sparse outcome means.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from creditrl.tasks.arithmetic import StepTask, labels_in_order, split_completion
from creditrl.tasks.base import Drawn, Problem, hash_split, register_task

__all__ = [
    "ChainConfig",
    "ChainTask",
    "band",
    "chain_steps",
    "sft_longest",
    "STEP_CHARS",
    "state_cycles",
    "steps_for_tokens",
]

STEP_CHARS = 10  # "040:3+4=2;"
_PROMPT_RE = re.compile(r"([0-9]{2})~([0-9]{3})=?")
_MAX_CONSECUTIVE_MISSES = 100_000
MAX_STEPS = 999  # the counter has three digits
OUTCOMES = ("answer", "steps")
HELDOUT_SPLITS = ("prompt", "cycle")
SEEN = "seen"  # with train_unseen: a prompt of the cycles SFT trains on, in neither RL split
State = tuple[int, int, int]  # (a, b, counter mod 10): all that the rest of a chain depends on


def steps_for_tokens(tokens: int) -> int:
    """The chain length (1 to 999) whose response with its eos, ``10 n + 5`` tokens, is closest to
    ``tokens``; a tie goes to the shorter chain (``1000 -> 99``, 995 tokens)."""
    return max(1, min(MAX_STEPS, (tokens - 1) // STEP_CHARS))


BAND = 2  # a band of chain lengths is n - BAND .. n + BAND: one length alone has only modulus^2 prompts


def band(n: int, longest: int = MAX_STEPS) -> tuple[int, int]:
    """The chain lengths around ``n``: ``n - 2 .. n + 2`` within ``1 .. longest`` (the longest chain
    an SFT saw: its counter has not passed it), shifted down to keep its width at the top."""
    hi = min(MAX_STEPS, longest, n + BAND)
    return max(1, (hi - 2 * BAND) if n + BAND > hi else (n - BAND)), hi


def sft_longest(cfg: Any) -> int:
    """The longest chain of a config's SFT problems (``sft.task_args``, else ``task.args``; 999 when
    they are not chain problems)."""
    args = cfg.sft.task_args or cfg.task.args
    return int(args.get("max_steps", MAX_STEPS)) if cfg.task.name == "chain" else MAX_STEPS


@dataclass(frozen=True)
class ChainConfig:
    """Distribution of chain problems.

    Attributes:
        min_steps: Shortest chain (>= 1).
        max_steps: Longest chain (min_steps <= max_steps <= 999).
        modulus: The values are digits ``0 .. modulus - 1`` and each step is taken mod ``modulus``
            (2 to 10).
        heldout_mod: A prompt is held out iff its SHA-256 (as an integer) is divisible by
            ``heldout_mod`` (>= 2).
        distinct_heldout: Draw held-out problems without repeats (an evaluation set of distinct
            problems; an error when the band holds fewer than asked for). A band of k lengths
            holds ``k modulus^2`` prompts, about ``1 / heldout_mod`` of them held out.
        outcome: ``"answer"``: the outcome reads the last three values only; ``"steps"``: the
            whole solution, every step and the answer (the module docstring).
        heldout: ``"prompt"``: held out by a hash of the prompt (held-out chains are suffixes of
            training ones); ``"cycle"``: by a hash of the state cycle the chain walks, so no
            held-out computation occurs in training (the module docstring).
        train_unseen: With ``heldout="cycle"``: the train split is half of the held-out cycles,
            the held-out split the other half, so RL trains on computations that an SFT without
            this option never saw (the module docstring).
    """

    min_steps: int = 25
    max_steps: int = 25
    modulus: int = 5
    heldout_mod: int = 10
    distinct_heldout: bool = False
    outcome: str = "answer"
    heldout: str = "prompt"
    train_unseen: bool = False

    def __post_init__(self) -> None:
        """Reject out-of-range fields with a ValueError naming the field and its allowed range."""
        if self.min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {self.min_steps}")
        if not self.min_steps <= self.max_steps <= MAX_STEPS:
            raise ValueError(f"max_steps must lie in [min_steps ({self.min_steps}), {MAX_STEPS}], got {self.max_steps}")
        if not 2 <= self.modulus <= 10:
            raise ValueError(f"modulus must lie in [2, 10], got {self.modulus}")
        if self.heldout_mod < 2:
            raise ValueError(f"heldout_mod must be >= 2, got {self.heldout_mod}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")
        if self.heldout not in HELDOUT_SPLITS:
            raise ValueError(f"heldout must be one of {', '.join(HELDOUT_SPLITS)}, got {self.heldout!r}")
        if self.heldout == "cycle" and (unseen := _facts_held_out(self.modulus, self.heldout_mod)):
            raise ValueError(
                f"heldout='cycle' with modulus {self.modulus} and heldout_mod {self.heldout_mod} holds out every "
                f"state of the facts {', '.join(unseen)}: training would never show them; choose another heldout_mod"
            )
        if self.train_unseen and self.heldout != "cycle":
            raise ValueError(f"train_unseen needs heldout='cycle', got heldout={self.heldout!r}")
        if self.train_unseen and len(set(_unseen_halves(self.modulus, self.heldout_mod).values())) < 2:
            raise ValueError(
                f"train_unseen with modulus {self.modulus} and heldout_mod {self.heldout_mod}: the held-out cycles "
                "do not split into a train and a held-out half; choose another heldout_mod"
            )


def _parse(prompt: str) -> tuple[list[int], int]:
    m = _PROMPT_RE.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a chain prompt (expected two digits, '~' and three digits: '31~040='): {prompt!r}")
    digits, n = m.groups()
    if not 1 <= int(n) <= MAX_STEPS:
        raise ValueError(f"chain length must lie in [1, {MAX_STEPS}], got {n} in {prompt!r}")
    return [int(d) for d in digits], int(n)


def step_operator(counter: int) -> str:
    """The operator of the step numbered ``counter``: ``+`` when its last digit is 0-4, ``-`` for 5-9."""
    return "+" if counter % 10 < 5 else "-"


def _next_state(state: State, modulus: int) -> State:
    a, b, k = state
    c = (a + b if step_operator(k) == "+" else a - b) % modulus
    return b, c, (k - 1) % 10


@functools.cache
def state_cycles(modulus: int) -> dict[State, State]:
    """Each state ``(a, b, counter mod 10)`` of the mod-``modulus`` chain mapped to its cycle's
    least state: the step map is a bijection of the ``10 modulus^2`` states, so they fall into
    disjoint cycles, and a chain's steps all lie on the cycle of its first state."""
    cycle_of: dict[State, State] = {}
    for start in sorted((a, b, k) for a in range(modulus) for b in range(modulus) for k in range(10)):
        state = start
        while state not in cycle_of:  # the least state of a new cycle comes first in sorted order
            cycle_of[state] = start
            state = _next_state(state, modulus)
    return cycle_of


def _cycle_held_out(least: State, modulus: int, heldout_mod: int) -> bool:
    a, b, k = least
    digest = hashlib.sha256(f"chain-cycle/{modulus}/{a}{b}{k}".encode()).hexdigest()
    return int(digest, 16) % heldout_mod == 0


@functools.cache
def _unseen_halves(modulus: int, heldout_mod: int) -> dict[State, str]:
    """Each held-out cycle (by its least state) mapped to its split under ``train_unseen``: in the
    order longest first, ties by least state, the cycles alternate ``"heldout"``, ``"train"``, ..."""
    sizes = Counter(state_cycles(modulus).values())
    held = sorted((-size, least) for least, size in sizes.items() if _cycle_held_out(least, modulus, heldout_mod))
    return {least: ("heldout", "train")[i % 2] for i, (_, least) in enumerate(held)}


@functools.cache
def _facts_held_out(modulus: int, heldout_mod: int) -> tuple[str, ...]:
    """The facts ``a op b`` whose every state lies on a held-out cycle (none for a usable split)."""
    cycles = state_cycles(modulus)
    seen = {(a, b, step_operator(k)) for (a, b, k), c in cycles.items() if not _cycle_held_out(c, modulus, heldout_mod)}
    every = {(a, b, op) for a in range(modulus) for b in range(modulus) for op in "+-"}
    return tuple(f"{a}{op}{b}" for a, b, op in sorted(every - seen))


def chain_steps(prompt: str, modulus: int = 5) -> tuple[list[str], str]:
    """The canonical steps (without ``";"``) of a chain prompt and its answer (the last three values)."""
    (a, b), n = _parse(prompt)
    if max(a, b) >= modulus:
        raise ValueError(f"chain prompt {prompt!r} has a digit >= the modulus {modulus}")
    steps, values = [], [a, b]
    for i in range(n, 0, -1):
        op = step_operator(i)
        c = (a + b if op == "+" else a - b) % modulus
        steps.append(f"{i:03d}:{a}{op}{b}={c}")
        a, b = b, c
        values.append(c)
    return steps, "".join(map(str, values[-3:]))


@register_task("chain")
class ChainTask(StepTask):
    """Long chains of single-digit modular steps (registry name ``"chain"``, step separator ``";"``)."""

    name: str = "chain"
    step_pattern = re.compile(r"[0-9]{3}:[0-9][+\-][0-9]=[0-9]")
    error_kinds: tuple[str, ...] = (
        "correct",
        "wrong_value",
        "wrong_copy",
        "wrong_counter",
        "malformed",
        "wrong_answer",
    )
    config_type = ChainConfig
    config: ChainConfig

    def split_of(self, prompt: str) -> str:
        """With ``heldout="prompt"``: ``"heldout"`` iff ``int(sha256(prompt), 16) % heldout_mod ==
        0``, else ``"train"``; with ``"cycle"``: that of the cycle of the prompt's first state (with
        ``train_unseen``: ``"heldout"`` or ``"train"`` on a held-out cycle, else ``"seen"``)."""
        cfg = self.config
        if cfg.heldout == "prompt":
            return hash_split(prompt, cfg.heldout_mod)
        (a, b), n = _parse(prompt.removesuffix("=") + "=")
        if max(a, b) >= cfg.modulus:
            raise ValueError(f"chain prompt {prompt!r} has a digit >= the modulus {cfg.modulus}")
        least = state_cycles(cfg.modulus)[(a, b, n % 10)]
        if cfg.train_unseen:
            return _unseen_halves(cfg.modulus, cfg.heldout_mod).get(least, SEEN)
        return "heldout" if _cycle_held_out(least, cfg.modulus, cfg.heldout_mod) else "train"

    def make_problem(self, prompt: str) -> Problem:
        """The problem of a prompt such as ``"31~040="`` (the ``"="`` may be left out)."""
        prompt = prompt.removesuffix("=") + "="
        return self._problem(prompt, *chain_steps(prompt, self.config.modulus))

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split``, deterministic for a given (config, split, seed); duplicates may occur."""
        cfg = self.config

        def draw(rng: random.Random) -> Drawn:
            digits = "".join(str(rng.randrange(cfg.modulus)) for _ in range(2))
            prompt = f"{digits}~{rng.randint(cfg.min_steps, cfg.max_steps):03d}="
            return prompt, lambda: self.make_problem(prompt)

        distinct = cfg.distinct_heldout and split == "heldout"
        return self._sample(
            n, split, seed, draw, space=f" for {cfg}", distinct=distinct, max_misses=_MAX_CONSECUTIVE_MISSES
        )

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """With ``outcome="answer"``: whether the text after the first ``"#"``, stripped, is the
        answer exactly. With ``"steps"``: that, and the completion's segments are the ``n`` canonical
        steps in order and then the answer (every label of :meth:`check_steps` right, ``n + 1`` of
        them)."""
        right = self._answer_right(problem, completion)
        if not right or self.config.outcome == "answer":
            return right
        segments = split_completion(completion)
        return len(segments) == problem.meta["n_ops"] + 1 and all(self.check_steps(problem, segments))

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """One label per segment: a step is right iff it is the next canonical step and every
        earlier one was right (stop at the first error); the answer segment iff it is the first
        answer segment and states the answer (the last three values)."""
        expected, _ = chain_steps(problem.prompt, self.config.modulus)
        return labels_in_order(expected, segments, lambda text: self._answer_right(problem, text))

    def _step_error(self, problem: Problem, i: int, text: str) -> str:
        """The kind of a wrong step (:meth:`first_error`): a wrong result (``wrong_value``), wrong
        operands (``wrong_copy``), a wrong counter (``wrong_counter``) or other text (``malformed``)."""
        expected, _ = chain_steps(problem.prompt, self.config.modulus)
        if i >= len(expected) or not self.step_pattern.fullmatch(text):
            return "malformed"
        want = expected[i]
        if text[:3] != want[:3]:
            return "wrong_counter"
        return "wrong_value" if text[:-1] == want[:-1] else "wrong_copy"
