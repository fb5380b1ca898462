"""BLEU, chrF and ROUGE reward sources: values against the libraries, the [0, 1] scale, the
sentence alignment rule, and placement on each sentence's last token."""

import math
import os
import subprocess
import sys

import pytest
import torch
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU, CHRF

from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rewards import REWARD_SOURCES, make_segmenter, place, score_batch
from creditrl.rewards.text_metrics import aligned_scores, bleu, chrf, references_of, rouge
from creditrl.rollout.segment import TokenTexts, segment
from creditrl.tasks import Problem, make_task

METRICS = {"bleu": bleu, "chrf": chrf, "rouge": rouge}
PAIRS = [
    ("the cat sat on the mat.", ["the cat sat on the mat."]),
    ("the cat sat on a mat.", ["the cat sat on the mat."]),
    ("a dog", ["the cat sat on the mat."]),
    ("lo kato rubo vidas un hundo.", ["lo kato rubo vidas un hundo.", "un kato"]),
    ("", ["lo kato."]),
    ("zzz qqq", ["lo kato."]),
]


@pytest.mark.parametrize("hyp, refs", PAIRS)
def test_bleu_and_chrf_are_sacrebleus_sentence_scores_over_100(hyp, refs):
    assert bleu(hyp, refs) == pytest.approx(min(1.0, BLEU(effective_order=True).sentence_score(hyp, refs).score / 100))
    assert chrf(hyp, refs) == pytest.approx(CHRF().sentence_score(hyp, refs).score / 100)


@pytest.mark.parametrize("hyp, refs", PAIRS)
def test_rouge_is_the_mean_f_measure_of_rouge1_rouge2_rougel(hyp, refs):
    scores = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score_multi(refs, hyp)
    assert rouge(hyp, refs) == pytest.approx(sum(s.fmeasure for s in scores.values()) / 3)


def test_rouge_by_hand():
    # unigrams 2 of 3 (F 2/3), bigrams "the cat" 1 of 2 (F 1/2), LCS 2 of 3 (F 2/3)
    assert rouge("the cat sat", ["the cat ran"]) == pytest.approx((2 / 3 + 1 / 2 + 2 / 3) / 3)
    assert rouge("the cats are sitting", ["the cat is sitting"]) > rouge("a dog", ["the cat is sitting"])  # stemmed


@pytest.mark.parametrize("name", sorted(METRICS))
def test_range_identity_and_disjoint(name):
    metric = METRICS[name]
    assert metric("lo kato rubo vidas un hundo.", ["lo kato rubo vidas un hundo."]) == 1.0  # BLEU is 100.00000000000004
    assert metric("", ["lo kato rubo vidas un hundo."]) == 0.0
    for hyp, refs in PAIRS:
        assert 0.0 <= metric(hyp, refs) <= 1.0
    assert metric("the cat sat on a mat.", ["the cat sat on the mat."]) > metric("a dog.", ["the cat sat on the mat."])


def test_several_references_take_the_best_match():
    problem = Problem("p", "un hundo.", "un hundo.", meta={"references": ["lo kato vidas.", "lo kato amas."]})
    assert references_of(problem) == ["lo kato vidas.", "lo kato amas."]
    assert references_of(Problem("p", "un hundo.", "un hundo.")) == ["un hundo."]
    for metric in METRICS.values():
        assert metric("lo kato amas.", references_of(problem)) == 1.0
    with pytest.raises(ValueError, match="non-empty list of strings"):
        references_of(Problem("p", "a", "a", meta={"references": "lo kato."}))


def test_sources_are_registered_for_sequences_and_sentence_spans():
    for name in METRICS:
        source = REWARD_SOURCES[name]
        assert source.granularities == {"sequence", "step", "segment"} and source.default_granularity == "sequence"


# ----------------------------------------------------------------------------- alignment rule

REF = "lo kato vidas. un hundo amas. lo viro helpas."


def test_sentence_spans_align_with_reference_sentences():
    spans = ["lo kato vidas.", " un hundo amas.", " lo viro helpas.", ""]  # "" = the eos token after the last "."
    assert aligned_scores(bleu, spans, [REF]) == [1.0, 1.0, 1.0, None]
    wrong_second = aligned_scores(chrf, ["lo kato vidas.", " un viro amas.", " lo viro helpas."], [REF])
    assert wrong_second[0] == 1.0 and wrong_second[2] == 1.0 and 0.0 < wrong_second[1] < 1.0


