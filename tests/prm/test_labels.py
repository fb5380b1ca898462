"""Labelers: oracle and outcome heuristic on arithmetic, Monte-Carlo labels with a scripted engine
(hand-computed labels, dedup, hard vs soft, batching) and with the real HFEngine, voting."""

import random
import re

import pytest
import torch

from creditrl.policy.engines import Generation, HFEngine, SamplingParams
from creditrl.policy.tokenizer import build_char_tokenizer, encode_prompt
from creditrl.prm.labels import (
    LABELERS,
    MCLabels,
    get_labeler,
    mc_labels,
    oracle_labels,
    outcome_heuristic_labels,
    register_labeler,
    vote_labels,
)
from creditrl.rewards.sources import split_steps
from creditrl.tasks.arithmetic import ArithmeticTask, split_completion

TASK = ArithmeticTask()
PROBLEM = TASK.make_problem("7+3*2-5=")  # 3*2=6;7+6=13;13-5=8;#8


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


# ----------------------------------------------------------------------------- oracle, outcome


@pytest.mark.parametrize("split", [lambda c: split_steps(c, ";"), split_completion])
def test_oracle_labels_first_error(split):
    assert oracle_labels(TASK, PROBLEM, split("3*2=6;7+6=13;13-5=8;#8")) == [1.0, 1.0, 1.0, 1.0]
    assert oracle_labels(TASK, PROBLEM, split("3*2=6;7+6=14;14-5=9;#9")) == [1.0, 0.0, None, None]
    assert oracle_labels(TASK, PROBLEM, split("7+3=10;#8")) == [0.0, None]
    assert oracle_labels(TASK, PROBLEM, []) == []


def test_outcome_heuristic_correct_solution_labels_every_step():
    steps = split_steps(PROBLEM.solution, ";")
    assert outcome_heuristic_labels(TASK, PROBLEM, steps, PROBLEM.solution, random.Random(0)) == [1.0] * 4


def test_outcome_heuristic_wrong_solution_labels_one_uniform_step():
    completion = "3*2=6;7+6=14;14-5=9;#9"
    steps = split_steps(completion, ";")
    draws = []
    for seed in range(400):
        labels = outcome_heuristic_labels(TASK, PROBLEM, steps, completion, random.Random(seed))
        assert sorted(labels, key=lambda x: x is None) == [0.0, None, None, None]
        k = labels.index(0.0)
        assert k == random.Random(seed).randrange(4)  # the rng's draw, nothing else
        draws.append(k)
    counts = [draws.count(k) for k in range(4)]
    assert all(70 <= c <= 130 for c in counts), counts  # uniform: 100 expected each
    assert outcome_heuristic_labels(TASK, PROBLEM, [], "", random.Random(0)) == []


# ----------------------------------------------------------------------------- MC, scripted


class ScriptedEngine:
    """Continues the prefix whose text (prompt + steps) is a key of ``script`` with its strings,
    cycled over the n samples (each followed by eos); records every call."""

    def __init__(self, tokenizer, script):
        self.tok = tokenizer
        self.script = script
        self.calls = []

    def generate(self, prompts, n, params, *, generator=None, budgets=None):
        prompts = [list(p) for p in prompts]
        self.calls.append((prompts, n, params))
        tokens = []
        for p in prompts:
            conts = self.script[self.tok.decode(p, skip_special_tokens=True)]
            for j in range(n):
                ids = self.tok(conts[j % len(conts)], add_special_tokens=False)["input_ids"]
                tokens.append(list(ids) + [self.tok.eos_token_id])
        return Generation(
            prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
            prompt_ids=[p for p in prompts for _ in range(n)],
            tokens=tokens,
            logprobs=[[0.0] * len(t) for t in tokens],
            finished=[True] * len(tokens),
        )


