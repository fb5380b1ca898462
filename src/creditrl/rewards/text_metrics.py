"""Reference-based text rewards: BLEU and chrF (sacrebleu), ROUGE (rouge-score), all in [0, 1].

Three reward sources score a response against the problem's references, ``problem.meta
["references"]`` (a list of strings) when the task gives several, else ``[problem.answer]``:

* ``bleu``: sentence BLEU / 100, ``sacrebleu.metrics.BLEU(effective_order=True)
  .sentence_score`` (13a tokens, exponential smoothing, n-grams up to 4, orders without any
  n-gram of the hypothesis skipped);
* ``chrf``: chrF / 100, ``sacrebleu.metrics.CHRF().sentence_score`` (character 6-grams, beta 2);
* ``rouge``: mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures of
  ``rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)``; with several
  references the best per measure (``score_multi``).

Granularities: ``sequence`` (default: the whole response against the whole references), and
``step`` / ``segment`` where the spans are sentences (the task's step separator, or a
``reward.cut_fn`` that cuts sentences; fixed K-token blocks align poorly). Alignment rule: the
references are cut into sentences after each separator (the task's ``step_separator``, else
``"."``) and the spans with text numbered 0, 1, ...; span ``j`` is scored against sentence ``j``
of every reference that has one, and the LAST span with text against the rest of each reference
(sentences ``j, j+1, ...`` joined), so a response that stops early pays on its last sentence. A
span past every reference's sentences scores 0.0; a whitespace-only span (the end-of-sequence
token after a final ``"."``) gets ``None``; a single span is scored as at ``sequence``.

No downloads are needed: sacrebleu's 13a tokenizer is built in, and rouge-score tokenises with a
regular expression and stems with NLTK's Porter stemmer, which has no data files.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from sacrebleu.metrics import BLEU, CHRF

from creditrl.rewards.sources import register_source
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.text import split_sentences

__all__ = ["ROUGE_TYPES", "bleu", "chrf", "rouge", "references_of", "aligned_scores"]

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
_GRANULARITIES = ("sequence", "step", "segment")
Metric = Callable[[str, Sequence[str]], float]  # (hypothesis, references) -> score in [0, 1]


@functools.cache
def _bleu() -> BLEU:
    # force=True: raw model output that ends in " ." is not "forgotten detokenisation"
    return BLEU(effective_order=True, force=True)


@functools.cache
def _chrf() -> CHRF:
    return CHRF()


@functools.cache
def _rouge():
    # imported here: rouge_score imports absl, whose logging handler binds the stderr of the moment
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def _unit(x: float) -> float:
    """Clamp into [0, 1] (sacrebleu's perfect BLEU is 100.00000000000004)."""
    return min(1.0, max(0.0, x))


def bleu(hypothesis: str, references: Sequence[str]) -> float:
    """Sentence BLEU of ``hypothesis`` against ``references``, divided by 100, in [0, 1]."""
    return _unit(_bleu().sentence_score(hypothesis, list(references)).score / 100.0)


def chrf(hypothesis: str, references: Sequence[str]) -> float:
    """Sentence chrF of ``hypothesis`` against ``references``, divided by 100, in [0, 1]."""
    return _unit(_chrf().sentence_score(hypothesis, list(references)).score / 100.0)


def rouge(hypothesis: str, references: Sequence[str]) -> float:
    """Mean F-measure of ROUGE-1, ROUGE-2 and ROUGE-L (stemmed), best reference per measure."""
    if not references:
        raise ValueError("rouge needs at least one reference")
    scores = _rouge().score_multi(list(references), hypothesis)  # (targets, prediction)
    return _unit(sum(scores[t].fmeasure for t in ROUGE_TYPES) / len(ROUGE_TYPES))


def references_of(problem: Problem) -> list[str]:
    """``problem.meta["references"]`` when present, else ``[problem.answer]``."""
    refs = problem.meta.get("references")
    if refs is None:
        return [problem.answer]
    if isinstance(refs, str) or not refs or not all(isinstance(r, str) for r in refs):
        raise ValueError(f"meta['references'] must be a non-empty list of strings, got {refs!r}")
    return list(refs)


def aligned_scores(
    metric: Metric, spans: Sequence[str], references: Sequence[str], separator: str = "."
) -> list[float | None]:
    """One score per span by the alignment rule of the module docstring."""
    if len(spans) == 1:
        return [metric(spans[0], references)]
    sentences = [split_sentences(r, separator) for r in references]
    texts = [s.strip() for s in spans]
    filled = [k for k, t in enumerate(texts) if t]
    out: list[float | None] = [None] * len(spans)
    if not filled:
        out[-1] = metric("", references)
        return out
    for j, k in enumerate(filled):
        last = j == len(filled) - 1
        aligned = [" ".join(s[j:]) if last else s[j] for s in sentences if len(s) > j]
        out[k] = metric(texts[k], aligned) if aligned else 0.0
    return out


def _metric_reward(
    metric: Metric, task: Task, problem: Problem, completion: str, spans: Sequence[str]
) -> list[float | None]:
    """``metric`` against the problem's references, one score per span (module docstring)."""
    return aligned_scores(metric, spans, references_of(problem), getattr(task, "step_separator", None) or ".")


for _metric in (bleu, chrf, rouge):
    register_source(_metric.__name__, granularities=_GRANULARITIES, default="sequence")(
        functools.partial(_metric_reward, _metric)
    )
