"""Tests for the chain task's sparse-regime options: the whole-solution outcome (``outcome="steps"``)
and the held-out split by state cycle (``heldout="cycle"``), whose held-out computations never
occur in training."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from creditrl.errors import ConfigError
from creditrl.tasks import chain
from creditrl.tasks.arithmetic import split_completion
from creditrl.tasks.chain import ChainConfig, ChainTask, chain_steps, state_cycles, step_operator
from creditrl.train.resolve import build_task

ANSWER = ChainTask()  # modulus 5, the last three values
STEPS = ChainTask(outcome="steps")
P3 = STEPS.make_problem("31~003=")  # 003:3+1=4; 002:1+4=0; 001:4+0=4; answer 404
# The sparse setting of grids/c1_chain_sparse.yaml and the SFT start it trains from.
SPARSE = {"modulus": 10, "heldout_mod": 5, "heldout": "cycle", "outcome": "steps"}
RL = ChainTask(min_steps=51, max_steps=79, distinct_heldout=True, **SPARSE)
SFT = ChainTask(min_steps=1, max_steps=99, **SPARSE)


def test_defaults_keep_the_committed_behaviour() -> None:
    assert (ChainConfig().outcome, ChainConfig().heldout) == ("answer", "prompt")
    wrong_step = "003:3+1=0;002:1+0=1;#404"  # a wrong value, then the right last three values
    assert ANSWER.check_outcome(P3, wrong_step) and ANSWER.first_error(P3, wrong_step) == "correct"
    assert ANSWER.check_outcome(P3, "#404")
    assert ANSWER.split_of("31~025=") == chain.hash_split("31~025=", 10)


@pytest.mark.parametrize(
    ("completion", "right"),
    [
        ("003:3+1=4;002:1+4=0;001:4+0=4;#404", True),
        (" 003:3+1=4 ; 002:1+4=0;\t001:4+0=4 ;#404 \n", True),  # whitespace around segments, as the steps
        ("003:3+1=4;002:1+4=0;001:4+0=4; #404", False),  # a blank segment before the answer, a wrong step
        ("003:3+1=0;002:1+0=1;#404", False),  # the right answer after wrong steps
        ("003:3+1=4;002:1+4=1;001:4+0=4;#404", False),  # one wrong value in the middle
        ("#404", False),  # the answer alone
        ("003:3+1=4;001:4+0=4;#404", False),  # a skipped step
        ("003:3+1=4;002:1+4=0;001:4+0=4;000:0+4=4;#404", False),  # one step too many
        ("003:3+1=4;002:1+4=0;001:4+0=4;#404;", False),  # text after the answer
        ("003:3+1=4;002:1+4=0;001:4+0=4;#404;#404", False),
        ("003:3+1=4;002:1+4=0;001:4+0=4;#440", False),
        ("003:3+1=4;002:1+4=0;001:4+0=4", False),  # no answer
        ("003:3+1=4;002:1+4=0;001:4+0=4;;#404", False),  # an empty segment
        ("", False),
    ],
)
def test_the_steps_outcome_checks_every_step_and_the_answer(completion: str, right: bool) -> None:
    assert STEPS.check_outcome(P3, completion) is right
    assert STEPS.check_steps(P3, split_completion(completion)) == ANSWER.check_steps(P3, split_completion(completion))
    assert STEPS.extract_answer(completion) == ANSWER.extract_answer(completion)  # votes: the stated answer


def test_first_error_under_the_steps_outcome_names_the_wrong_step() -> None:
    assert STEPS.first_error(P3, P3.solution) == "correct"
    assert STEPS.first_error(P3, "003:3+1=0;002:1+0=1;#404") == "wrong_value"  # "correct" under "answer"
    assert STEPS.first_error(P3, "003:3+1=4;002:4+1=0;001:1+0=1;#404") == "wrong_copy"
    assert STEPS.first_error(P3, "003:3+1=4;002:1+4=0;001:4+0=4;#440") == "wrong_answer"


def test_the_steps_outcome_is_every_label_right_under_corruption() -> None:
    rng = random.Random(3)
    answer_only = 0
    for problem in SFT.sample(400, split="train", seed=11):
        chars = list(problem.solution)
        for _ in range(rng.randint(0, 2)):
            chars[rng.randrange(len(chars))] = rng.choice("0123456789+-:=;#")
        completion = "".join(chars)
        labels = SFT.label_completion(problem, completion)
        full = SFT.check_outcome(problem, completion)
        assert full is (len(labels) == problem.meta["n_ops"] + 1 and all(labels))
        last_three = SFT._answer_right(problem, completion)
        assert not full or last_three  # the whole solution right implies its answer right
        answer_only += last_three and not full
    assert answer_only > 0  # corruptions the last-three-values check lets through exist


@pytest.mark.parametrize("modulus", range(2, 11))
def test_state_cycles_partition_the_states_and_chains_stay_on_theirs(modulus: int) -> None:
    cycles = state_cycles(modulus)
    assert len(cycles) == 10 * modulus**2
    assert all(least <= state and cycles[least] == least for state, least in cycles.items())
    rng = random.Random(modulus)
    for _ in range(50):
        a, b, n = rng.randrange(modulus), rng.randrange(modulus), rng.randint(1, 150)
        steps, _ = chain_steps(f"{a}{b}~{n:03d}=", modulus)
        states = [(int(s[4]), int(s[6]), int(s[:3]) % 10) for s in steps]
        assert {cycles[s] for s in states} == {cycles[(a, b, n % 10)]}


def test_mod_10_has_25_cycles_of_10_states_and_25_of_30() -> None:
    sizes = Counter(Counter(state_cycles(10).values()).values())
    assert sizes == {10: 25, 30: 25}
    assert set(Counter(state_cycles(5).values()).values()) == {10}  # mod 5: every chain repeats every 10 steps


def test_the_cycle_split_of_the_sparse_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    cycles = state_cycles(10)
    prompt_of = {least: f"{least[0]}{least[1]}~{least[2] or 10:03d}=" for least in set(cycles.values())}
    held = {least for least, prompt in prompt_of.items() if RL.split_of(prompt) == "heldout"}
    assert len(held) == 9 and sum(cycles[s] in held for s in cycles) == 210  # 21% of the 1,000 states
    for n in (1, 10, 51, 79, 99, 555):  # 21 of the 100 prompts of every length
        assert sum(RL.split_of(f"{a}{b}~{n:03d}=") == "heldout" for a in range(10) for b in range(10)) == 21
    prompts = [f"{a}{b}~{n:03d}=" for a in range(10) for b in range(10) for n in range(1, 100)]
    assert all(RL.split_of(p) == SFT.split_of(p) for p in prompts)  # the split ignores the band and outcome
    trained = {(a, b, step_operator(k)) for (a, b, k), least in cycles.items() if least not in held}
    assert len(trained) == 200  # every fact a op b occurs in training
    heldout = RL.sample(609, split="heldout", seed=0)
    assert len({p.prompt for p in heldout}) == 609 == 21 * 29  # the band's distinct held-out prompts
    monkeypatch.setattr(chain, "_MAX_CONSECUTIVE_MISSES", 5000)
    with pytest.raises(ValueError, match="only 609 distinct 'heldout' problems found"):
        RL.sample(610, split="heldout", seed=0)


def _computations(problems: list) -> list[tuple[str, str]]:
    """Each problem's steps with their counters, and without them (``3+1=4;1+4=5;...``)."""
    out = []
    for p in problems:
        steps, _ = chain_steps(p.prompt, 10)
        out.append((";" + ";".join(steps) + ";", ";" + ";".join(s[4:] for s in steps) + ";"))
    return out


