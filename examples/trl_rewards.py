"""Reward functions with TRL's signature, for `reward.source=trl_rewards:NAME` (with `examples` on
PYTHONPATH). Keyword arguments are lists parallel to `completions`: `answer`, `solution`,
`problem` and the problem's `meta` fields."""

from creditrl.rewards import reward_function


def exact_answer(prompts, completions, answer, **kwargs):
    """1 when the text after the first '#' is the answer, else 0 (a sequence-level reward)."""
    return [1.0 if c.split("#", 1)[-1].strip() == a else 0.0 for c, a in zip(completions, answer)]


def concise(prompts, completions, **kwargs):
    """A small bonus for short completions."""
    return [max(0.0, 1.0 - len(c) / 64) for c in completions]


@reward_function(granularity="step")
def well_formed_steps(prompts, completions, spans, **kwargs):
    """Per step: 1 for a step of the form a+b=c (digits and one operator), else 0."""
    import re

    step = re.compile(r"\s*-?\d+[+\-*]\d+=-?\d+;?\s*")
    return [[1.0 if step.fullmatch(s) else 0.0 for s in row] for row in spans]
