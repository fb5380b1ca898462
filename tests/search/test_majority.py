"""Majority vote over the task's answers: grouped by its ``same_answer`` on arithmetic, math and a
task whose answers are not marked with '#'; through :func:`search` and ``creditrl search``."""

from __future__ import annotations

import functools
from collections import defaultdict

import pytest

from creditrl.config import ConfigError
from creditrl.policy.engines.base import Generation
from creditrl.policy.tokenizer import decode_response
from creditrl.prm.metrics import Candidate, answer_groups, majority_vote, select
from creditrl.search import SearchConfig, search
from creditrl.tasks import Problem, make_task
from creditrl.tasks.base import answer_of, majority_note, same_answer


def hash_marked(completion: str) -> str | None:
    """The answer rule the PRM report's majority vote used before the task hooks: after the last '#'."""
    return completion.rsplit("#", 1)[1].strip() if "#" in completion else None


def pick(task, completions: list[str], *, by_task: bool = True) -> int:
    """The majority pick over ``completions`` with the task's answers, grouped by its ``same_answer``
    (``by_task=False``: the same answers compared as strings only)."""
    same = functools.partial(same_answer, task) if by_task else None
    return select("majority", [Candidate(False, answer=answer_of(task, c)) for c in completions], same=same)


def test_answer_groups_follow_the_equivalence_and_skip_missing_answers() -> None:
    same = lambda a, b: int(a) == int(b)  # noqa: E731
    assert answer_groups(["1", "01", None, "2", "+1", "2"], same) == [[0, 1, 4], [3, 5]]
    assert answer_groups(["1", "01", None, "2", "+1", "2"]) == [[0], [1], [3, 5], [4]]
    assert majority_vote(["2", "1", "01", "2"], same) == 0  # 2-2 tie: the group opened first
    assert majority_vote(["2", "1", "01", "+1"], same) == 1
    assert majority_vote(["2", "1", "01", "+1"]) == 0  # as strings every answer is alone: the first wins


def test_majority_on_arithmetic_picks_the_majority_answer() -> None:
    task = make_task("arithmetic", min_ops=1, max_ops=1)
    problem = task.make_problem("1+2=")
    completions = ["1+2=4;#4", "1+2=3;#3", "#3", "1+2=5;#5", "2+1=3;#3 "]
    chosen = pick(task, completions)
    assert chosen == 1 and task.check_outcome(problem, completions[chosen])
    assert [task.extract_answer(c) for c in completions] == ["4", "3", "3", "5", "3"]


def test_majority_on_math_votes_boxed_half_and_point_five_together() -> None:
    task = make_task("math")
    problem = Problem(prompt="Q: half of one? A: ", answer="\\frac{1}{2}", solution=" \\boxed{\\frac{1}{2}}")
    completions = [" \\boxed{1/3}", " \\boxed{1/2}", " 0.5", " so it is $\\frac{1}{3}$", " 2/4"]
    chosen = pick(task, completions)
    assert chosen == 1 and task.check_outcome(problem, completions[chosen])
    assert task.same_answer(task.extract_answer(" \\boxed{1/2}"), task.extract_answer(" 0.5"))
    # as strings the three halves are apart and the two thirds win
    assert pick(task, completions, by_task=False) == 0 and not task.check_outcome(problem, completions[0])


def test_majority_on_a_task_without_hash_answers(sum_tasks) -> None:
    """The old bug: answers were read after '#', so on a task answering with 'A=' every answer was
    None and majority returned the first sample; the task's hooks find the majority."""
    task, plain = sum_tasks
    problem = task.problem_of("sum 3 5 2:")
    completions = ["3+5=8;A=9", "3+5=8;8+2=10;A=10", "A=010", "3+5=8;A= +10", "A=9"]
    assert [hash_marked(c) for c in completions] == [None] * 5
    assert majority_vote([hash_marked(c) for c in completions]) == 0 and not task.check_outcome(problem, completions[0])
    chosen = pick(task, completions)
    assert chosen == 1 and task.check_outcome(problem, completions[chosen])
    assert pick(task, completions, by_task=False) == 0  # "9" twice beats three spellings of 10 as strings
    # without the hooks the vote is on whole completions (all different here: the first wins), and says so
    assert pick(plain, completions) == 0 and pick(plain, ["A=1", "A=2", " A=2"]) == 1
    assert majority_note(task) == "" and "task 'running_sum_plain' has no extract_answer" in majority_note(plain)


