"""Tests for the chain task (the long-output setting): solutions, checkers, splits, config."""

from __future__ import annotations

import random
import re

import pytest

from creditrl.config import load_config
from creditrl.config.loader import packaged_config
from creditrl.errors import ConfigError
from creditrl.tasks import chain
from creditrl.tasks.arithmetic import split_completion
from creditrl.tasks.base import Task, make_task
from creditrl.tasks.chain import STEP_CHARS, ChainConfig, ChainTask, chain_steps, step_operator, steps_for_tokens
from creditrl.train.resolve import build_task, checked

TASK = ChainTask()  # modulus 5
TASK10 = ChainTask(modulus=10)
P3 = TASK.make_problem("31~003=")  # 003:3+1=4; 002:1+4=0; 001:4+0=4; answer 404
P_SUB = TASK.make_problem("13~005=")  # 005:1-3=3 (-2 mod 5); 004:3+3=1; 003:3+1=4; 002:1+4=0; 001:4+0=4
P_CROSS = TASK.make_problem("20~011=")  # 011, 010 add; 009 .. 005 subtract; 004 .. 001 add
T, F = True, False

CROSS = "011:2+0=2;010:0+2=2;009:2-2=0;008:2-0=2;007:0-2=3;006:2-3=4;005:3-4=4;004:4+4=3;003:4+3=2;002:3+2=0;001:2+0=2"


@pytest.mark.parametrize(
    ("task", "prompt", "solution", "answer"),
    [
        (TASK, "31~003=", "003:3+1=4;002:1+4=0;001:4+0=4;#404", "404"),  # 1+4 = 5 wraps to 0
        (TASK, "13~005=", "005:1-3=3;004:3+3=1;003:3+1=4;002:1+4=0;001:4+0=4;#404", "404"),  # 1-3 = -2 -> 3
        (TASK, "20~011=", CROSS + ";#202", "202"),  # '+' at 011, 010; '-' at 009 .. 005; '+' at 004 .. 001
        (TASK, "30~002=", "002:3+0=3;001:0+3=3;#033", "033"),  # the answer keeps its leading 0
        (TASK, "01~001=", "001:0+1=1;#011", "011"),  # n = 1: the answer includes both prompt digits
        (TASK, "00~001=", "001:0+0=0;#000", "000"),
        (TASK10, "97~006=", "006:9-7=2;005:7-2=5;004:2+5=7;003:5+7=2;002:7+2=9;001:2+9=1;#291", "291"),
        (TASK10, "38~005=", "005:3-8=5;004:8+5=3;003:5+3=8;002:3+8=1;001:8+1=9;#819", "819"),  # 3-8 -> 5 mod 10
        (TASK, "44~012=", None, None),  # checked below: the counter runs 012 .. 001
    ],
)
def test_canonical_solution(task: ChainTask, prompt: str, solution: str | None, answer: str | None) -> None:
    problem = task.make_problem(prompt)
    n = int(prompt[3:6])
    assert problem.prompt == prompt and problem.meta["n_ops"] == n
    if solution is not None:
        assert (problem.solution, problem.answer) == (solution, answer)
    steps, ans = chain_steps(prompt, task.config.modulus)
    assert [s[:3] for s in steps] == [f"{i:03d}" for i in range(n, 0, -1)]
    assert [s[5] for s in steps] == [step_operator(i) for i in range(n, 0, -1)]
    assert problem.solution == ";".join(steps) + f";#{ans}" and problem.answer == ans and len(ans) == 3
    assert len(problem.solution) == STEP_CHARS * n + 4 == 10 * n + 4


def test_step_operator_switches_on_the_counters_last_digit() -> None:
    assert [step_operator(i) for i in range(10)] == list("+++++-----")
    assert [step_operator(i) for i in (10, 14, 15, 19, 20, 99, 100, 995, 999)] == list("++--+-+--")


