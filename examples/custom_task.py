"""Count from a to b: prompt "count 3..6:", answer "3,4,5,6"; each number is one step."""

import random

from creditrl.tasks import Problem


class CountTask:
    name = "count"
    step_separator = ","  # None for a task without steps

    def __init__(self, max_len: int = 3):
        self.max_len = max_len

    def sample(self, n, *, split, seed):
        rng = random.Random(f"{split}/{seed}")
        starts = [a for a in range(10) if (a % 3 == 0) == (split == "heldout")]  # held out: 0, 3, 6, 9
        return [self.problem(a, a + rng.randint(1, self.max_len)) for a in rng.choices(starts, k=n)]

    def problem(self, a, b):
        answer = ",".join(str(i) for i in range(a, b + 1))
        return Problem(prompt=f"count {a}..{b}:", answer=answer, solution=answer)

    def check_outcome(self, problem, completion):
        return completion.strip() == problem.answer

    def check_steps(self, problem, segments):
        expected = problem.answer.split(",")
        return [k < len(expected) and s.strip(", ") == expected[k] for k, s in enumerate(segments)]