class ScriptedEngine:
    """Answers the k-th sample of a problem with ``script(problem)[k % len]`` + eos, capped by the
    request's budget; ``problem_of`` reads the problem back from the prompt's text."""

    def __init__(self, tokenizer, problem_of, script) -> None:
        self.tok, self.problem_of, self.script = tokenizer, problem_of, script
        self.drawn: dict[str, int] = defaultdict(int)

    def generate(self, prompts, n, params, *, generator=None, budgets=None) -> Generation:
        index, prompt_ids, tokens, finished = [], [], [], []
        for i, prompt in enumerate(prompts):
            problem = self.problem_of(decode_response(self.tok, list(prompt)))
            cap = min(params.max_new_tokens, budgets[i] if budgets else params.max_new_tokens)
            for _ in range(n):
                options = self.script(problem)
                text = options[self.drawn[problem.prompt] % len(options)]
                self.drawn[problem.prompt] += 1
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                index.append(i)
                prompt_ids.append(list(prompt))
                tokens.append(ids[:cap])
                finished.append(len(ids) <= cap)
        return Generation(index, prompt_ids, tokens, [[0.0] * len(t) for t in tokens], finished)


def three_spellings(problem: Problem) -> list[str]:
    """Five samples: the right sum spelled three ways, a wrong one twice (first and last)."""
    s = int(problem.answer)
    return [f"A={s + 1}", f"A=0{s}", f"A={s}", f"A=+{s}", f"A={s + 1}"]


def test_search_best_of_n_majority_uses_the_tasks_answers(sum_tasks, peaked_tiny) -> None:
    task, plain = sum_tasks
    _, tok = peaked_tiny(0, 1)
    problems = task.sample(4, split="heldout", seed=0)
    cfg = SearchConfig(method="best_of_n", selector="majority", n=5, budget=80, max_new_tokens=16)
    result = search(
        problems, engine=ScriptedEngine(tok, task.problem_of, three_spellings), tokenizer=tok, task=task, config=cfg
    )
    assert result.accuracy == 1.0 and result.note == ""
    assert [r.completion for r in result.problems] == [f"A=0{p.answer}" for p in problems]  # the group's first
    assert all(1 <= r.tokens <= 80 for r in result.problems)
    flat = search(
        problems, engine=ScriptedEngine(tok, plain.problem_of, three_spellings), tokenizer=tok, task=plain, config=cfg
    )
    assert flat.accuracy == 0.0 and "has no extract_answer" in flat.note  # whole completions: the wrong one twice


def test_search_best_of_n_majority_on_code_votes_on_programs(peaked_tiny) -> None:
    """A task without steps: majority runs (greedy too) and groups programs equal up to formatting."""
    task = make_task("code", timeout_s=1.0)
    problems = [p for p in task.problems if p.meta["name"] in ("add", "sub")]
    _, tok = peaked_tiny(0, 1)
    by_prompt = {p.prompt: p for p in problems}
    wrong = {"add": "a - b", "sub": "a + b"}
    right = {"add": ["a+b", "(a + b)", "a + b  # the sum"], "sub": ["a-b", "(a) - b", "a - (b)"]}
    script = lambda p: [wrong[p.meta["name"]], *right[p.meta["name"]], wrong[p.meta["name"]]]  # noqa: E731
    cfg = SearchConfig(method="best_of_n", selector="majority", n=5, budget=200, max_new_tokens=24)
    result = search(
        problems, engine=ScriptedEngine(tok, by_prompt.__getitem__, script), tokenizer=tok, task=task, config=cfg
    )
    assert result.accuracy == 1.0 and result.note == ""
    assert [r.completion for r in result.problems] == ["a+b", "a-b"]  # the first of the three spellings
    greedy = search(
        problems,
        engine=ScriptedEngine(tok, by_prompt.__getitem__, script),
        tokenizer=tok,
        task=task,
        config=SearchConfig(method="greedy", budget=24, max_new_tokens=24),
    )
    assert greedy.accuracy == 0.0 and [r.completion for r in greedy.problems] == ["a - b", "a + b"]
    with pytest.raises(ConfigError, match="search.method: 'beam' expands reasoning steps, but task 'code' has no"):
        search(problems, engine=None, tokenizer=tok, task=task, config=SearchConfig(method="beam"), prm=(None, None))