def test_make_problem_adds_the_equals_sign_and_rejects_bad_prompts() -> None:
    assert TASK.make_problem("31~003") == P3
    assert chain_steps("11~999=")[0][0] == "999:1-1=0"
    for bad in ("3+1~003=", "31~3=", "31~03=", "31~0003=", "3~003=", "311~003=", "31003=", "31~003==", "31=", ""):
        with pytest.raises(ValueError, match="not a chain prompt"):
            chain_steps(bad)
    with pytest.raises(ValueError, match=r"chain length must lie in \[1, 999\], got 000"):
        chain_steps("31~000=")


def test_a_prompt_digit_at_or_above_the_modulus_is_refused() -> None:
    for prompt in ("51~003=", "15~003=", "99~003="):
        with pytest.raises(ValueError, match=f"chain prompt '{prompt}' has a digit >= the modulus 5"):
            TASK.make_problem(prompt)
    with pytest.raises(ValueError, match="has a digit >= the modulus 3"):
        ChainTask(modulus=3).make_problem("31~003=")
    assert TASK10.make_problem("99~001=").solution == "001:9+9=8;#998"
    assert ChainTask(modulus=2).make_problem("11~002=").solution == "002:1+1=0;001:1+0=1;#101"


@pytest.mark.parametrize("n", [1, 6, 25, 51, 99, 999])
def test_response_is_ten_characters_per_step_plus_four(n: int) -> None:
    problem = TASK.make_problem(f"42~{n:03d}=")
    assert len(problem.solution) == 10 * n + 4
    assert len(problem.solution) + 1 == 10 * n + 5  # with the eos: the tokens of the response


def test_steps_for_tokens_is_the_closest_length() -> None:
    assert [steps_for_tokens(t) for t in (64, 256, 512, 1000, 1024)] == [6, 25, 51, 99, 102]
    assert steps_for_tokens(1) == 1 and steps_for_tokens(31) == 3 and steps_for_tokens(20000) == 999
    for t in range(1, 10_100):  # the response with its eos (10 n + 5) nearest t; a tie goes to the shorter
        best = min(range(1, 1000), key=lambda n: (abs(10 * n + 5 - t), n))
        assert steps_for_tokens(t) == best, t


@pytest.mark.parametrize(
    ("problem", "segments", "labels"),
    [
        (P3, ["003:3+1=4", "002:1+4=0", "001:4+0=4", "#404"], [T, T, T, T]),
        (P3, ["003:3+1=4;", " 002:1+4=0 ; ", "\t001:4+0=4\n", " #404 "], [T, T, T, T]),
        (P3, ["003:3+1=0", "002:1+0=1", "001:0+1=1", "#011"], [F, F, F, F]),  # wrong first value
        (P3, ["003:3+1=4", "002:1+4=1", "001:4+0=4", "#404"], [T, F, F, T]),  # right steps after an error
        (P3, ["003:3+1=4", "002:1+4=5", "#404"], [T, F, T]),  # 5 is not a mod-5 value
        (P3, ["003:3+1=4", "001:4+0=4", "#404"], [T, F, T]),  # a skipped step
        (P3, ["003:3+1=4", "003:3+1=4", "002:1+4=0", "#404"], [T, F, F, T]),  # a repeated step
        (P3, ["003:3+1=4", "002:1+4=0", "001:4+0=4", "000:0+4=4", "#044"], [T, T, T, F, F]),  # one too many
        (P3, ["003:3+1=4", "#314", "002:1+4=0"], [T, F, F]),  # steps after the answer are wrong
        (P3, ["003:3+1=4", "002:1+4=0", "001:4+0=4", "#404", "#404"], [T, T, T, T, F]),  # a second answer
        (P3, ["003:3+1=4;;", "002:1+4=0", "#404"], [F, F, T]),  # only one ";" is stripped
        (P3, ["", "003:3+1=4", "#404"], [F, F, T]),
        (P3, ["3:3+1=4", "002:1+4=0", "#404"], [F, F, T]),  # the counter has three digits
        (P3, ["#0404"], [F]),
        (P3, ["#04"], [F]),  # the answer is the last three values
        (P3, [], []),
        (P_SUB, ["005:1-3=3", "004:3+3=1", "003:3+1=4", "002:1+4=0", "001:4+0=4", "#404"], [T] * 6),
        (P_SUB, ["005:1-3=-2", "004:3+3=1", "#404"], [F, F, T]),  # no negative values
        (P_SUB, ["005:1+3=4", "004:3+4=2", "#404"], [F, F, T]),  # the wrong operator
        (P_CROSS, ["011:2+0=2", "010:0+2=2", "009:2+2=4", "008:2+4=1"], [T, T, F, F]),  # '+' kept past 010
        (P_CROSS, CROSS.split(";") + ["#202"], [T] * 12),
    ],
)
def test_check_steps_stops_at_the_first_error(problem, segments: list[str], labels: list[bool]) -> None:
    assert TASK.check_steps(problem, segments) == labels