SCRIPT = {
    # completions: "3*2=6;7+6=13;13-5=8;#8" right, "...#13" wrong, "3*2=6;#8" right, "#x" wrong -> 2/4
    "7+3*2-5=3*2=6;": ["7+6=13;13-5=8;#8", "7+6=13;#13", "#8", "#x"],
    "7+3*2-5=3*2=6;7+6=13;": ["13-5=8;#8"],  # 4/4
    "7+3*2-5=3*2=6;7+6=13;13-5=8;": ["#8", "#80"],  # 2/4
    "7+3*2-5=3*2=6;7+6=14;": ["#9"],  # 0/4
}
ITEMS = [
    (PROBLEM, ["3*2=6;", "7+6=13;", "13-5=8;", "#8"]),  # right: last step's label is 1.0
    (TASK.make_problem("7+3*2-5"), ["3*2=6;", "7+6=14;", "#14"]),  # an equal Problem: shares "3*2=6;"
    (PROBLEM, ["#8"]),  # one step: its outcome, nothing sampled
    (PROBLEM, []),
]
PARAMS = SamplingParams(max_new_tokens=20, temperature=1.0)
# continuation tokens (eos included): (17 + 11 + 3 + 3) + 4 * 10 + (3 + 4 + 3 + 4) + 4 * 3
N_TOKENS = 100


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("hard", [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0], []]),
        ("soft", [[0.5, 1.0, 0.5, 1.0], [0.5, 0.0, 0.0], [1.0], []]),
    ],
)
def test_mc_labels_by_hand(tok, mode, expected):
    engine = ScriptedEngine(tok, SCRIPT)
    result = mc_labels(engine, tok, TASK, ITEMS, n=4, params=PARAMS, mode=mode)
    assert isinstance(result, MCLabels)
    assert result.labels == expected
    assert result.fractions == [[0.5, 1.0, 0.5, 1.0], [0.5, 0.0, 0.0], [1.0], []]
    assert (result.n_prefixes, result.n_continuations, result.n_tokens) == (4, 16, N_TOKENS)
    # one call, 4 distinct prefixes (the shared first step once, no last steps), params as given
    ((prompts, n, params),) = engine.calls
    assert (n, params) == (4, PARAMS)
    prompt_ids = encode_prompt(tok, PROBLEM.prompt)
    assert prompts == [
        prompt_ids + tok(text[len(PROBLEM.prompt) :], add_special_tokens=False)["input_ids"] for text in SCRIPT
    ]


def test_mc_labels_calls_in_chunks_with_the_same_labels(tok):
    whole = mc_labels(ScriptedEngine(tok, SCRIPT), tok, TASK, ITEMS, n=4, params=PARAMS, mode="soft")
    engine = ScriptedEngine(tok, SCRIPT)
    chunked = mc_labels(engine, tok, TASK, ITEMS, n=4, params=PARAMS, mode="soft", max_prefixes_per_call=3)
    assert [len(prompts) for prompts, _, _ in engine.calls] == [3, 1]
    assert chunked == whole


def test_mc_labels_prefix_of_another_problem_is_not_shared(tok):
    other = TASK.make_problem("3*2+3=")  # first step "3*2=6;" as in PROBLEM, answer 9
    script = {**SCRIPT, "3*2+3=3*2=6;": ["6+3=9;#9", "#1"], "3*2+3=3*2=6;6+3=9;": ["#9"]}
    engine = ScriptedEngine(tok, script)
    result = mc_labels(engine, tok, TASK, [ITEMS[0], (other, ["3*2=6;", "6+3=9;", "#9"])], n=2, params=PARAMS)
    assert result.n_prefixes == 3 + 2
    assert result.fractions == [[0.5, 1.0, 0.5, 1.0], [0.5, 1.0, 1.0]]


def test_mc_labels_rejects_bad_arguments(tok):
    engine = ScriptedEngine(tok, SCRIPT)
    with pytest.raises(ValueError, match=re.escape("unknown MC label mode 'any'; valid: hard, soft")):
        mc_labels(engine, tok, TASK, ITEMS, n=4, params=PARAMS, mode="any")
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        mc_labels(engine, tok, TASK, ITEMS, n=0, params=PARAMS)
    with pytest.raises(ValueError, match="max_prefixes_per_call must be >= 1 or None, got 0"):
        mc_labels(engine, tok, TASK, ITEMS, n=4, params=PARAMS, max_prefixes_per_call=0)
    with pytest.raises(ValueError, match="max_rows must be >= 1 or None, got 0"):
        mc_labels(engine, tok, TASK, ITEMS, n=4, params=PARAMS, max_rows=0)
    assert engine.calls == []


# ----------------------------------------------------------------------------- MC, real engine


def real_items():
    problems = TASK.sample(3, split="train", seed=5)
    items = []
    for p in problems:
        items.append((p, split_steps(p.solution, ";")))
        wrong = p.solution.replace("=", "=1", 1).replace("#", "#1")  # first result and answer gain a 1
        items.append((p, split_steps(wrong, ";")))
        items.append((p, split_steps(p.solution, ";")))  # a second sample equal to the first
    return items