def test_the_last_sentence_pays_for_stopping_early():
    # the last span with text is scored against the rest of the reference, sentences 1 and 2 joined
    scores = aligned_scores(chrf, ["lo kato vidas.", " un hundo amas.", ""], [REF])
    assert scores[0] == 1.0 and scores[2] is None
    assert scores[1] == pytest.approx(chrf("un hundo amas.", ["un hundo amas. lo viro helpas."])) and scores[1] < 1.0


def test_sentences_past_the_reference_score_zero_and_blank_spans_nothing():
    scores = aligned_scores(rouge, ["lo kato vidas.", "  ", " un hundo amas.", " lo viro helpas.", " lo kato."], [REF])
    assert scores == [1.0, None, 1.0, 1.0, 0.0]
    assert aligned_scores(bleu, ["", " "], [REF]) == [None, 0.0]  # nothing written: the last span scores ""


def test_one_span_is_the_whole_response_against_the_whole_references():
    text = "lo kato vidas. un hundo amas."
    for metric in METRICS.values():
        assert aligned_scores(metric, [text], [REF]) == [metric(text, [REF])]


def test_several_references_are_cut_into_sentences_each():
    refs = ["lo kato vidas. un hundo amas.", "lo kato amas."]
    # sentence 1 exists only in the first reference; the last span is scored against each rest
    assert aligned_scores(bleu, ["lo kato amas.", " un hundo amas."], refs) == [1.0, 1.0]


# ----------------------------------------------------------------------------- in the score stage


def test_step_scores_land_on_each_sentence_end_token():
    task = make_task("toy_translate")
    tok = build_char_tokenizer()
    problem = Problem("translate: x = ", "lo kato vidas. un hundo amas.", "lo kato vidas. un hundo amas.")
    completions = ["lo kato vidas. un viro amas.", "lo kato vidas."]
    rows = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    seg = segment(ids, lengths, TokenTexts(tok), make_segmenter("step", step_separator=task.step_separator))
    assert seg.texts[0] == ["lo kato vidas.", " un viro amas.", ""]
    result = score_batch(REWARD_SOURCES["bleu"], task, [problem] * 2, completions, seg.texts, granularity="step")
    assert result.errors == 0
    rewards, reward_mask = place(result.scores, end_mask=seg.end_mask, response_mask=mask)
    periods = [[i for i, ch in enumerate(c) if ch == "."] for c in completions]
    for b in range(2):
        assert reward_mask[b].nonzero().flatten().tolist() == periods[b]  # not on the eos: its span is blank
    assert rewards[0, periods[0][0]] == 1.0 and 0.0 < rewards[0, periods[0][1]] < 1.0
    assert rewards[1, periods[1][0]] < 1.0  # stopped after one of two sentences
    assert torch.isfinite(rewards).all() and rewards.min() >= 0.0 and rewards.max() <= 1.0


def test_sequence_scores_every_completion_once():
    task = make_task("toy_summarise")
    problems = task.sample(3, split="train", seed=0)
    completions = [problems[0].answer, "", "zz"]
    for name in METRICS:
        result = score_batch(REWARD_SOURCES[name], task, problems, completions, [[c] for c in completions])
        assert result.scores[0] == [1.0] and result.scores[1] == [0.0]
        assert all(len(s) == 1 and 0.0 <= s[0] <= 1.0 and math.isfinite(s[0]) for s in result.scores)


def test_rouge_needs_no_nltk_data(tmp_path):
    empty = tmp_path / "nltk_data"
    empty.mkdir()
    env = {**os.environ, "NLTK_DATA": str(empty), "HOME": str(tmp_path)}
    code = (
        "from rouge_score import rouge_scorer; "
        "s = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=True); "
        "print(s.score('a cat runs', 'the cats are running')['rouge1'].fmeasure)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == pytest.approx(4 / 7)  # "cat", "run" match once stemmed: P 2/4, R 2/3