def test_check_steps_uses_the_tasks_modulus() -> None:
    p10 = TASK10.make_problem("38~005=")  # 005:3-8=5 (-5 mod 10); 004:8+5=3; ...
    assert TASK10.check_steps(p10, split_completion(p10.solution)) == [T] * 6
    assert TASK10.check_steps(p10, ["005:3-8=5", "004:8+5=3", "#819"]) == [T, T, T]
    assert TASK10.check_steps(p10, ["005:3-8=0", "004:8+0=8", "#819"]) == [F, F, T]  # -5 mod 5, not mod 10
    with pytest.raises(ValueError, match="has a digit >= the modulus 5"):
        TASK.check_steps(p10, ["005:3-8=5"])  # a mod-5 task cannot read a mod-10 prompt


def test_label_completion_splits_at_semicolons_keeping_the_answer_whole() -> None:
    assert TASK.label_completion(P3, P3.solution) == [T, T, T, T]
    assert TASK.label_completion(P3, "003:3+1=4;002:1+4=0;") == [T, T]  # no answer: no answer label
    assert split_completion("003:3+1=4;#314;002:1+4=0") == ["003:3+1=4", "#314;002:1+4=0"]
    assert TASK.label_completion(P3, "003:3+1=4;#314;002:1+4=0") == [T, F]
    assert TASK.label_completion(P3, "") == []


def test_correct_steps_form_a_prefix_under_corruption() -> None:
    rng = random.Random(0)
    task = ChainTask(min_steps=1, max_steps=30)
    for problem in task.sample(300, split="train", seed=4):
        chars = list(problem.solution)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice("0123456789+-:=;#")
        completion = "".join(chars)
        labels = task.label_completion(problem, completion)
        steps = labels[:-1] if "#" in completion else labels
        assert steps == sorted(steps, reverse=True)
        if "#" in completion:
            assert labels[-1] is task.check_outcome(problem, completion)
        if all(labels) and "#" in completion:
            assert completion.find("#") == len(problem.solution) - 4 and len(steps) == problem.meta["n_ops"]


@pytest.mark.parametrize(
    ("completion", "answer", "right"),
    [
        ("003:3+1=4;002:1+4=0;001:4+0=4;#404", "404", True),
        ("#404", "404", True),  # the outcome reads only the answer
        ("  #  404\n", "404", True),
        ("junk;#404", "404", True),
        ("#440", "440", False),
        ("#0404", "0404", False),
        ("#04", "04", False),  # three values, not two
        ("#40 4", "40 4", False),
        ("#404;#404", "404;#404", False),
        ("#", "", False),
        ("003:3+1=4;002:1+4=0;001:4+0=4", None, False),
        ("", None, False),
    ],
)
def test_check_outcome_and_extract_answer(completion: str, answer: str | None, right: bool) -> None:
    assert TASK.extract_answer(completion) == answer
    assert TASK.check_outcome(P3, completion) is right
    assert TASK.same_answer("404", "404") and not TASK.same_answer("033", "33")


