"""The toy translation and summarisation tasks, and two RL iterations with BLEU, chrF and ROUGE."""

import hashlib
import math

import pytest
import torch

from creditrl.config import load_config
from creditrl.tasks import Task, make_task
from creditrl.tasks.text import LEXICON, ToySummariseTask, ToyTranslateTask, split_sentences
from creditrl.train.rl import RLTrainer


def test_split_sentences():
    assert split_sentences("a b. c.") == ["a b.", "c."]
    assert split_sentences(" a.  b ") == ["a.", "b"]
    assert split_sentences("") == [] and split_sentences("a;b;", ";") == ["a;", "b;"]


@pytest.mark.parametrize("name", ["toy_translate", "toy_summarise"])
def test_problems_are_deterministic_split_by_hash_and_fit_the_tiny_model(name):
    task = make_task(name)
    assert isinstance(task, Task) and task.name == name and task.step_separator == "."
    for split in ("train", "heldout"):
        problems = task.sample(200, split=split, seed=1)
        assert problems == task.sample(200, split=split, seed=1) != task.sample(200, split=split, seed=2)
        for p in problems:
            held = int(hashlib.sha256(p.prompt.encode()).hexdigest(), 16) % 10 == 0
            assert held == (split == "heldout") and p.meta["split"] == split
            assert len(p.prompt) + len(p.answer) + 2 <= 160  # bos + prompt + answer + eos
            assert all(" " <= ch <= "~" for ch in p.prompt + p.answer)  # the char tokenizer's alphabet
            assert p.solution == p.answer and task.check_outcome(p, p.answer)


def test_translation_is_word_substitution_with_adjectives_after_nouns():
    assert ToyTranslateTask.translate("the red cat sees a dog.") == "lo kato rubo vidas un hundo."
    task = ToyTranslateTask(min_sentences=2, max_sentences=2)
    for p in task.sample(50, split="train", seed=0):
        assert p.prompt == f"translate: {p.meta['source']} = " and len(split_sentences(p.answer)) == 2
        assert p.answer == task.translate(p.meta["source"])
        assert set(p.answer.replace(".", "").split()) <= set(LEXICON.values())


def test_summary_is_the_template_of_facts_from_the_document():
    task = ToySummariseTask(distractors=2)
    for p in task.sample(50, split="train", seed=0):
        doc = p.meta["document"]
        assert p.prompt == f"{doc} Summary: " and len(split_sentences(doc)) == 5
        name, _, _, job, _, city = p.answer.split(".")[0].split()  # "{name} is a {job} in {city}"
        food = p.answer.split(".")[1].split()[-1]
        for fact in (f"{name} lives in {city}.", f"{name} works as a {job}.", f"{name} likes {food}."):
            assert fact in doc


@pytest.fixture
def two_sentences():
    task = ToyTranslateTask(min_sentences=2, max_sentences=2)
    return task, task.sample(1, split="train", seed=0)[0]


def test_outcome_is_exact_up_to_whitespace(two_sentences):
    task, p = two_sentences
    assert task.check_outcome(p, "  " + p.answer.replace(" ", "  ") + " ")
    assert not task.check_outcome(p, p.answer.removesuffix("."))
    assert not task.check_outcome(p, p.answer + " lo kato.")


def test_steps_are_sentences_aligned_by_index(two_sentences):
    task, p = two_sentences
    first, second = split_sentences(p.answer)
    # score-stage spans keep the "." (and the eos is a blank last span); str.split pieces do not
    assert task.check_steps(p, [first, " " + second, ""]) == [True, True, True]
    assert task.check_steps(p, p.answer.split(".")) == [True, True, True]
    assert task.check_steps(p, [second, " " + first]) == [False, False]
    assert task.check_steps(p, [first, ""]) == [True, False]  # stopped one sentence early
    assert task.check_steps(p, [first, " " + second, " lo kato.", ""]) == [True, True, False, False]
    assert task.check_steps(p, [first, " ", " " + second]) == [True, False, False]


def test_bad_arguments():
    with pytest.raises(ValueError, match="need 1 <= min_sentences <= max_sentences <= 2"):
        make_task("toy_translate", max_sentences=3)
    with pytest.raises(ValueError, match="distractors must lie in 0..2"):
        make_task("toy_summarise", distractors=3)
    with pytest.raises(ValueError, match="heldout_mod must be >= 2"):
        make_task("toy_translate", heldout_mod=1)


# ----------------------------------------------------------------------------- two RL iterations

TINY_RUN = [
    "train.init=policy",
    "rollout.prompts_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=16",
    "train.iterations=2",
    "train.eval_every=2",
    "train.eval_size=4",
    "train.checkpoint_every=2",
    "train.progress=false",
]


@pytest.mark.parametrize(
    "task, source, granularity",
    [("toy_translate", "bleu", "sequence"), ("toy_translate", "chrf", "step"), ("toy_summarise", "rouge", "sequence")],
)
def test_two_rl_iterations(tmp_path, task, source, granularity, scored_by):
    over = [
        f"task.name={task}",
        "task.args={min_sentences: 2}" if task == "toy_translate" else "task.args={}",
        f"reward.source={source}",
        f"reward.granularity={granularity}",
    ]
    trainer = RLTrainer.from_config(load_config(overrides=TINY_RUN + over), tmp_path / "run")
    history = trainer.run().history
    assert [r["iteration"] for r in history] == [0, 1, 2]
    n_sentences = 2  # both tasks' answers
    for row in history[1:]:
        assert row["reward/errors"] == 0 and row["reward/placed_per_response"] >= 1
        assert 0.0 <= row["reward/mean"] <= (1.0 if granularity == "sequence" else n_sentences)
        assert all(math.isfinite(v) for k, v in row.items() if k != "eval/correct")
    for row in (history[0], history[2]):
        assert 0.0 <= row["eval/accuracy"] <= 1.0 and 0.0 <= row["eval/step_accuracy"] <= 1.0
    # the same score stage on a perfect answer, a partial one and nothing
    p = trainer.parts.heldout[0]
    first = split_sentences(p.answer)[0]
    scored = scored_by(trainer, [p] * 3, [p.answer, first, ""])
    per_response = scored.rewards.sum(-1).tolist()
    assert per_response[0] == pytest.approx(1.0 if granularity == "sequence" else n_sentences)
    assert 0.0 < per_response[1] < per_response[0] and per_response[2] == 0.0
    placed = scored.rewards[scored.reward_mask]
    assert torch.isfinite(placed).all() and placed.min() >= 0.0 and placed.max() <= 1.0
    if granularity == "step":  # one score per sentence, on its "." (the eos after it gets none)
        assert scored.reward_mask[0].sum() == n_sentences and scored.reward_mask[2].sum() == 1
        dots = [i for i, ch in enumerate(p.answer) if ch == "."]
        assert scored.reward_mask[0].nonzero().flatten().tolist() == dots


@pytest.mark.parametrize("cls", [ToyTranslateTask, ToySummariseTask])
def test_the_answer_is_the_normalised_completion_and_agrees_with_the_outcome(cls):
    task = cls()
    for p in task.sample(8, split="train", seed=3):
        variants = ["  " + p.answer.replace(" ", "  \t") + " ", p.answer.removesuffix("."), "", "lo kato."]
        for c in variants:
            a = task.extract_answer(c)
            assert a == (" ".join(c.split()) or None)
            assert task.check_outcome(p, c) == (a is not None and task.same_answer(task.extract_answer(p.answer), a))
    assert task.same_answer("lo kato.", "lo kato.") and not task.same_answer("lo kato.", "lo kato")
