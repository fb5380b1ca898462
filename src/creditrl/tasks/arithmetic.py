"""Multi-step integer arithmetic with a checkable canonical solution path.

A problem is an expression such as ``"7+3*2-5="``. Its canonical evaluation reduces one
operator per step: the leftmost ``*`` while any ``*`` remains, else the leftmost operator (so
``+``/``-`` go left to right). Each reduction is written ``a{op}b={c}``; steps are joined with
``";"`` and the completion ends with ``";#"`` and the final value::

    "7+3*2-5="  ->  "3*2=6;7+6=13;13-5=8;#8"
    "3-7+2="    ->  "3-7=-4;-4+2=-2;#-2"

Integers are always written canonically: ASCII digits, no leading zeros, no ``+`` sign, a leading
``-`` only for negative values. Operands are non-negative, so only the left operand of a
``+``/``-`` step can be negative.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from creditrl.tasks.base import SPLITS, Drawn, Problem, draw_problems, hash_split, register_task

__all__ = [
    "SPLITS",
    "Step",
    "StepTask",
    "ArithmeticConfig",
    "ArithmeticTask",
    "canonical_steps",
    "evaluate_expression",
    "split_completion",
]

Step = tuple[int, str, int, int]
"""One reduction ``(a, op, b, c)`` with ``c == a op b``."""

_ALLOWED_OPERATORS = "+-*"
# [0-9], not \d: \d also matches non-ASCII digits such as "８", which int() accepts.
_EXPRESSION_RE = re.compile(r"[0-9]+(?:[+\-*][0-9]+)*")
_TOKEN_RE = re.compile(r"[0-9]+|[+\-*]")
# This many consecutive draws without a problem of the split means the split is (practically)
# empty: a split holding even 1 in 1000 expressions misses this often with p < 1e-40.
_MAX_CONSECUTIVE_MISSES = 100_000


@dataclass(frozen=True)
class ArithmeticConfig:
    """Distribution of arithmetic problems.

    Attributes:
        min_ops: Fewest operators in an expression (>= 1).
        max_ops: Most operators in an expression (>= min_ops).
        operand_min: Smallest operand (0 <= operand_min <= operand_max).
        operand_max: Largest operand.
        operators: Operators to draw from: a non-empty string of distinct characters of ``"+-*"``.
        heldout_mod: A prompt is held out iff its SHA-256 (as an integer) is divisible by
            ``heldout_mod`` (>= 2).
    """

    min_ops: int = 1
    max_ops: int = 3
    operand_min: int = 1
    operand_max: int = 9
    operators: str = "+-*"
    heldout_mod: int = 10

    def __post_init__(self) -> None:
        """Reject out-of-range fields with a ValueError naming the field and its allowed range."""
        if self.min_ops < 1:
            raise ValueError(f"min_ops must be >= 1, got {self.min_ops}")
        if self.max_ops < self.min_ops:
            raise ValueError(f"max_ops must be >= min_ops ({self.min_ops}), got {self.max_ops}")
        if self.operand_min < 0:
            raise ValueError(f"operand_min must be >= 0, got {self.operand_min}")
        if self.operand_max < self.operand_min:
            raise ValueError(f"operand_max must be >= operand_min ({self.operand_min}), got {self.operand_max}")
        ops = self.operators
        if not ops or len(set(ops)) != len(ops) or not set(ops) <= set(_ALLOWED_OPERATORS):
            raise ValueError(
                f"operators must be a non-empty string of distinct characters from {_ALLOWED_OPERATORS!r}, got {ops!r}"
            )
        if self.heldout_mod < 2:
            raise ValueError(f"heldout_mod must be >= 2, got {self.heldout_mod}")


def _parse(prompt_or_expr: str) -> tuple[list[int], list[str]]:
    """Split ``"7+3*2="`` or ``"7+3*2"`` into operands ``[7, 3, 2]`` and operators ``["+", "*"]``;
    ValueError if the text is not non-negative integers joined by ``+-*``."""
    expr = prompt_or_expr.removesuffix("=")
    if _EXPRESSION_RE.fullmatch(expr) is None:
        raise ValueError(f"not an arithmetic expression: {prompt_or_expr!r}")
    tokens = _TOKEN_RE.findall(expr)
    return [int(t) for t in tokens[0::2]], tokens[1::2]


def _reduce(operands: list[int], ops: list[str]) -> tuple[list[Step], int]:
    """Reduce the expression canonically; return the steps and the final value."""
    operands, ops = list(operands), list(ops)
    steps: list[Step] = []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        a, op, b = operands[i], ops[i], operands[i + 1]
        c = a * b if op == "*" else a + b if op == "+" else a - b
        steps.append((a, op, b, c))
        operands[i : i + 2] = [c]
        del ops[i]
    return steps, operands[0]


def canonical_steps(prompt_or_expr: str) -> list[Step]:
    """The canonical reductions ``(a, op, b, c)`` of an expression (a trailing ``"="`` allowed), in
    order (module docstring); ValueError if the text is not non-negative integers joined by ``+-*``."""
    return _reduce(*_parse(prompt_or_expr))[0]


def evaluate_expression(prompt_or_expr: str) -> int:
    """The value of an expression (``*`` before ``+``/``-``, left to right); ValueError as
    :func:`canonical_steps`."""
    return _reduce(*_parse(prompt_or_expr))[1]


def _format_step(step: Step) -> str:
    """Write a step as ``a{op}b={c}`` with canonical integers."""
    a, op, b, c = step
    return f"{a}{op}{b}={c}"


def split_completion(completion: str) -> list[str]:
    """Split a completion into step segments, keeping the answer tail whole: the text before the
    first ``"#"`` is split at ``";"`` (an empty piece after a final ``";"`` dropped, an empty text
    giving no segment), then the text from the first ``"#"`` on is one final segment.
    ``"3*2=6;7+6=13;#13"`` gives ``["3*2=6", "7+6=13", "#13"]``, ``"#8;3+3=6"`` gives
    ``["#8;3+3=6"]``, ``"3*2=6;"`` gives ``["3*2=6"]`` and ``""`` gives ``[]``.
    """
    hash_at = completion.find("#")
    head, tail = (completion, "") if hash_at < 0 else (completion[:hash_at], completion[hash_at:])
    segments = head.split(";") if head else []
    if len(segments) > 1 and segments[-1] == "":
        segments.pop()
    if tail:
        segments.append(tail)
    return segments


def normalise_step(segment: str) -> str:
    """A segment as the step checker reads it: stripped, one trailing ``";"`` removed, stripped."""
    return segment.strip().removesuffix(";").strip()


def labels_in_order(expected: list[str], segments: list[str], answer_ok: Callable[[str], bool]) -> list[bool]:
    """Stop-at-the-first-error step labels of ``segments`` against the canonical steps ``expected``
    (each segment normalised as :meth:`ArithmeticTask.check_steps` says): a step is right iff it is
    the next expected one, every earlier step was right and no answer came before it; an answer
    segment (starting with ``"#"``) iff it is the first one and ``answer_ok(its text)``."""
    labels: list[bool] = []
    done, failed, seen_answer = 0, False, False
    for segment in segments:
        text = normalise_step(segment)
        if text.startswith("#"):
            labels.append(not seen_answer and answer_ok(text))
            seen_answer = True
            continue
        ok = not failed and not seen_answer and done < len(expected) and text == expected[done]
        labels.append(ok)
        done += ok
        failed = failed or not ok
    return labels


class StepTask:
    """What the ``";"``-step tasks (arithmetic, chain, paths) share: a frozen config built with
    keyword overrides, the hash split, problems written ``step;...;step;#answer``, the answer as
    the text after the first ``"#"``, and :meth:`first_error` over the step labels."""

    name: str = ""
    step_separator: str | None = ";"
    answer_marker = "#"
    config_type: Any = None  # the task's frozen config dataclass
    config: Any

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        """Build from ``config`` (default: a default ``config_type``) with ``overrides`` (its fields)
        applied; the result is validated again."""
        self.config = dataclasses.replace(config if config is not None else self.config_type(), **overrides)

    def split_of(self, prompt: str) -> str:
        """``"heldout"`` iff ``int(sha256(prompt), 16) % heldout_mod == 0``, else ``"train"`` (the
        prompt UTF-8 encoded, its ``"="`` included)."""
        return hash_split(prompt, self.config.heldout_mod)

    def _problem(self, prompt: str, steps: list[str], answer: str) -> Problem:
        meta = {"n_ops": len(steps), "split": self.split_of(prompt)}
        return Problem(prompt=prompt, answer=answer, solution=";".join([*steps, f"#{answer}"]), meta=meta)

    def _sample(
        self, n: int, split: str, seed: int, draw: Callable[[random.Random], Drawn | None], **kw: Any
    ) -> list[Problem]:
        """:func:`~creditrl.tasks.base.draw_problems` in the task's namespace and split (``kw``:
        its other arguments; ``max_misses`` defaults to 100,000)."""
        kw.setdefault("max_misses", _MAX_CONSECUTIVE_MISSES)
        return draw_problems(n, split=split, seed=seed, namespace=self.name, draw=draw, split_of=self.split_of, **kw)

    def _answer_right(self, problem: Problem, completion: str) -> bool:
        answer = self.extract_answer(completion)  # no "#": False, without reading the problem
        return answer is not None and answer == problem.answer

    def extract_answer(self, completion: str) -> str | None:
        """The text after the first ``"#"``, stripped (what the outcome compares), or None."""
        hash_at = completion.find("#")
        return completion[hash_at + 1 :].strip() if hash_at >= 0 else None

    def same_answer(self, a: str, b: str) -> bool:
        """Answers are canonical text: equal as text."""
        return a == b

    def label_completion(self, problem: Problem, completion: str) -> list[bool]:
        """``check_steps(problem, split_completion(completion))``."""
        return self.check_steps(problem, split_completion(completion))

    def first_error(self, problem: Problem, completion: str) -> str:
        """Where ``completion`` goes wrong, as one of ``error_kinds``: ``correct`` when
        :meth:`check_outcome` holds, else the kind of the first step segment :meth:`check_steps`
        labels wrong (``_step_error(problem, i, text)``, ``text`` normalised), else ``wrong_answer``
        (every step right; the answer wrong, missing or early)."""
        if self.check_outcome(problem, completion):
            return "correct"
        segments = split_completion(completion)
        for i, (segment, right) in enumerate(zip(segments, self.check_steps(problem, segments))):
            text = normalise_step(segment)
            if text.startswith("#"):
                break
            if not right:
                return self._step_error(problem, i, text)
        return "wrong_answer"


@register_task("arithmetic")
class ArithmeticTask(StepTask):
    """Integer arithmetic task (registry name ``"arithmetic"``, step separator ``";"``); built from
    an :class:`ArithmeticConfig` (default) with keyword overrides of its fields."""

    name: str = "arithmetic"
    step_pattern = re.compile(r"-?[0-9]+[+\-*][0-9]+=-?[0-9]+")  # a well-formed step, right or wrong
    config_type = ArithmeticConfig
    config: ArithmeticConfig

    def make_problem(self, prompt_or_expr: str) -> Problem:
        """The problem of an expression (with or without the trailing ``"="``); ``meta`` holds
        ``n_ops`` (number of operators) and ``split``."""
        steps, value = _reduce(*_parse(prompt_or_expr))
        prompt = prompt_or_expr.removesuffix("=") + "="
        return self._problem(prompt, [_format_step(s) for s in steps], str(value))

    def _draw_expression(self, rng: random.Random) -> str:
        cfg = self.config
        n_ops = rng.randint(cfg.min_ops, cfg.max_ops)
        operands = [rng.randint(cfg.operand_min, cfg.operand_max) for _ in range(n_ops + 1)]
        ops = [rng.choice(cfg.operators) for _ in range(n_ops)]
        return "".join(f"{x}{op}" for x, op in zip(operands, ops)) + str(operands[-1])

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split``, deterministic for a given (config, split, seed); duplicates
        may occur. Expressions are drawn from a stream seeded by ``(split, seed)`` and rejected
        unless :meth:`split_of` their prompt is ``split``.

        Raises:
            ValueError: For an unknown ``split``, ``n < 0``, or 100000 consecutive draws that miss
                ``split`` (the config's problem space has (almost) no expressions in it).
        """

        def draw(rng: random.Random) -> Drawn:
            prompt = self._draw_expression(rng) + "="
            return prompt, lambda: self.make_problem(prompt)

        return self._sample(
            n, split, seed, draw, space=f"; the problem space of {self.config} is too small for this split"
        )

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Whether the text after the FIRST ``"#"``, stripped, equals ``problem.answer`` exactly:
        the canonical integer (ASCII digits, optional leading ``-``, no leading zeros, no ``+``, no
        ``"-0"``). No ``"#"`` is False, and so is anything after the number (``"#8;3+3=6"``)."""
        return self._answer_right(problem, completion)

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """One label per segment: whether that step is correct. Each segment is normalised by
        stripping surrounding whitespace, then ONE trailing ``";"``, then whitespace again.

        * An answer segment (normalised text starts with ``"#"``) is correct iff it is the first
          answer segment and ``check_outcome(problem, segment)`` holds, whatever the steps before.
        * Any other segment (empty text included) is correct iff (1) every earlier one was
          correct, (2) no answer segment came earlier, and (3) its text equals exactly
          ``f"{a}{op}{b}={c}"`` for the next canonical reduction ``(a, op, b, c)``, with canonical
          integers. A correct step advances the state; once the expression is fully reduced every
          further step is incorrect. After the first incorrect step all later ones are incorrect
          ("stop at the first error", as in PRM800K).
        """
        expected = [_format_step(s) for s in canonical_steps(problem.prompt)]
        return labels_in_order(expected, segments, lambda text: self.check_outcome(problem, text))

    error_kinds: tuple[str, ...] = (
        "correct",
        "slip_multi_digit",
        "slip_single_digit",
        "wrong_operands",
        "malformed",
        "wrong_answer",
    )

    def _step_error(self, problem: Problem, i: int, text: str) -> str:
        """The kind of a wrong step (:meth:`first_error`): a well-formed step ``a{op}b=c`` whose
        ``a{op}b`` is the next canonical reduction but whose ``c`` is wrong is a slip,
        ``slip_multi_digit`` when ``a`` or ``b`` has two or more digits, else
        ``slip_single_digit``; a well-formed step with other operands (a wrong copy, a skipped or
        out-of-order reduction, a step after the expression is reduced) is ``wrong_operands``;
        any other text is ``malformed``."""
        if not self.step_pattern.fullmatch(text):
            return "malformed"
        expected = canonical_steps(problem.prompt)  # before the first error, step i is the i-th reduction
        if i < len(expected):
            a, op, b, _ = expected[i]
            if text.split("=", 1)[0] == f"{a}{op}{b}":
                return "slip_multi_digit" if max(abs(a), abs(b)) >= 10 else "slip_single_digit"
        return "wrong_operands"