@pytest.mark.parametrize(
    ("problem", "completion", "kind"),
    [
        (P3, P3.solution, "correct"),
        (P3, "003:3+1=0;002:1+0=1;#404", "correct"),  # the outcome decides "correct"
        (P3, "003:3+1=0;002:1+0=1;001:0+1=1;#011", "wrong_value"),
        (P3, "003:3+1=4;002:1+4=0;001:4+0=0;#400", "wrong_value"),  # the last step
        (P3, "003:3+1=4;002:1+4=5;001:4+5=4;#454", "wrong_value"),  # no wrap-around of 1+4
        (P_SUB, "005:1-3=2;004:3+2=0;003:2+0=2;#202", "wrong_value"),  # |1-3| instead of -2 mod 5
        (P3, "003:3+1=4;002:3+4=2;001:4+2=1;#421", "wrong_copy"),  # copied the wrong operand
        (P3, "003:3+1=4;002:4+1=0;001:1+0=1;#401", "wrong_copy"),  # swapped operands
        (P3, "003:3-1=2;002:1+2=3;001:2+3=0;#230", "wrong_copy"),  # the wrong operator
        (P_CROSS, "011:2+0=2;010:0+2=2;009:2+2=4;#224", "wrong_copy"),  # '+' where the counter turns to 9
        (P3, "003:3+1=4;001:1+4=0;000:4+0=4;#404x", "wrong_counter"),
        (P3, "004:3+1=4;003:1+4=0;002:4+0=4;#404x", "wrong_counter"),
        (P_CROSS, "011:2+0=2;009:0+2=2;#x", "wrong_counter"),
        (P3, "003:3+1=4;hello;#404x", "malformed"),
        (P3, "003:3+1=4;002:1+4=10;#404x", "malformed"),
        (P3, "003:3+1=4;002:1+4=-1;#404x", "malformed"),
        (P3, "003:3+1=4;;002:1+4=0;#404x", "malformed"),  # an empty step
        (P3, "03:3+1=4;02:1+4=0;#404x", "malformed"),  # a two-digit counter
        (P3, "003:3+1=4;002:1+4=0;001:4+0=4;000:0+4=4;#044", "malformed"),  # a step past the end
        (P3, "003:3+1=4;002:1+4=0;001:4+0=4;#440", "wrong_answer"),
        (P3, "003:3+1=4;002:1+4=0;001:4+0=4;#04", "wrong_answer"),  # the last two values only
        (P3, "003:3+1=4;002:1+4=0;001:4+0=4", "wrong_answer"),  # no answer
        (P3, "003:3+1=4;#314", "wrong_answer"),  # an early answer
        (P3, "", "wrong_answer"),
    ],
)
def test_first_error_kinds(problem, completion: str, kind: str) -> None:
    assert TASK.first_error(problem, completion) == kind
    assert kind in TASK.error_kinds


def test_first_error_points_at_the_first_wrong_step_under_corruption() -> None:
    rng = random.Random(1)
    task = ChainTask(min_steps=1, max_steps=20)
    seen = set()
    for problem in task.sample(400, split="train", seed=5):
        chars = list(problem.solution)
        chars[rng.randrange(len(chars))] = rng.choice("0123456789+-:=;#")
        completion = "".join(chars) + "x"  # a wrong answer: the kind is that of the first wrong step
        kind = task.first_error(problem, completion)
        seen.add(kind)
        labels = task.label_completion(problem, completion)
        if kind == "wrong_answer":
            assert all(lab for seg, lab in zip(split_completion(completion), labels) if not seg.startswith("#"))
        else:
            assert not all(labels)
    assert seen == set(TASK.error_kinds) - {"correct"}  # one character goes wrong in every way


