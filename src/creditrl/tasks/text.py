"""Toy text-generation tasks with references: translation and summarisation, generated here.

Both are self-written and deterministic, small enough for the tiny character model (printable
ASCII, one line, prompt + answer under 160 characters), and meant for the reference-based
rewards of :mod:`creditrl.rewards.text_metrics` (``bleu``, ``chrf``, ``rouge``):

``toy_translate``
    English sentences from a small grammar, ``DET [ADJ] NOUN VERB DET [ADJ] NOUN.``, into a
    made-up language by word substitution, with the adjective moved after its noun::

        "translate: the red cat sees a dog. = "  ->  "lo kato rubo vidas un hundo."

``toy_summarise``
    A short document of facts about a person, in shuffled order with distractor facts; the
    reference summary is a fixed two-sentence template of three of them::

        "Mia likes tea. It is cold in Oslo. Mia works as a baker. Mia lives in Oslo. Summary: "
        ->  "Mia is a baker in Oslo. Mia likes tea."

Every answer is a sequence of sentences ending in ``"."``, the step separator. The outcome is an
exact match of the answer up to whitespace; a step is correct when its words equal those of the
aligned answer sentence. Held-out problems are those whose prompt hashes to 0 modulo ``heldout_mod``.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any

from creditrl.tasks.base import SPLITS, Drawn, Problem, draw_problems, hash_split, register_task

__all__ = ["SPLITS", "LEXICON", "ToyTranslateTask", "ToySummariseTask", "split_sentences"]

# A draw that finds no problem of the split in this many tries means the split is empty.
_MAX_CONSECUTIVE_MISSES = 10_000

_DETERMINERS = dict(the="lo", a="un")
_ADJECTIVES = dict(red="rubo", big="grando", small="eta", tall="alta", happy="gaja", green="verda")
_NOUNS = dict(cat="kato", dog="hundo", bird="birdo", fish="fiso", man="viro", girl="knabino", tree="arbo", house="domo")
_VERBS = dict(sees="vidas", likes="amas", finds="trovas", eats="mangas", helps="helpas", follows="sekvas")

LEXICON: dict[str, str] = {**_DETERMINERS, **_ADJECTIVES, **_NOUNS, **_VERBS}
"""English -> made-up word of ``toy_translate``."""

_NAMES = ("Mia", "Ben", "Ana", "Tom", "Eva", "Sam", "Leo", "Ivy")
_CITIES = ("Oslo", "Rome", "Lima", "Kyiv", "Doha", "Bern")
_JOBS = ("baker", "nurse", "pilot", "farmer", "singer", "judge")
_FOODS = ("tea", "soup", "rice", "figs", "plums", "bread")
_PETS = ("cats", "dogs", "birds", "fish")
_COUNTS = ("two", "three", "four")
_WEATHER = ("cold", "warm", "wet", "dry")


def split_sentences(text: str, separator: str = ".") -> list[str]:
    """Cut ``text`` after every ``separator``; each sentence keeps it, whitespace is stripped
    and empty pieces are dropped: ``"a b. c."`` -> ``["a b.", "c."]``, ``"a. b"`` -> ``["a.", "b"]``."""
    *ended, rest = text.split(separator)
    return [s for s in (p.strip() for p in [*(e + separator for e in ended), rest]) if s]


def _words(text: str, separator: str) -> list[str]:
    """A sentence's words, its trailing separator and surrounding whitespace ignored."""
    return text.strip().removesuffix(separator).split()


