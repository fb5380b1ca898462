"""The shared draw loop of the generated tasks (creditrl.tasks.base.draw_problems)."""

from __future__ import annotations

import pytest

from creditrl.tasks.base import Problem, draw_problems, hash_split, stream_rng


def _draw_numbers(made: list[str]):
    def draw(rng):
        k = rng.randrange(10)
        if k == 0:
            return None  # the generator rejects this draw

        def make() -> Problem:
            made.append(str(k))
            return Problem(prompt=str(k), answer=str(k), solution=str(k))

        return str(k), make

    return draw


def test_only_kept_prompts_are_made_and_the_stream_is_the_namespaced_one() -> None:
    made: list[str] = []
    odd = lambda p: "train" if int(p) % 2 else "heldout"  # noqa: E731
    got = draw_problems(20, split="train", seed=3, namespace="t", draw=_draw_numbers(made), split_of=odd, max_misses=50)
    assert [p.prompt for p in got] == made and len(made) == 20 and all(int(k) % 2 for k in made)
    rng = stream_rng("t", "train", 3)
    want = [k for k in (rng.randrange(10) for _ in range(200)) if k % 2][:20]
    assert [int(k) for k in made] == want  # rejected and other-split draws consume the stream, in order
    again = draw_problems(20, split="train", seed=3, namespace="t", draw=_draw_numbers([]), split_of=odd, max_misses=50)
    assert again == got
    other = draw_problems(20, split="train", seed=3, namespace="u", draw=_draw_numbers([]), split_of=odd, max_misses=50)
    assert other != got


def test_too_many_misses_name_the_split_and_the_space() -> None:
    never = lambda p: "train"  # noqa: E731
    with pytest.raises(ValueError, match=r"^no 'heldout' problem in 7 consecutive draws for this space$"):
        draw_problems(
            1,
            split="heldout",
            seed=0,
            namespace="t",
            draw=_draw_numbers([]),
            split_of=never,
            max_misses=7,
            space=" for this space",
        )
    with pytest.raises(ValueError, match="unknown split 'test'; valid splits: train, heldout"):
        draw_problems(1, split="test", seed=0, namespace="t", draw=_draw_numbers([]), split_of=never, max_misses=7)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        draw_problems(-1, split="train", seed=0, namespace="t", draw=_draw_numbers([]), split_of=never, max_misses=7)


def test_distinct_draws_skip_repeats_and_keep_the_plain_prefix() -> None:
    odd = lambda p: "train" if int(p) % 2 else "heldout"  # noqa: E731
    plain = draw_problems(8, split="train", seed=3, namespace="t", draw=_draw_numbers([]), split_of=odd, max_misses=50)
    got = draw_problems(
        5, split="train", seed=3, namespace="t", draw=_draw_numbers([]), split_of=odd, max_misses=50, distinct=True
    )
    prompts = [p.prompt for p in got]
    assert sorted(prompts) == ["1", "3", "5", "7", "9"]  # every odd digit once: the whole train split
    first_repeat = next(i for i, p in enumerate(plain) if p.prompt in {q.prompt for q in plain[:i]})
    assert prompts[:first_repeat] == [p.prompt for p in plain[:first_repeat]]
    with pytest.raises(
        ValueError,
        match=r"^only 5 distinct 'train' problems found \(6 asked for; 50 consecutive draws without a new one\) in t$",
    ):
        draw_problems(
            6,
            split="train",
            seed=3,
            namespace="t",
            draw=_draw_numbers([]),
            split_of=odd,
            max_misses=50,
            space=" in t",
            distinct=True,
        )


def test_hash_split_is_the_sha256_rule() -> None:
    import hashlib

    for prompt in ("1+1=", "31~040=", "ab,bc|a>c=", "x"):
        for mod in (2, 5, 10):
            held = int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % mod == 0
            assert hash_split(prompt, mod) == ("heldout" if held else "train")
