"""The oracle step source on any spans: at step granularity it is the former per-step oracle; at
token / segment / key_token granularity each span takes the label of the step holding its last
character (hand-worked examples and random arithmetic completions)."""

import random

import pytest
import torch

from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rewards import get_source, make_segmenter, place, score_batch
from creditrl.rewards.sources import first_error_labels, split_steps
from creditrl.rollout.segment import TokenTexts, segment
from creditrl.tasks import make_task

ORACLE = get_source("oracle_steps")


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def task():
    return make_task("arithmetic", min_ops=1, max_ops=5)


def old_oracle(task, problem, segments):
    """The oracle as it was: the step checker on the segments, labels up to the first error."""
    scores = []
    for ok in task.check_steps(problem, list(segments)):
        scores.append(1.0 if ok else 0.0)
        if not ok:
            break
    return scores + [None] * (len(segments) - len(scores))


def pack(tok, texts, eos):
    """Char-token rows (eos appended where asked), right-padded: (rows, ids, lengths, mask)."""
    rows = [
        tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if e else []) for t, e in zip(texts, eos)
    ]
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    return rows, ids, lengths, torch.arange(width)[None, :] < lengths[:, None]


def corrupt(solution, rng):
    """A completion derived from a correct solution by one random corruption (or none)."""
    steps = solution.split(";")  # [..., "#answer"]
    kind = rng.choice(["none", "result", "operand", "drop", "repeat", "answer", "cut", "no_answer"])
    i = rng.randrange(len(steps))
    if kind == "result" and "=" in steps[i]:
        lhs, c = steps[i].split("=")
        steps[i] = f"{lhs}={int(c) + rng.choice([-2, -1, 1, 3])}"
    elif kind == "operand" and "=" in steps[i]:
        steps[i] = str(rng.randint(0, 9)) + steps[i][1:]
    elif kind == "drop" and len(steps) > 1:
        del steps[i]
    elif kind == "repeat":
        steps.insert(i, steps[i])
    elif kind == "answer":
        steps[-1] = f"#{rng.randint(-20, 99)}"
    elif kind == "no_answer":
        steps[-1] = ""  # stops right after a separator
    text = ";".join(steps)
    if kind == "cut":
        text = text[: rng.randint(0, len(text))]
    return text


def random_completions(task, n, seed):
    rng = random.Random(seed)
    problems = task.sample(n, split="train", seed=seed)
    texts = [corrupt(p.solution, rng) for p in problems]
    eos = [rng.random() < 0.6 for _ in problems]
    return problems, texts, eos


# ----------------------------------------------------------------------------- step granularity


@pytest.mark.parametrize("seed", range(4))
def test_step_granularity_equals_the_former_oracle(task, tok, seed):
    problems, texts, eos = random_completions(task, 60, seed)
    _, ids, lengths, _ = pack(tok, texts, eos)
    seg = segment(ids, lengths, TokenTexts(tok), make_segmenter("step", step_separator=";"))
    res = score_batch(ORACLE, task, problems, texts, seg.texts, granularity="step")
    assert res.errors == 0
    expected = [old_oracle(task, p, spans) for p, spans in zip(problems, seg.texts)]
    assert res.scores == expected
    flat = [x for row in expected for x in row]
    assert flat.count(1.0) and flat.count(0.0) and flat.count(None)  # the corruptions bite


def test_step_granularity_by_hand(task):
    p = task.make_problem("7+3*2-5=")
    cases = [
        (["3*2=6;", "7+6=13;", "13-5=8;", "#8"], [1.0, 1.0, 1.0, 1.0]),
        (["3*2=6;", "7+6=14;", "14-5=9;", "#9"], [1.0, 0.0, None, None]),
        (["3*2=6;", "7+6=13;", "13-5=8;", ""], [1.0, 1.0, 1.0, 0.0]),  # eos right after ';'
        (["3*2=6;", "7+6=13;"], [1.0, 1.0]),  # truncated after ';': no trailing step to judge
        ([""], [0.0]),  # eos alone
        (["3*2=6;\n", "7+6=13;\n", "13-5=8;\n", "#8"], [1.0, 1.0, 1.0, 1.0]),  # tokens such as ";\n"
    ]
    for spans, want in cases:
        assert ORACLE.fn(task, p, "".join(spans), spans) == want == old_oracle(task, p, spans)