def _contained(heldout: list, train: list) -> tuple[int, int]:
    """How many held-out chains occur in a training chain: as a contiguous run of steps with their
    counters, and as one of steps without counters (so at any offset of the operator pattern)."""
    train_text = [c for pair in _computations(train) for c in pair]
    with_counters = "|".join(train_text[0::2])
    without = "|".join(train_text[1::2])
    held = _computations(heldout)
    return sum(w in with_counters for w, _ in held), sum(o in without for _, o in held)


def _states(prompt: str) -> set[tuple[int, int, int]]:
    steps, _ = chain_steps(prompt, 10)
    return {(int(s[4]), int(s[6]), int(s[:3]) % 10) for s in steps}


def test_no_heldout_computation_occurs_in_a_training_chain() -> None:
    heldout = RL.sample(609, split="heldout", seed=0)  # every held-out prompt of the band
    train = SFT.sample(2000, split="train", seed=0) + RL.sample(1000, split="train", seed=0)
    assert _contained(heldout, train) == (0, 0)
    # Exhaustively: no state of a held-out chain is a state of any training chain of 1-99 steps.
    cycles = state_cycles(10)
    train_states, held_states = set(), set()
    for a in range(10):
        for b in range(10):
            for n in range(1, 100):
                prompt = f"{a}{b}~{n:03d}="
                (held_states if SFT.split_of(prompt) == "heldout" else train_states).update(_states(prompt))
    assert held_states and train_states.isdisjoint(held_states)
    assert {cycles[s] for s in held_states}.isdisjoint({cycles[s] for s in train_states})


