"""Tiny models for the search tests: a policy whose steps end often, and an untrained PRM; and a
task whose answers are not marked with '#' (running sums ending in ``A=...``)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from creditrl.prm.model import ProcessRewardModel
from creditrl.tasks import TASKS, Problem, make_task, register_task


@pytest.fixture(scope="session")
def step_policy(peaked_tiny):
    """A peaked tiny policy with its logits of ';' raised by 3 and of eos by 2 (an lm_head bias,
    which both engines read): samples end steps every few tokens and often finish, so a search
    has several steps and terminals to work with; greedy decoding writes several steps."""
    model, tok = peaked_tiny(0, 1)
    with torch.no_grad():
        model.model.norm.weight.fill_(1.5)
    bias = torch.zeros(len(tok))
    bias[tok.convert_tokens_to_ids(";")] = 3.0
    bias[tok.eos_token_id] = 2.0
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    return model.eval(), tok


@pytest.fixture(scope="session")
def tiny_prm(peaked_tiny):
    """An untrained PRM (scores near 0.5, but different per prefix) and its tokenizer."""
    model, tok = peaked_tiny(3, 4)
    return ProcessRewardModel.from_model(model, seed=1).eval(), tok


@pytest.fixture(scope="session")
def task():
    return make_task("arithmetic", min_ops=2, max_ops=3)


@pytest.fixture(scope="session")
def problems(task):
    return task.sample(3, split="heldout", seed=0)


# ----------------------------------------------------------------------------- a task without '#'


class _RunningSums:
    """Running sums, answered with ``A=``, not the arithmetic task's ``#``: ``"sum 3 5 2:"`` ->
    ``"3+5=8;8+2=10;A=10"``. Steps end with ``;``; the oracle checks each partial sum."""

    step_separator = ";"

    def __init__(self, min_terms: int = 2, max_terms: int = 3) -> None:
        self.min_terms, self.max_terms = min_terms, max_terms

    def make_problem(self, terms: list[int]) -> Problem:
        steps, total = [], terms[0]
        for x in terms[1:]:
            steps.append(f"{total}+{x}={total + x}")
            total += x
        return Problem(
            prompt="sum " + " ".join(map(str, terms)) + ":",
            answer=str(total),
            solution=";".join(steps + [f"A={total}"]),
            meta={"terms": terms},
        )

    def problem_of(self, prompt: str) -> Problem:
        """The problem whose prompt is ``prompt``."""
        return self.make_problem([int(x) for x in prompt.removeprefix("sum ").removesuffix(":").split()])

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        rng = random.Random(f"{split}/{seed}")
        out: list[Problem] = []
        while len(out) < n:
            p = self.make_problem([rng.randint(1, 9) for _ in range(rng.randint(self.min_terms, self.max_terms))])
            if ("heldout" if sum(p.prompt.encode()) % 4 == 0 else "train") == split:
                out.append(p)
        return out

    @staticmethod
    def _stated(completion: str) -> str | None:
        at = completion.find("A=")
        return completion[at + 2 :].strip() if at >= 0 else None

    @staticmethod
    def _int(text: str | None) -> int | None:
        return int(text) if text is not None and re.fullmatch(r"[+-]?[0-9]+", text) else None

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """The integer after the first ``A=`` is the sum (``A=010`` and ``A=+10`` state 10)."""
        return self._int(self._stated(completion)) == int(problem.answer)

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """Step k is right while every step so far is the next partial sum; the answer step is right
        when it is the first one and states the sum; nothing after it is right."""
        terms, labels, total, ok = problem.meta["terms"], [], problem.meta["terms"][0], True
        for k, segment in enumerate(segments):
            text = segment.strip().removesuffix(";").strip()
            if text.startswith("A="):
                labels.append(ok is not None and self.check_outcome(problem, text))
                ok = None  # answered
                continue
            ok = bool(ok) and k + 1 < len(terms) and text == f"{total}+{terms[k + 1]}={total + terms[k + 1]}"
            total += terms[k + 1] if ok else 0
            labels.append(ok)
        return labels


class RunningSumTask(_RunningSums):
    """With the answer hooks: the answer is the text after ``A=``, answers agree as integers."""

    name = "running_sum"

    def extract_answer(self, completion: str) -> str | None:
        return self._stated(completion)

    def same_answer(self, a: str, b: str) -> bool:
        return self._int(a) is not None and self._int(a) == self._int(b)


class PlainSumTask(_RunningSums):
    """The same task without the answer hooks: majority votes on whole completions."""

    name = "running_sum_plain"


@pytest.fixture(scope="module")
def sum_tasks():
    """``running_sum`` and ``running_sum_plain`` registered for one test module (the registry's
    other tests list its names, so they must not outlive the module)."""
    for cls in (RunningSumTask, PlainSumTask):
        register_task(cls.name)(cls)
    yield RunningSumTask(), PlainSumTask()
    for cls in (RunningSumTask, PlainSumTask):
        TASKS.pop(cls.name)


@pytest.fixture(scope="module")
def sum_config(tmp_path_factory, peaked_tiny, sum_tasks):
    """A config file for the running-sum task: a small tiny model (hidden size 32) with a 200-step
    SFT warm start (about 2 s; it writes ``a+b=c;`` steps and ``A=`` answers, mostly wrong) and tiny
    PRM and search settings. ``$CREDITRL_CACHE`` (the SFT, a PRM) lives in the module's folder."""
    root = tmp_path_factory.mktemp("sums")
    model, tok = peaked_tiny(0, 1)
    model.save_pretrained(root / "small")
    tok.save_pretrained(root / "small")
    path = root / "sums.yaml"
    path.write_text(f"""
policy: {{model: {root / "small"}}}
task: {{name: running_sum}}
sft: {{steps: 200, batch_size: 16, warmup_steps: 5, lr: 0.01}}
rollout: {{max_new_tokens: 24}}
train: {{init: sft, progress: false, eval_size: 4}}  # a model of ours: RL would start from it as it is
prm: {{problems: 6, samples: 2, steps: 4, batch_size: 4}}
search: {{problems: 4, max_new_tokens: 24, budget: 160, n: 6, width: 2, expansions: 2, simulations: 6,
          min_request_tokens: 4}}
""")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(root / "cache"))
        yield path


@pytest.fixture
def run_cli_search(capsys):
    """``run_cli_search(argv, out)``: ``creditrl search ARGV --out OUT``, returning what it printed
    and the JSON it wrote."""
    from creditrl.cli import main

    def run(argv: list[str], out: Path) -> tuple[str, dict]:
        assert main(["search", *argv, "--out", str(out)]) == 0
        return capsys.readouterr().out, json.loads(out.read_text())

    return run


def _check_search_result(task, saved: dict, problems: int, budget: int) -> None:
    rows = saved["problems"]
    assert len(rows) == saved["summary"]["problems"] == problems
    for r in rows:
        assert r["correct"] == task.check_outcome(task.problem_of(r["prompt"]), r["completion"])
        assert 1 <= r["tokens"] <= budget
    assert saved["summary"]["tokens_total"] == sum(r["tokens"] for r in rows)
    assert saved["summary"]["accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
    assert 0.0 <= saved["summary"]["accuracy"] <= 1.0


@pytest.fixture(scope="session")
def check_search_result():
    """``check_search_result(task, saved, problems, budget)``: what every saved ``creditrl search``
    result holds: per-problem verdicts are the task's outcome check of the completion, tokens are
    counted and within the budget, accuracy is their mean."""
    return _check_search_result