# ----------------------------------------------------------------------------- other granularities by hand

WRONG = "3*2=6;7+6=12;12-5=7;#7"  # for 7+3*2-5= (= 8): step 2 is wrong, so steps 3 and 4 are unlabelled
#         0123456789012345678901
#         step 1 = chars 0-5 (1.0), step 2 = 6-12 (0.0), step 3 = 13-19 (None), step 4 = 20-21 (None)


def spans_of(tok, text, granularity, eos=False, **options):
    _, ids, lengths, mask = pack(tok, [text], [eos])
    seg = segment(ids, lengths, TokenTexts(tok), make_segmenter(granularity, step_separator=";", **options))
    return seg, mask


def test_token_granularity_by_hand(task, tok):
    p = task.make_problem("7+3*2-5=")
    seg, _ = spans_of(tok, WRONG, "token")
    assert seg.texts == [list(WRONG)]
    want = [1.0] * 6 + [0.0] * 7 + [None] * 9
    assert ORACLE.fn(task, p, WRONG, seg.texts[0]) == want
    # an eos after a final ';' is its own token: it takes the empty last step, judged wrong
    assert ORACLE.fn(task, p, "3*2=6;", list("3*2=6;") + [""]) == [1.0] * 6 + [0.0]


def test_segment_granularity_by_hand(task, tok):
    p = task.make_problem("7+3*2-5=")
    seg, _ = spans_of(tok, WRONG, "segment", segment_tokens=4)
    assert seg.texts == [["3*2=", "6;7+", "6=12", ";12-", "5=7;", "#7"]]
    # last characters: '=' (step 1), '+' (step 2), '2' (step 2), '-' (step 3), ';' (step 3), '7' (step 4)
    assert ORACLE.fn(task, p, WRONG, seg.texts[0]) == [1.0, 0.0, 0.0, None, None, None]


def test_key_token_granularity_by_hand_with_fallback(task, tok):
    p = task.make_problem("7+3*2-5=")
    seg, mask = spans_of(tok, WRONG, "key_token", eos=True)
    # key tokens: the first result character after each '=' (4, 10, 18); the eos (22) closes the rest
    assert seg.ends == [[4, 10, 18, 22]]
    assert seg.texts == [["3*2=6", ";7+6=1", "2;12-5=7", ";#7"]]
    res = score_batch(ORACLE, task, [p], [WRONG], seg.texts, granularity="key_token")
    assert res.scores == [[1.0, 0.0, None, None]]
    outcome = [float(task.check_outcome(p, WRONG))]
    rewards, placed = place(res.scores, end_mask=seg.end_mask, response_mask=mask, fallback=outcome)
    # the last span is unlabelled, so the outcome (0.0, wrong answer) lands on the last token
    assert placed.nonzero().squeeze(-1).tolist() == [[0, 4], [0, 10], [0, 22]]
    assert rewards[0, [4, 10, 22]].tolist() == [1.0, 0.0, 0.0]

    good = p.solution  # "3*2=6;7+6=13;13-5=8;#8"
    seg, mask = spans_of(tok, good, "key_token", eos=True)
    res = score_batch(ORACLE, task, [p], [good], seg.texts, granularity="key_token")
    assert seg.texts == [["3*2=6", ";7+6=1", "3;13-5=8", ";#8"]] and res.scores == [[1.0] * 4]
    rewards, placed = place(res.scores, end_mask=seg.end_mask, response_mask=mask, fallback=[0.5])
    assert placed.sum().item() == 4 and rewards[0, 22].item() == 1.0  # scored: the fallback is unused


# ----------------------------------------------------------------------------- consistency on random completions