# ----------------------------------------------------------------------------- creditrl search on the task


def test_cli_majority_on_the_task_picks_the_majority_answer(
    sum_config, sum_tasks, peaked_tiny, run_cli_search, check_search_result, monkeypatch
) -> None:
    import creditrl.search.runner as runner

    task, _ = sum_tasks
    _, tok = peaked_tiny(0, 1)
    monkeypatch.setattr(
        runner, "engine_for", lambda model, tokenizer, policy: ScriptedEngine(tok, task.problem_of, three_spellings)
    )
    text, saved = run_cli_search(
        [str(sum_config), "--method", "best_of_n", "--set", "search.selector=majority", "--set", "search.n=5"],
        sum_config.with_name("scripted.json"),
    )
    assert "search best_of_n n=5 selector=majority temperature=1.0 on 4 heldout problems of task 'running_sum'" in text
    assert "accuracy 100.0% (4/4)" in text and "whole normalised completions" not in text
    assert [r["completion"] for r in saved["problems"]] == [
        f"A=0{task.problem_of(r['prompt']).answer}" for r in saved["problems"]
    ]
    check_search_result(task, saved, 4, 160)


def test_cli_majority_pick_is_the_majority_of_the_policys_samples(
    sum_config, sum_tasks, run_cli_search, check_search_result
) -> None:
    """On the SFT policy's own samples: rerun the same sampling through the Python API; the CLI's
    pick is the first sample holding the answer that most samples agree with."""
    from creditrl.config import load_config
    from creditrl.policy.engines import make_engine
    from creditrl.policy.model import load_policy, policy_options
    from creditrl.search.methods import make_context, sample_candidates
    from creditrl.train.build import start_policy
    from creditrl.train.resolve import check

    task, _ = sum_tasks
    sets = ["search.method=best_of_n", "search.selector=majority"]
    _, saved = run_cli_search(
        [str(sum_config), *[x for kv in sets for x in ("--set", kv)]], sum_config.with_name("policy.json")
    )
    check_search_result(task, saved, 4, 160)
    cfg = check(load_config(sum_config, sets), task)
    model, tok = load_policy(start_policy(cfg, progress=False), seed=cfg.policy.init_seed, **policy_options(cfg))
    engine = make_engine(
        model.eval(),
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        kind=cfg.policy.engine,
        precision=cfg.policy.precision,
        kernels=cfg.policy.kernels,
    )
    problems = task.sample(4, split="heldout", seed=0)
    ctx = make_context(problems, engine=engine, tokenizer=tok, task=task, config=cfg.search)
    groups = sample_candidates(ctx, cfg.search.n, prm=False, orm=False)
    answers = [[s.candidate.answer for s in g] for g in groups]
    assert sum(a is not None for row in answers for a in row) >= 12  # the SFT policy states answers
    for row, g, r in zip(answers, groups, saved["problems"], strict=True):
        chosen = [s.completion for s in g].index(r["completion"])
        agree = [sum(task.same_answer(a, b) for b in row if b is not None) if a is not None else 0 for a in row]
        assert agree[chosen] == max(agree)  # no answer has more agreeing samples
        assert chosen == min(
            i for i, n in enumerate(agree) if n == max(agree) and task.same_answer(row[i], row[chosen])
        )  # the first sample with that answer