UNSEEN = ChainTask(min_steps=51, max_steps=79, distinct_heldout=True, train_unseen=True, **SPARSE)


def test_train_unseen_halves_the_cycles_sft_never_saw() -> None:
    prompts = [f"{a}{b}~{n:03d}=" for a in range(10) for b in range(10) for n in range(1, 100)]
    for p in prompts:  # the two RL splits are the SFT's held-out prompts, the rest is neither
        assert (UNSEEN.split_of(p) == "seen") is (SFT.split_of(p) == "train")
    band = [f"{a}{b}~{n:03d}=" for a in range(10) for b in range(10) for n in range(51, 80)]
    assert Counter(UNSEEN.split_of(p) for p in band) == {"seen": 2291, "heldout": 319, "train": 290}
    cycles = state_cycles(10)
    halves = {}
    for p in band:
        halves.setdefault(UNSEEN.split_of(p), set()).add(cycles[_parse_state(p)])
    sizes = Counter(cycles.values())
    assert sorted(sizes[c] for c in halves["heldout"]) == [10, 10, 30, 30, 30]  # longest first, alternating
    assert sorted(sizes[c] for c in halves["train"]) == [10, 30, 30, 30]
    # Exhaustively, 1-99 steps: no state of a held-out chain is a state of an RL or SFT training chain.
    held, trained = set(), set()
    for p in prompts:
        (held if UNSEEN.split_of(p) == "heldout" else trained).update(_states(p))
    assert held and held.isdisjoint(trained)
    assert _contained(UNSEEN.sample(319, split="heldout", seed=0), UNSEEN.sample(1000, split="train", seed=0)) == (0, 0)
    # every RL training prompt is one the SFT start was never trained on
    assert all(SFT.split_of(p.prompt) == "heldout" for p in UNSEEN.sample(500, split="train", seed=1))


def _parse_state(prompt: str) -> tuple[int, int, int]:
    return int(prompt[0]), int(prompt[1]), int(prompt[3:6]) % 10


def test_the_prompt_split_holds_out_suffixes_of_training_chains() -> None:
    # The committed C1-long setting: 41-61-step held-out chains, SFT on 1-99-step chains.
    long = ChainTask(min_steps=41, max_steps=61, modulus=10, heldout_mod=2, distinct_heldout=True)
    sft = ChainTask(min_steps=1, max_steps=99, modulus=10, heldout_mod=2)
    heldout = long.sample(500, split="heldout", seed=0)
    assert _contained(heldout, sft.sample(2000, split="train", seed=0)) == (500, 500)  # every one


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"outcome": "all"}, "outcome must be one of answer, steps, got 'all'"),
        ({"heldout": "pair"}, "heldout must be one of prompt, cycle, got 'pair'"),
        (
            {"modulus": 10, "heldout": "cycle", "heldout_mod": 4},
            "heldout='cycle' with modulus 10 and heldout_mod 4 holds out every state of the facts 0\\+0, 0-0: "
            "training would never show them; choose another heldout_mod",
        ),
        ({"train_unseen": True}, "train_unseen needs heldout='cycle', got heldout='prompt'"),
        (
            {"modulus": 2, "heldout": "cycle", "heldout_mod": 3, "train_unseen": True},
            "train_unseen with modulus 2 and heldout_mod 3: the held-out cycles do not split into a train and a "
            "held-out half; choose another heldout_mod",
        ),
    ],
)
def test_bad_options_name_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        ChainConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^task.args: {message}"):
        build_task("chain", kwargs)


def test_a_cycle_split_refuses_prompts_off_the_modulus() -> None:
    with pytest.raises(ValueError, match="chain prompt '55~003=' has a digit >= the modulus 5"):
        ChainTask(heldout="cycle").split_of("55~003=")
    with pytest.raises(ValueError, match="not a chain prompt"):
        ChainTask(heldout="cycle").split_of("5~003=")


def test_five_operators_in_a_row_fix_the_counters_last_digit() -> None:
    def window(k: int, length: int) -> str:
        return "".join(step_operator(k - i) for i in range(length))

    assert len({window(k, 5) for k in range(10, 20)}) == 10
    assert len({window(k, 4) for k in range(10, 20)}) < 10