class _SentenceTask(ABC):
    """What both toy tasks share: sampling by hash split, exact outcome, per-sentence steps."""

    name: str = ""
    step_separator: str | None = "."

    def __init__(self, heldout_mod: int) -> None:
        if heldout_mod < 2:
            raise ValueError(f"heldout_mod must be >= 2, got {heldout_mod}")
        self.heldout_mod = heldout_mod

    @abstractmethod
    def _draw(self, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        """One random ``(prompt, answer, meta)`` (each toy task draws its own)."""

    def split_of(self, prompt: str) -> str:
        """``"heldout"`` iff ``int(sha256(prompt).hexdigest(), 16) % heldout_mod == 0``, else ``"train"``."""
        return hash_split(prompt, self.heldout_mod)

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split``, deterministic in ``(split, seed)`` (duplicates may occur);
        ValueError for an unknown ``split`` or ``n < 0``."""

        def draw(rng: random.Random) -> Drawn:
            prompt, answer, meta = self._draw(rng)
            return prompt, lambda: Problem(prompt=prompt, answer=answer, solution=answer, meta={**meta, "split": split})

        return draw_problems(
            n,
            split=split,
            seed=seed,
            namespace=self.name,
            draw=draw,
            split_of=self.split_of,
            max_misses=_MAX_CONSECUTIVE_MISSES,
        )

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Whether ``completion`` equals ``problem.answer`` up to whitespace (``str.split``)."""
        return completion.split() == problem.answer.split()

    def extract_answer(self, completion: str) -> str | None:
        """The whole completion is the answer, its whitespace normalised (what :meth:`check_outcome`
        compares); None when it is empty."""
        return " ".join(completion.split()) or None

    def same_answer(self, a: str, b: str) -> bool:
        """Answers are whitespace-normalised texts, the same when equal: ``check_outcome(p, c)`` is
        ``same_answer(extract_answer(p.answer), extract_answer(c))``."""
        return a == b

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """One label per segment (a sentence, with or without its ``"."``), aligned by index.

        Segment ``k`` is correct iff its words (the trailing ``"."`` and whitespace ignored)
        equal those of answer sentence ``k``; segments past the answer's sentences are wrong.
        An empty (whitespace) segment is correct only as the last one and right after as many
        segments as the answer has sentences: the completion stopped where the answer does.
        """
        sep = self.step_separator or "."
        targets = [_words(s, sep) for s in split_sentences(problem.answer, sep)]
        labels = []
        for k, segment in enumerate(segments):
            words = _words(segment, sep)
            if not words:
                labels.append(k == len(segments) - 1 and k == len(targets))
            else:
                labels.append(k < len(targets) and words == targets[k])
        return labels


@register_task("toy_translate")
class ToyTranslateTask(_SentenceTask):
    """English -> made-up language by word substitution (registry name ``"toy_translate"``).

    Args:
        min_sentences, max_sentences: Sentences per problem (1 <= min <= max <= 2: longer
            prompts outgrow the tiny model's 160 positions).
        adjective_prob: Chance that a noun gets an adjective.
        heldout_mod: About 1 in ``heldout_mod`` prompts is held out (>= 2).
    """

    name = "toy_translate"

    def __init__(
        self, min_sentences: int = 1, max_sentences: int = 2, adjective_prob: float = 0.5, heldout_mod: int = 10
    ) -> None:
        super().__init__(heldout_mod)
        if not 1 <= min_sentences <= max_sentences <= 2:
            raise ValueError(f"need 1 <= min_sentences <= max_sentences <= 2, got {min_sentences}, {max_sentences}")
        if not 0.0 <= adjective_prob <= 1.0:
            raise ValueError(f"adjective_prob must lie in [0, 1], got {adjective_prob}")
        self.min_sentences, self.max_sentences, self.adjective_prob = min_sentences, max_sentences, adjective_prob

    def _phrase(self, rng: random.Random) -> tuple[list[str], list[str]]:
        det, noun = rng.choice(tuple(_DETERMINERS)), rng.choice(tuple(_NOUNS))
        adj = [rng.choice(tuple(_ADJECTIVES))] if rng.random() < self.adjective_prob else []
        return [det, *adj, noun], [LEXICON[det], LEXICON[noun], *(LEXICON[a] for a in adj)]

    def _draw(self, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        sources, targets = [], []
        for _ in range(rng.randint(self.min_sentences, self.max_sentences)):
            (subj_en, subj_xx), verb, (obj_en, obj_xx) = self._phrase(rng), rng.choice(tuple(_VERBS)), self._phrase(rng)
            sources.append(" ".join([*subj_en, verb, *obj_en]) + ".")
            targets.append(" ".join([*subj_xx, LEXICON[verb], *obj_xx]) + ".")
        source = " ".join(sources)
        return f"translate: {source} = ", " ".join(targets), {"source": source, "n_sentences": len(sources)}

    @staticmethod
    def translate(english: str) -> str:
        """The reference translation of an English text of this grammar (sentences ending in ``"."``).

        Raises:
            KeyError: For a word outside :data:`LEXICON`.
        """
        out = []
        for sentence in split_sentences(english):
            words = sentence.removesuffix(".").split()
            xx: list[str] = []
            i = 0
            while i < len(words):
                if words[i] in _ADJECTIVES and i + 1 < len(words):  # adjective after its noun
                    xx += [LEXICON[words[i + 1]], LEXICON[words[i]]]
                    i += 2
                else:
                    xx.append(LEXICON[words[i]])
                    i += 1
            out.append(" ".join(xx) + ".")
        return " ".join(out)


@register_task("toy_summarise")
class ToySummariseTask(_SentenceTask):
    """Summarise a short document of facts into a template (registry name ``"toy_summarise"``).

    The document states where the person lives, their job and a food they like, plus
    ``distractors`` facts from {pets, weather}, in shuffled order; the reference summary is
    ``"{name} is a {job} in {city}. {name} likes {food}."``.

    Args:
        distractors: Distractor sentences per document (0 to 2).
        heldout_mod: About 1 in ``heldout_mod`` prompts is held out (>= 2).
    """

    name = "toy_summarise"

    def __init__(self, distractors: int = 1, heldout_mod: int = 10) -> None:
        super().__init__(heldout_mod)
        if not 0 <= distractors <= 2:
            raise ValueError(f"distractors must lie in 0..2, got {distractors}")
        self.distractors = distractors

    def _draw(self, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        name, city, job, food = rng.choice(_NAMES), rng.choice(_CITIES), rng.choice(_JOBS), rng.choice(_FOODS)
        facts = [f"{name} lives in {city}.", f"{name} works as a {job}.", f"{name} likes {food}."]
        extra = [f"{name} has {rng.choice(_COUNTS)} {rng.choice(_PETS)}.", f"It is {rng.choice(_WEATHER)} in {city}."]
        sentences = facts + rng.sample(extra, self.distractors)
        rng.shuffle(sentences)
        document = " ".join(sentences)
        summary = f"{name} is a {job} in {city}. {name} likes {food}."
        return f"{document} Summary: ", summary, {"document": document}