@pytest.mark.parametrize(
    "granularity,options", [("segment", {"segment_tokens": k}) for k in (1, 3, 7)] + [("key_token", {})]
)
def test_every_span_takes_the_label_of_its_last_token(task, tok, granularity, options):
    """With one character per token, a span's label is the token-granularity label of its last
    token: labels come from the step holding the span's last character, whatever the cut."""
    problems, texts, _ = random_completions(task, 60, 11)
    eos = [False] * len(texts)  # an eos joins the previous span at these granularities
    _, ids, lengths, _ = pack(tok, texts, eos)
    texts_of = TokenTexts(tok)
    by_token = segment(ids, lengths, texts_of, make_segmenter("token"))
    seg = segment(ids, lengths, texts_of, make_segmenter(granularity, **options))
    tok_scores = score_batch(ORACLE, task, problems, texts, by_token.texts, granularity="token").scores
    span_scores = score_batch(ORACLE, task, problems, texts, seg.texts, granularity=granularity).scores
    for row_tok, row_span, ends in zip(tok_scores, span_scores, seg.ends):
        assert row_span == [row_tok[e] for e in ends]


@pytest.mark.parametrize("seed", range(2))
def test_token_labels_are_the_step_labels_spread_over_each_step(task, tok, seed):
    problems, texts, _ = random_completions(task, 40, 100 + seed)
    for p, text in zip(problems, texts):
        steps = split_steps(text, ";")
        if steps[-1] == "":
            steps.pop()
        labels = first_error_labels(task.check_steps(p, steps))
        expected = [lab for step, lab in zip(steps, labels) for _ in step]
        assert ORACLE.fn(task, p, text, list(text)) == expected


# ----------------------------------------------------------------------------- helpers and errors


def test_split_steps_and_first_error_labels():
    assert split_steps("a;b;", ";") == ["a;", "b;", ""]
    assert split_steps("a;;b", ";") == ["a;", ";", "b"]
    assert split_steps("", ";") == [""]
    assert split_steps("x||y", "||") == ["x||", "y"]
    assert first_error_labels([True, True, False, True, False]) == [1.0, 1.0, 0.0, None, None]
    assert first_error_labels([]) == []


class TwoCharSeparatorTask:
    """A step is right when it reads 'ok' (separator '||'): checks the character offsets."""

    name = "two_char"
    step_separator = "||"

    def check_outcome(self, problem, completion):
        return completion.endswith("ok")

    def check_steps(self, problem, segments):
        return [s.removesuffix("||") == "ok" for s in segments]


class NoStepsTask(TwoCharSeparatorTask):
    name = "no_steps"
    step_separator = None


def test_multi_character_separator_offsets(task):
    p = task.make_problem("1+1=")
    text = "ok||bad||ok"
    # steps "ok||" (1.0), "bad||" (0.0), "ok" (None)
    want = [1.0] * 4 + [0.0] * 5 + [None] * 2
    assert ORACLE.fn(TwoCharSeparatorTask(), p, text, list(text)) == want
    assert ORACLE.fn(TwoCharSeparatorTask(), p, text, ["ok|", "|ba", "d||o", "k"]) == [1.0, 0.0, None, None]


def test_task_without_separator_is_a_counted_error(task):
    p = task.make_problem("1+1=")
    res = score_batch(ORACLE, NoStepsTask(), [p], ["ok"], [["o", "k"]], granularity="token", on_error="zero")
    assert res.errors == 1 and res.scores == [[0.0, 0.0]]
    assert "task 'no_steps' has no step separator; oracle_steps needs steps" in res.first_error


def test_step_format_rewards_well_formed_steps_right_or_wrong() -> None:
    """The naive bonus of FINDINGS F4: syntax only, so a wrong or repeated step still pays."""
    from creditrl.rewards.sources import make_source

    task = make_task("arithmetic", min_ops=2, max_ops=2)
    problem = task.make_problem("7+3*2=")
    fn = make_source("step_format").fn
    right = ["3*2=6;", "7+6=13;", "#13"]
    assert fn(task, problem, "".join(right), right) == [1.0, 1.0, None]
    padded = ["3*2=6;", "3*2=6;", "1+1=5;", "-4-1=-5;", "7+=13;", "x;", "#99"]
    assert fn(task, problem, "".join(padded), padded) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, None]
    assert fn(task, problem, " ;", [" ;", ""]) == [None, None]
    assert task.check_steps(problem, [s.rstrip(";") for s in padded[:3]]) == [
        True,
        False,
        False,
    ]  # the oracle disagrees

    class NoPattern:
        name, step_separator = "plain", ";"

    with pytest.raises(ValueError, match="task 'plain' has no step_pattern"):
        fn(NoPattern(), problem, "a;", ["a;"])