def test_sampling_is_deterministic_and_splits_are_disjoint() -> None:
    first = TASK.sample(50, split="train", seed=1)
    assert first == ChainTask().sample(50, split="train", seed=1)
    assert [p.prompt for p in first] != [p.prompt for p in TASK.sample(50, split="train", seed=2)]
    # Pinned so that a process-dependent hash (e.g. Python's hash()) would be caught.
    assert [p.prompt for p in TASK.sample(3, split="heldout", seed=0)] == ["13~025=", "31~025=", "13~025="]
    assert [p.prompt for p in TASK.sample(3, split="train", seed=0)] == ["41~025=", "20~025=", "20~025="]
    task = ChainTask(min_steps=1, max_steps=8)  # 200 prompts in all: repeats, so an overlap would show
    train = {p.prompt for p in task.sample(3000, split="train", seed=0)}
    heldout = {p.prompt for p in task.sample(1000, split="heldout", seed=0)}
    assert len(train) > 150 and len(heldout) > 8 and train.isdisjoint(heldout)
    assert len(train | heldout) == 200  # every prompt drawn: the digits stay below the modulus
    assert all(task.split_of(p) == "train" for p in train) and all(task.split_of(p) == "heldout" for p in heldout)
    every = [f"{a}{b}~{n:03d}=" for a in range(5) for b in range(5) for n in range(1, 41)]
    assert abs(sum(task.split_of(p) == "heldout" for p in every) / len(every) - 1 / 10) < 0.03


def test_distinct_heldout_draws_every_heldout_prompt_once_and_train_draws_stay_plain() -> None:
    task = ChainTask(min_steps=1, max_steps=8, distinct_heldout=True)
    every = {f"{a}{b}~{n:03d}=" for a in range(5) for b in range(5) for n in range(1, 9)}
    heldout = {p for p in every if task.split_of(p) == "heldout"}
    got = [p.prompt for p in task.sample(len(heldout), split="heldout", seed=0)]
    assert len(got) == len(set(got)) and set(got) == heldout
    plain = ChainTask(min_steps=1, max_steps=8)
    assert task.sample(50, split="train", seed=0) == plain.sample(50, split="train", seed=0)
    asked = len(heldout) + 1
    with pytest.raises(ValueError, match=rf"^only {len(heldout)} distinct 'heldout' problems found \({asked} asked"):
        task.sample(len(heldout) + 1, split="heldout", seed=0)


@pytest.mark.parametrize(
    "config",
    [ChainConfig(), ChainConfig(min_steps=1, max_steps=99), ChainConfig(min_steps=6, max_steps=6, modulus=10)],
    ids=repr,
)
def test_random_problems_are_consistent(config: ChainConfig) -> None:
    task = ChainTask(config)
    for split, n in (("train", 200), ("heldout", 50)):
        for problem in task.sample(n, split=split, seed=7):
            assert re.fullmatch(r"[0-9]{2}~[0-9]{3}=", problem.prompt)
            assert max(int(problem.prompt[0]), int(problem.prompt[1])) < config.modulus
            assert int(problem.prompt[3:6]) == problem.meta["n_ops"]
            assert config.min_steps <= problem.meta["n_ops"] <= config.max_steps
            assert all(int(d) < config.modulus for d in problem.answer)
            assert problem.meta["split"] == split == task.split_of(problem.prompt)
            assert len(problem.solution) == 10 * problem.meta["n_ops"] + 4
            assert task.check_outcome(problem, problem.solution)
            assert task.label_completion(problem, problem.solution) == [True] * (problem.meta["n_ops"] + 1)
            assert task.first_error(problem, problem.solution) == "correct"