def test_mc_labels_with_hf_engine(peaked_tiny):
    model, tok = peaked_tiny(0, 123)
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    items = real_items()
    params = SamplingParams(max_new_tokens=6)
    run = lambda mode, **bounds: mc_labels(  # noqa: E731
        engine, tok, TASK, items, n=3, params=params, generator=torch.Generator().manual_seed(7), mode=mode, **bounds
    )
    hard, soft = run("hard"), run("soft")
    bounded = run("soft", max_rows=4)  # at most 4 continuations per engine call: the same samples
    assert bounded.fractions == soft.fractions and bounded.n_tokens == soft.n_tokens
    by_positions = run("soft", max_rows=64, max_positions=40)  # at most 40 padded cache positions per call
    assert by_positions.fractions == soft.fractions and by_positions.n_tokens == soft.n_tokens
    distinct = {(p.prompt, "".join(steps[: k + 1])) for p, steps in items for k in range(len(steps) - 1)}
    assert hard.n_prefixes == len(distinct) == 2 * sum(len(s) - 1 for _, s in items) // 3  # repeats shared
    assert hard.n_continuations == 3 * hard.n_prefixes
    assert hard.n_continuations <= hard.n_tokens <= 6 * hard.n_continuations
    for (problem, steps), h, s, f in zip(items, hard.labels, soft.labels, soft.fractions):
        assert len(h) == len(s) == len(f) == len(steps)
        assert all(x in (0.0, 1 / 3, 2 / 3, 1.0) for x in f)
        assert h == [1.0 if x > 0 else 0.0 for x in f]
        assert s == f
        assert f[-1] == float(TASK.check_outcome(problem, "".join(steps)))
    assert soft.fractions == hard.fractions  # same seed, same samples
    assert [f[-1] for f in soft.fractions] == [1.0, 0.0, 1.0] * 3
    assert soft.fractions[0] == soft.fractions[2]  # the repeated sample shares its prefixes' labels


def test_mc_labels_greedy_matches_a_per_prefix_reference(peaked_tiny):
    model, tok = peaked_tiny(0, 123)
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    items = real_items()
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    result = mc_labels(engine, tok, TASK, items, n=2, params=params, mode="soft")
    for (problem, steps), fractions in zip(items, result.fractions):
        expected = []
        for k in range(len(steps) - 1):
            text = "".join(steps[: k + 1])
            ids = encode_prompt(tok, problem.prompt) + tok(text, add_special_tokens=False)["input_ids"]
            gen = engine.generate([ids], 1, params)
            completion = tok.decode(
                tok(text, add_special_tokens=False)["input_ids"] + gen.tokens[0], skip_special_tokens=True
            )
            expected.append(float(TASK.check_outcome(problem, completion)))
        expected.append(float(TASK.check_outcome(problem, "".join(steps))))
        assert fractions == expected


# ----------------------------------------------------------------------------- vote


def test_vote_labels_by_hand():
    lists = [[1.0, 0.0, 1.0, None], [1.0, 1.0, 0.0, None], [0.9, 0.2, None, None]]
    assert vote_labels(lists, threshold=0.6) == ([1.0, 0.0, None, None], 1)  # step 2: a 1-1 tie
    assert vote_labels(lists, threshold=0.7) == ([1.0, None, None, None], 2)  # step 1: 2/3 < 0.7
    assert vote_labels(lists, threshold=1.0) == ([1.0, None, None, None], 2)


def test_vote_labels_hardens_soft_labels_at_one_half():
    assert vote_labels([[0.5, 0.49, 0.7]], threshold=1.0) == ([1.0, 0.0, 1.0], 0)
    assert vote_labels([[0.5], [0.49], [0.0], [0.6]], threshold=0.5) == ([None], 1)  # 2-2 tie
    assert vote_labels([[0.5], [0.49], [0.0]], threshold=0.5) == ([0.0], 0)


def test_vote_labels_rejects_bad_input():
    with pytest.raises(ValueError, match=re.escape("label lists of lengths [1, 2]")):
        vote_labels([[1.0], [1.0, 0.0]], threshold=0.5)
    with pytest.raises(ValueError, match="threshold must be in \\(0, 1\\], got 0"):
        vote_labels([[1.0]], threshold=0)
    with pytest.raises(ValueError, match="at least one labeler"):
        vote_labels([], threshold=0.5)


# ----------------------------------------------------------------------------- registry


def test_registry():
    assert sorted(LABELERS) == ["mc", "oracle", "outcome_heuristic", "vote"]
    fns = {"oracle": oracle_labels, "outcome_heuristic": outcome_heuristic_labels, "mc": mc_labels, "vote": vote_labels}
    for name, labeler in LABELERS.items():
        assert labeler.name == name and labeler.fn is fns[name]
        assert labeler.doc and "\n" not in labeler.doc
    assert get_labeler("mc") is LABELERS["mc"]
    with pytest.raises(ValueError, match=re.escape("unknown labeler 'x'; valid: mc, oracle, outcome_heuristic, vote")):
        get_labeler("x")
    with pytest.raises(ValueError, match="labeler 'mc' is already registered"):
        register_labeler("mc", "again")(lambda: None)
