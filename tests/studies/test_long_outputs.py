"""``python -m studies.long_outputs``: the per-step accuracy of hand-made completions, the statistics'
weighting, and a quick run (a 20-step SFT in a temporary cache) that writes one row per length."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.config.loader import packaged_config
from creditrl.errors import ConfigError
from creditrl.policy.model import load_policy
from creditrl.tasks.chain import ChainTask, band
from studies import long_outputs as lr

TASK = ChainTask()
P3 = TASK.make_problem("31~003=")  # 003:3+1=4;002:1+4=0;001:4+0=4;#404 (mod 5)

HAND = [  # (completion, correct steps before the first error, a wrong or missing step)
    ("003:3+1=4;002:1+4=0;001:4+0=4;#404", 3, False),
    ("003:3+1=4;002:1+4=1;001:4+1=0;#410", 1, True),  # a wrong value at step 2
    ("003:3+1=4;002:1+4=0;001:4+1=0;#410", 2, True),  # a wrong copy at step 3
    ("003:3+1=0;002:1+0=1;001:0+1=1;#011", 0, True),
    ("003:3+1=4;#314", 1, True),  # an early answer: step 2 is missing
    ("003:3+1=4;002:1+4=0;001:4+", 2, True),  # truncated in step 3
    ("", 0, True),
    ("003:3+1=4;002:1+4=0;001:4+0=4;#440", 3, False),  # every step right, the answer wrong
    ("003:3+1=4;002:1+4=0;001:4+0=4;000:0+4=4;#044", 3, False),  # a step past the end
    ("003:3+1=4;002:1+4=0;001:4+0=4", 3, False),  # no answer
]


@pytest.mark.parametrize(("completion", "k", "broken"), HAND)
def test_step_counts(completion: str, k: int, broken: bool) -> None:
    assert lr.step_counts(TASK, P3, completion) == (k, broken)


def test_per_step_accuracy_is_right_steps_over_right_steps_plus_broken_solutions() -> None:
    counts = [lr.step_counts(TASK, P3, c) for c, _, _ in HAND]
    right = 3 + 1 + 2 + 0 + 1 + 2 + 0 + 3 + 3 + 3
    assert lr.per_step_accuracy(counts) == pytest.approx(right / (right + 6)) == pytest.approx(18 / 24)
    assert lr.per_step_accuracy([(3, False)] * 5) == 1.0
    assert lr.per_step_accuracy([(0, True)]) == 0.0
    assert lr.per_step_accuracy([(4, True), (2, True)]) == pytest.approx(6 / 8)
    assert lr.per_step_accuracy([]) != lr.per_step_accuracy([])  # nan without any step


def test_per_step_accuracy_recovers_a_constant_step_success_rate() -> None:
    """Solutions whose every step is right with probability q (stop at the first error): the
    estimate is q, and q ** n predicts the share of whole solutions that are right."""
    rng, q, n = random.Random(0), 0.95, 25
    task = ChainTask(min_steps=n, max_steps=n)
    problems = task.sample(2000, split="train", seed=0)
    completions = []
    for p in problems:
        steps, answer = p.solution.split(";")[:-1], p.answer
        k = next((i for i in range(n) if rng.random() > q), n)
        if k == n:
            completions.append(p.solution)
        else:  # the first k steps, then step k + 1 with a wrong value
            bad = steps[k][:-1] + str((int(steps[k][-1]) + 1) % 5)
            completions.append(";".join(steps[:k] + [bad, f"#{answer[::-1]}x"]))
    stats = lr.decode_stats(task, problems, completions, [10 * n + 4] * len(problems), [True] * len(problems))
    assert stats.per_step == pytest.approx(q, abs=0.005)
    assert stats.accuracy == pytest.approx(q**n, abs=0.03) and stats.predicted == pytest.approx(stats.per_step**n)
    assert stats.errors["wrong_value"] + stats.errors["correct"] == len(problems)
    assert stats.errors["correct"] == round(stats.accuracy * len(problems))
    assert (stats.n, stats.lengths) == (n, {n: len(problems)})


def test_a_band_of_lengths_predicts_the_mean_of_p_to_each_length() -> None:
    task = ChainTask(min_steps=4, max_steps=8)
    problems = task.sample(300, split="train", seed=1)  # held out: no prompt of 6 steps (25 prompts, 1 in 10)
    lengths = [p.meta["n_ops"] for p in problems]
    assert set(lengths) == {4, 5, 6, 7, 8}
    completions = [p.solution if i % 4 else "" for i, p in enumerate(problems)]  # every fourth: no step
    stats = lr.decode_stats(task, problems, completions, [1] * 300, [True] * 300, n=6)
    right = sum(k for i, k in enumerate(lengths) if i % 4)
    assert stats.n == 6 and stats.lengths == {k: lengths.count(k) for k in range(4, 9)}
    assert stats.per_step == pytest.approx(right / (right + 75)) and stats.accuracy == pytest.approx(0.75)
    assert stats.predicted == pytest.approx(sum(stats.per_step**k for k in lengths) / 300)
    assert stats.predicted != pytest.approx(stats.per_step**6, abs=1e-6)  # not p to the middle length
    default = lr.decode_stats(task, problems, completions, [1] * 300, [True] * 300)
    assert default.n == round(sum(lengths) / 300) and default.predicted == stats.predicted


def test_band_and_length_task() -> None:
    assert [band(n) for n in lr.LENGTHS] == [(4, 8), (23, 27), (49, 53), (97, 101)]
    cfg = load_config(packaged_config("chain"))
    task = lr.length_task(cfg, 51)
    assert (task.config.min_steps, task.config.max_steps, task.config.modulus) == (49, 53, 5)
    # one length: 25 prompts, a few held out; the band: 125 prompts, about a dozen held out
    assert len({p.prompt for p in task.sample(2000, split="heldout", seed=0)}) >= 8
    for n in (0, 1000):
        with pytest.raises(ConfigError, match=rf"^lengths: a chain length must lie in \[1, 999\], got {n}"):
            lr.length_task(cfg, n)


def test_weights_count_a_problem_as_its_repeats() -> None:
    completions = [c for c, _, _ in HAND[:4]]
    problems = [P3] * 4
    weighted = lr.decode_stats(TASK, problems, completions, [34, 34, 20, 10], [True, True, False, True], [3, 1, 2, 1])
    repeated = lr.decode_stats(
        TASK,
        [P3] * 7,
        [completions[0]] * 3 + [completions[1]] + [completions[2]] * 2 + [completions[3]],
        [34] * 3 + [34] + [20] * 2 + [10],
        [True] * 3 + [True] + [False] * 2 + [True],
    )
    assert weighted == repeated
    assert (weighted.problems, weighted.n) == (7, 3)
    assert weighted.mean_tokens == pytest.approx((3 * 34 + 34 + 2 * 20 + 10) / 7)
    assert weighted.stopped == pytest.approx(5 / 7) and weighted.accuracy == pytest.approx(3 / 7)
    assert weighted.per_step == pytest.approx((9 + 1 + 4 + 0) / (14 + 4))
    assert weighted.lengths == {3: 7}
    assert weighted.errors == {
        "correct": 3,
        "wrong_value": 2,  # the second and fourth completions
        "wrong_copy": 2,
        "wrong_counter": 0,
        "malformed": 0,
        "wrong_answer": 0,
    }


def test_budget_holds_the_response_and_its_eos() -> None:
    assert [lr.budget(n) for n in lr.LENGTHS] == [80, 279, 565, 1093]
    assert all(lr.budget(n) >= 10 * n + 5 + 15 for n in range(1, 1000))  # the eos and room past it
    assert lr.budget(band(99)[1]) + 8 <= 2048  # the tiny preset's positions hold the prompt and the budget


def test_random_policy_gives_consistent_statistics() -> None:
    model, tokenizer = load_policy("tiny", seed=3)
    cfg = load_config(packaged_config("chain"), ["policy.device=cpu"])
    rows = lr.measure(model, tokenizer, cfg, lengths=(1, 3), problems=6, log=False)
    assert [(r.n, r.lengths, r.budget) for r in rows] == [(1, (1, 3), 50), (3, (1, 5), 70)]
    for r in rows:
        for s in (r.greedy, r.sampled):
            assert s.problems == 6 and s.n == r.n and sum(s.lengths.values()) == 6
            assert all(r.lengths[0] <= k <= r.lengths[1] for k in s.lengths)
            assert 0 < s.mean_tokens <= r.budget and 0 <= s.stopped <= 1
            mean = sum(w * s.per_step**k for k, w in s.lengths.items()) / 6
            assert 0 <= s.per_step <= 1 and s.predicted == pytest.approx(mean)
            assert sum(s.errors.values()) == 6
        assert 1 <= r.distinct <= 6


def test_a_task_other_than_chain_is_refused_before_the_sft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="needs the chain task, got 'arithmetic'"):
        lr.run_long_report(overrides=["task.name=arithmetic"])
    with pytest.raises(ConfigError, match=r"^lengths: a chain length must lie in \[1, 999\], got 1000"):
        lr.run_long_report(lengths=[1000])
    with pytest.raises(ConfigError, match=r"^task.args: modulus must lie in"):
        lr.run_long_report(overrides=["task.args={modulus: 11}"])
    assert not (tmp_path / "sft").exists()


def test_quick_study_writes_one_row_per_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    page = tmp_path / "docs" / "long_outputs.md"
    argv = ["--quick", "--threads", "1", "--lengths", "2", "5", "--problems", "4"]
    assert lr.cli([*argv, "--results", str(page)]) == 0
    lines = page.read_text().splitlines()
    main_table = [line for line in lines if re.match(r"\| \d+ \| \d+-\d+ \(mean [0-9.]+\) \| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in main_table] == ["2", "5"]
    # the quick SFT saw chains of 1-4 steps: length 5's band is clipped to them
    assert [row.split("|")[2].split(" (")[0] for row in main_table] == [" 1-4", " 1-4"]
    means = [float(row.split("|")[2].split("mean ")[1].split(")")[0]) for row in main_table]
    assert 1 <= means[0] <= 4 and 1 <= means[1] <= 4
    # response tokens at n (10 n + 5) and the budget of the band's longest chain (4): 10 * 4 + 4 + 16
    assert [row.split("|")[3:5] for row in main_table] == [[" 25 ", " 60 "], [" 55 ", " 60 "]]
    assert all(1 <= int(row.split("|")[5]) <= 4 for row in main_table)  # distinct prompts among 4 draws
    cells = main_table[0].split("|")[6:11]
    assert all(re.fullmatch(r" [0-9.]+ / [0-9.]+ ", c) for c in cells), cells
    error_rows = [line for line in lines if re.match(r"\| \d+ \| \d+ / \d+ \|", line)]
    assert len(error_rows) == 2
    for row in error_rows:  # every problem has one first-error kind, greedy and sampled
        pairs = [c.split("/") for c in row.split("|")[2:-1]]
        assert sum(int(g) for g, _ in pairs) == sum(int(s) for _, s in pairs) == 4
    capsys.readouterr()


def test_a_bad_length_ends_the_study_with_one_line(capsys) -> None:
    assert lr.cli(["--lengths", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a chain length must lie in [1, 999], got 0" in err