def test_sample_argument_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown split 'test'; valid splits: train, heldout"):
        TASK.sample(1, split="test", seed=0)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        TASK.sample(-1, split="train", seed=0)
    assert TASK.sample(0, split="heldout", seed=0) == []
    monkeypatch.setattr(chain, "_MAX_CONSECUTIVE_MISSES", 1000)
    never = ChainTask(min_steps=1, max_steps=1, heldout_mod=10**15)  # 25 prompts, none held out
    with pytest.raises(ValueError, match="no 'heldout' problem in 1000 consecutive draws"):
        never.sample(1, split="heldout", seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_steps": 0}, "min_steps must be >= 1, got 0"),
        ({"min_steps": 5, "max_steps": 4}, r"max_steps must lie in \[min_steps \(5\), 999\], got 4"),
        ({"max_steps": 1000}, r"max_steps must lie in \[min_steps \(25\), 999\], got 1000"),
        ({"modulus": 1}, r"modulus must lie in \[2, 10\], got 1"),
        ({"modulus": 11}, r"modulus must lie in \[2, 10\], got 11"),
        ({"heldout_mod": 1}, "heldout_mod must be >= 2, got 1"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        ChainConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{message}"):
        make_task("chain", **kwargs)
    with pytest.raises(ConfigError, match=f"^task.args: {message}"):
        build_task("chain", kwargs)


def test_make_task_builds_configured_chain() -> None:
    task = make_task("chain", min_steps=6, max_steps=6)
    assert isinstance(task, ChainTask) and isinstance(task, Task)
    assert task.config == ChainConfig(min_steps=6, max_steps=6)
    assert (task.name, task.step_separator, task.answer_marker) == ("chain", ";", "#")
    assert ChainTask(ChainConfig(modulus=10), max_steps=30).config == ChainConfig(max_steps=30, modulus=10)
    for knob in ("min_ops", "operators"):  # operators: the old design's knob is gone
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{knob}'"):
            make_task("chain", **{knob: 3})
        with pytest.raises(ConfigError, match=f"^sft.task_args: .*unexpected keyword argument '{knob}'"):
            build_task("chain", {knob: 3}, "sft.task_args")


def test_packaged_config_goes_through_the_resolve_layer() -> None:
    cfg = load_config(packaged_config("chain"))
    assert (cfg.task.name, dict(cfg.task.args)) == ("chain", {"min_steps": 46, "max_steps": 56})
    assert dict(cfg.sft.task_args) == {"min_steps": 1, "max_steps": 99}
    task = build_task(cfg.task.name, cfg.task.args)
    assert isinstance(task, ChainTask) and task.config == ChainConfig(min_steps=46, max_steps=56)
    assert build_task(cfg.task.name, cfg.sft.task_args, "sft.task_args").config == ChainConfig(1, 99)
    # the rollouts hold a whole n = 56 response (565 tokens with the eos)
    assert cfg.rollout.max_new_tokens == 600 >= 10 * 56 + 5
    resolved = checked(cfg)  # registries, the step separator and sft.task_args
    assert resolved.reward.step_separator == ";"
    with pytest.raises(ConfigError, match="^task.args: max_steps must lie in"):
        checked(load_config(packaged_config("chain"), ["task.args={min_steps: 51, max_steps: 5}"]))
    with pytest.raises(ConfigError, match=r"^task.args: modulus must lie in \[2, 10\], got 12"):
        checked(load_config(packaged_config("chain"), ["task.args={modulus: 12}"]))
    with pytest.raises(ConfigError, match="^sft.task_args: min_steps must be >= 1, got 0"):
        checked(load_config(packaged_config("chain"), ["sft.task_args={min_steps: 0, max_steps: 99}"]))


def test_band_of_chain_lengths_and_the_sft_longest_chain() -> None:
    from creditrl.config import load_config
    from creditrl.config.loader import packaged_config
    from creditrl.tasks.chain import band, sft_longest

    assert (band(1), band(2), band(3), band(6), band(999)) == ((1, 3), (1, 4), (1, 5), (4, 8), (995, 999))
    # no longer than the SFT's longest chain (its counter never passed it): shifted down, same width
    assert (band(99, 99), band(97, 99), band(51, 99)) == ((95, 99), (95, 99), (49, 53))
    assert sft_longest(load_config(packaged_config("chain"))) == 99
    assert sft_longest(load_config(overrides=["task.name=arithmetic"])) == 999
