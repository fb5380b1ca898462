"""Long chains of small arithmetic steps: the long-output setting.

A problem ``"31~040="`` gives two digits and asks for 40 steps of the recurrence
``(a, b) -> (b, (a op b) mod m)`` (``m`` = ``modulus``, 5 by default) from ``(3, 1)``. Step ``i``
(its counter running down from ``n`` to 1) is written ``{i:03d}:{a}{op}{b}={c}``; its operator is
``+`` when the counter's last digit is 0-4 and ``-`` when it is 5-9 (:func:`step_operator`), so
the sequence depends on where the count starts, not only on the two digits. Steps are joined with
``";"`` and the completion ends with ``";#"`` and the last three values::

    "31~003="  ->  "003:3+1=4;002:1+4=0;001:4+0=4;#404"

Every step is ten characters with its ``";"``: the response of an ``n``-step problem is
``10 n + 4`` characters and the eos, so ``n = 6, 25, 51, 99`` give about 64, 256, 512 and 1,000
generated tokens under the character tokenizer. Each step is local -- it copies the previous
step's second operand and result, decrements the counter, reads the operator off its last digit
and looks up one of ``2 m^2`` single-digit facts -- so a small model reaches a high per-step
accuracy, while a whole solution is right only if all of its ``n`` steps are: solution accuracy
falls with length at a constant per-step accuracy, the regime in which a sequence-level reward
says least about which step went wrong. The answer is right by luck with probability about
``m^-3``.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from typing import Any

from creditrl.tasks.arithmetic import labels_in_order, split_completion
from creditrl.tasks.base import Drawn, Problem, draw_problems, hash_split, register_task

__all__ = ["ChainConfig", "ChainTask", "chain_steps", "STEP_CHARS", "steps_for_tokens"]

STEP_CHARS = 10  # "040:3+4=2;"
_PROMPT_RE = re.compile(r"([0-9]{2})~([0-9]{3})=?")
_MAX_CONSECUTIVE_MISSES = 100_000
MAX_STEPS = 999  # the counter has three digits


def steps_for_tokens(tokens: int) -> int:
    """The chain length (1 to 999) whose response with its eos, ``10 n + 5`` tokens, is closest to
    ``tokens``; a tie goes to the shorter chain (``1000 -> 99``, 995 tokens)."""
    return max(1, min(MAX_STEPS, (tokens - 1) // STEP_CHARS))


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
    """

    min_steps: int = 25
    max_steps: int = 25
    modulus: int = 5
    heldout_mod: int = 10
    distinct_heldout: bool = False

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
class ChainTask:
    """Long chains of single-digit modular steps (registry name ``"chain"``, step separator ``";"``)."""

    name: str = "chain"
    step_separator: str | None = ";"
    step_pattern = re.compile(r"[0-9]{3}:[0-9][+\-][0-9]=[0-9]")
    answer_marker = "#"
    error_kinds: tuple[str, ...] = (
        "correct",
        "wrong_value",
        "wrong_copy",
        "wrong_counter",
        "malformed",
        "wrong_answer",
    )

    def __init__(self, config: ChainConfig | None = None, **overrides: Any) -> None:
        base = config if config is not None else ChainConfig()
        self.config: ChainConfig = dataclasses.replace(base, **overrides)

    def split_of(self, prompt: str) -> str:
        """``"heldout"`` iff ``int(sha256(prompt), 16) % heldout_mod == 0``, else ``"train"``."""
        return hash_split(prompt, self.config.heldout_mod)

    def make_problem(self, prompt: str) -> Problem:
        """The problem of a prompt such as ``"31~040="`` (the ``"="`` may be left out)."""
        prompt = prompt.removesuffix("=") + "="
        steps, answer = chain_steps(prompt, self.config.modulus)
        meta = {"n_ops": len(steps), "split": self.split_of(prompt)}
        return Problem(prompt=prompt, answer=answer, solution=";".join([*steps, f"#{answer}"]), meta=meta)

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split``, deterministic for a given (config, split, seed); duplicates may occur."""
        cfg = self.config

        def draw(rng: random.Random) -> Drawn:
            digits = "".join(str(rng.randrange(cfg.modulus)) for _ in range(2))
            prompt = f"{digits}~{rng.randint(cfg.min_steps, cfg.max_steps):03d}="
            return prompt, lambda: self.make_problem(prompt)

        return draw_problems(
            n,
            split=split,
            seed=seed,
            namespace="chain",
            draw=draw,
            split_of=self.split_of,
            max_misses=_MAX_CONSECUTIVE_MISSES,
            space=f" for {cfg}",
            distinct=cfg.distinct_heldout and split == "heldout",
        )

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Whether the text after the first ``"#"``, stripped, is the answer exactly."""
        return self.extract_answer(completion) == problem.answer

    def extract_answer(self, completion: str) -> str | None:
        hash_at = completion.find("#")
        return completion[hash_at + 1 :].strip() if hash_at >= 0 else None

    def same_answer(self, a: str, b: str) -> bool:
        return a == b

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """One label per segment: a step is right iff it is the next canonical step and every
        earlier one was right (stop at the first error); the answer segment iff it is the first
        answer segment and :meth:`check_outcome` holds."""
        expected, _ = chain_steps(problem.prompt, self.config.modulus)
        return labels_in_order(expected, segments, lambda text: self.check_outcome(problem, text))

    def label_completion(self, problem: Problem, completion: str) -> list[bool]:
        return self.check_steps(problem, split_completion(completion))

    def first_error(self, problem: Problem, completion: str) -> str:
        """Where ``completion`` goes wrong (one of :attr:`error_kinds`): at its first wrong step, a
        wrong result (``wrong_value``), wrong operands (``wrong_copy``), a wrong counter
        (``wrong_counter``) or other text (``malformed``); ``wrong_answer`` when no step is wrong."""
        if self.check_outcome(problem, completion):
            return "correct"
        expected, _ = chain_steps(problem.prompt, self.config.modulus)
        segments = split_completion(completion)
        for i, (segment, right) in enumerate(zip(segments, self.check_steps(problem, segments))):
            text = segment.strip().removesuffix(";").strip()
            if text.startswith("#"):
                break
            if right:
                continue
            if i >= len(expected) or not self.step_pattern.fullmatch(text):
                return "malformed"
            want = expected[i]
            if text[:3] != want[:3]:
                return "wrong_counter"
            return "wrong_value" if text[:-1] == want[:-1] else "wrong_copy"
        return "wrong_answer"
