"""The implicit PRM (PRIME): its log-ratio against a token-by-token reference, the span sums, the
online update toward the outcome, and a resumed run that continues with the reward model it had."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.policy.model import TinyPreset, build_tiny
from creditrl.policy.tokenizer import encode_problem
from creditrl.prm.implicit import ImplicitPRM, _rows, loo_token_baseline, token_log_ratios
from creditrl.rewards.stage import Scorer
from creditrl.tasks import Problem, make_task
from creditrl.train.rl import RLTrainer
from small_runs import TINY_RUN

TASK = make_task("arithmetic", min_ops=1, max_ops=2)


def _saved(tmp_path: Path, seed: int) -> str:
    model, tok = build_tiny(seed=seed)
    model.save_pretrained(tmp_path / f"m{seed}")
    tok.save_pretrained(tmp_path / f"m{seed}")
    return str(tmp_path / f"m{seed}")


def test_log_ratio_matches_a_token_by_token_reference() -> None:
    (model, tok), (reference, _) = build_tiny(seed=1), build_tiny(seed=2)
    problems = TASK.sample(3, split="train", seed=0)
    spans = [["3+4=7;", "#7"], ["1*2=2;#2"], [""]]  # the last response is empty
    rows = _rows(tok, problems, spans)
    ratios, mask = token_log_ratios(model, reference, rows, tok.pad_token_id)
    for i, (prompt, resp, _) in enumerate(rows):
        assert int(mask[i].sum()) == len(resp)
        for t, token in enumerate(resp):
            prefix = torch.tensor([prompt + resp[:t]])
            with torch.no_grad():
                want = (
                    torch.log_softmax(model(input_ids=prefix).logits[0, -1], -1)[token]
                    - torch.log_softmax(reference(input_ids=prefix).logits[0, -1], -1)[token]
                )
            assert float(ratios[i, t]) == pytest.approx(float(want), abs=1e-5), (i, t)
    assert float(ratios[2].abs().sum()) == 0.0


def test_rewards_are_beta_times_each_spans_summed_ratio_and_zero_at_the_start(tmp_path: Path) -> None:
    prm = ImplicitPRM(_saved(tmp_path, 0), beta=0.5, lr=1e-3, steps=1)
    problems = TASK.sample(2, split="train", seed=1)
    spans = [["3+4=7;", "#7"], ["", "1*2=2;#2"]]
    assert prm.rewards(problems, spans) == [[0.0, 0.0], [None, 0.0]]  # pi_rm = pi_ref before any update
    prm.model.load_state_dict(build_tiny(seed=5)[0].state_dict())
    rows = _rows(prm.tokenizer, problems, spans)
    ratios, _ = token_log_ratios(prm.model, prm.reference, rows, prm.tokenizer.pad_token_id)
    got = prm.rewards(problems, spans)
    assert got[0][0] == pytest.approx(0.5 * float(ratios[0, :6].sum()), abs=1e-5)
    assert got[0][1] == pytest.approx(0.5 * float(ratios[0, 6:8].sum()), abs=1e-5)
    assert got[1][0] is None and got[1][1] == pytest.approx(0.5 * float(ratios[1, :8].sum()), abs=1e-5)


def test_token_rewards_are_centered_by_the_other_responses_mean_token_reward(tmp_path: Path) -> None:
    prm = ImplicitPRM(_saved(tmp_path, 0), beta=0.5, lr=1e-3, steps=1)
    raw = ImplicitPRM(_saved(tmp_path, 0), beta=0.5, lr=1e-3, steps=1, center=False)
    other = build_tiny(seed=5)[0].state_dict()
    prm.model.load_state_dict(other)
    raw.model.load_state_dict(other)
    tok = prm.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [ids("1+2="), ids("1+2="), ids("1+2="), ids("3*3=")]  # a group of three, and one alone
    spans = [[ids("3;"), ids("#3")], [ids("4;#4")], [ids("1+2=3;"), ids("#3")], [ids("9;#9")]]
    r = raw.token_rewards(prompts, spans)
    c = prm.token_rewards(prompts, spans)
    lengths = [sum(len(x) for x in row) for row in spans]
    means = [sum(row) / n for row, n in zip(r, lengths)]  # each response's mean token reward
    for i in range(3):
        base = sum(means[j] for j in range(3) if j != i) / 2
        for k, span in enumerate(spans[i]):
            assert c[i][k] == pytest.approx(r[i][k] - len(span) * base, abs=1e-5), (i, k)
    assert c[3] == pytest.approx(r[3], abs=1e-6)  # no other response to its prompt: no baseline
    # centered, a group's token rewards average to zero when the responses are equally long
    mask = torch.ones(3, 4, dtype=torch.bool)
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    centered = rewards - loo_token_baseline(rewards, mask, ["g", "g", "g"])[:, None]
    assert float(centered.sum()) == pytest.approx(0.0, abs=1e-6)
    assert loo_token_baseline(rewards, mask, ["a", "b", "c"]).tolist() == [0.0, 0.0, 0.0]


def test_online_updates_move_the_implicit_outcome_toward_the_labels(tmp_path: Path) -> None:
    prm = ImplicitPRM(_saved(tmp_path, 0), beta=0.1, lr=3e-3, steps=1)
    problems = TASK.sample(8, split="train", seed=2)
    completions = [p.solution if i % 2 == 0 else p.solution + "9" for i, p in enumerate(problems)]
    outcome = torch.tensor([float(TASK.check_outcome(p, c)) for p, c in zip(problems, completions)])
    assert outcome.tolist() == [1.0, 0.0] * 4
    prompts = [encode_problem(prm.tokenizer, p) for p in problems]
    responses = [
        prm.tokenizer(c, add_special_tokens=False)["input_ids"] + [prm.tokenizer.eos_token_id] for c in completions
    ]
    first = prm.observe(prompts, responses, outcome)
    assert first["reward/implicit_loss"] == pytest.approx(0.6931, abs=1e-3)  # log 2: every score is 0
    for _ in range(20):
        last = prm.observe(prompts, responses, outcome)
    assert last["reward/implicit_loss"] < 0.5 and last["reward/implicit_accuracy"] == 1.0
    scores = [sum(r) for r in prm.rewards(problems, [[c] for c in completions])]
    assert min(scores[0::2]) > 0 > max(scores[1::2])  # right responses up, wrong ones down


def _bpe_tokenizer():
    """A real BPE tokenizer over the character vocabulary plus one merge, ``3 +`` -> ``3+``: the
    text ``3+4`` tokenizes as [3+, 4], while a policy may sample it as [3, +, 4]."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from creditrl.policy.tokenizer import CHARACTERS, SPECIAL_TOKENS

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *dict.fromkeys(CHARACTERS), "3+"])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("3", "+")], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def test_rewards_read_the_sampled_ids_not_a_retokenization(tmp_path: Path) -> None:
    tok = _bpe_tokenizer()
    assert tok("3+4", add_special_tokens=False)["input_ids"] == [
        tok.convert_tokens_to_ids("3+"),
        tok.convert_tokens_to_ids("4"),
    ]
    small = TinyPreset(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, max_positions=64)
    build_tiny(seed=0, preset=small, tokenizer=tok)[0].save_pretrained(tmp_path / "bpe")
    tok.save_pretrained(tmp_path / "bpe")
    prm = ImplicitPRM(str(tmp_path / "bpe"), beta=0.5, lr=1e-3, steps=1)
    prm.model.load_state_dict(build_tiny(seed=1, preset=small, tokenizer=tok)[0].state_dict())
    ids = lambda text: [tok.convert_tokens_to_ids(c) for c in text]  # noqa: E731 - one token per character
    prompt = ids("1+2?")
    sampled = [ids("3+4"), [*ids(";"), tok.eos_token_id]]  # two spans as the policy sampled them
    got = prm.token_rewards([prompt], [sampled])[0]
    want, seq = [], list(prompt)
    for span in sampled:
        total = 0.0
        for token in span:
            if token != tok.eos_token_id:  # eos carries no reward
                with torch.no_grad():
                    x = torch.tensor([seq])
                    total += float(
                        torch.log_softmax(prm.model(input_ids=x).logits[0, -1], -1)[token]
                        - torch.log_softmax(prm.reference(input_ids=x).logits[0, -1], -1)[token]
                    )
            seq.append(token)
        want.append(0.5 * total)
    assert got == pytest.approx(want, abs=1e-5)
    # the text path re-tokenizes "3+4" as two tokens, so it scores other tokens than were sampled
    problem = Problem(prompt="1+2?", answer="3", solution="")
    assert prm.rewards([problem], [["3+4", ";"]])[0][0] != pytest.approx(want[0], abs=1e-4)


def test_the_scorer_gives_the_implicit_prm_the_sampled_ids(tmp_path: Path, monkeypatch) -> None:
    seen: dict[str, list] = {"observe": [], "token_rewards": []}
    observe, token_rewards = ImplicitPRM.observe, ImplicitPRM.token_rewards

    def spy_observe(self, prompts, responses, outcome):
        seen["observe"].append((self.tokenizer, prompts, responses))
        return observe(self, prompts, responses, outcome)

    def spy_rewards(self, prompts, span_ids):
        seen["token_rewards"].append(span_ids)
        return token_rewards(self, prompts, span_ids)

    monkeypatch.setattr(ImplicitPRM, "observe", spy_observe)
    monkeypatch.setattr(ImplicitPRM, "token_rewards", spy_rewards)
    monkeypatch.setattr(ImplicitPRM, "rewards", lambda *a: pytest.fail("the text path was used"))
    RLTrainer.from_config(load_config(overrides=[*TINY, "train.iterations=1"]), tmp_path / "r").run()
    (tokenizer, prompts, responses), (span_ids,) = seen["observe"][0], seen["token_rewards"]
    assert len(prompts) == len(responses) == 16
    assert all(tokenizer.decode(p, skip_special_tokens=True).endswith("=") for p in prompts)
    # token granularity: one span a token, the spans of a kept response are its sampled ids in order
    assert [sum(row, []) for row in span_ids] == responses
    assert all(len(span) == 1 for row in span_ids for span in row)
    # with the character tokenizer the span texts tokenize back to the same ids (eos aside), so
    # the ids path gives the numbers the text path gave
    special = set(tokenizer.all_special_ids)
    for row in span_ids:
        for span in row:
            text = tokenizer.decode(span, skip_special_tokens=True)
            assert tokenizer(text, add_special_tokens=False)["input_ids"] == [i for i in span if i not in special]


TINY = [
    *TINY_RUN,
    "train.iterations=4",
    "train.checkpoint_every=2",
    "reward.source=outcome",
    "hybrid.dense_source=implicit_prm",
    "reward.implicit_lr=0.01",
    "credit.estimator=rloo",
]


def _rows_of(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_a_resumed_run_continues_with_the_reward_model_it_had(tmp_path: Path, monkeypatch) -> None:
    finished = tmp_path / "full"
    RLTrainer.from_config(load_config(overrides=TINY), finished).run()
    full = _rows_of(finished)
    assert {"reward/implicit_loss", "reward/implicit_accuracy"} <= set(full[1])

    def resumed_from_iteration_2(where: Path) -> list[dict]:
        shutil.copytree(finished, where, symlinks=True)
        (where / ".lock").unlink(missing_ok=True)
        shutil.rmtree(where / "checkpoints" / "iter_000004")
        (where / "checkpoints" / "latest").unlink()
        (where / "checkpoints" / "latest").symlink_to("iter_000002")
        trainer = RLTrainer.resume(where)
        assert trainer.start_iteration == 2
        trainer.run()
        return _rows_of(where)

    again = resumed_from_iteration_2(tmp_path / "resumed")
    for a, b in zip(full, again):
        for key in a:
            if not key.startswith("time/"):
                assert a[key] == pytest.approx(b[key], abs=1e-6), (a["iteration"], key)
    # without its reward model restored the resumed run scores otherwise: the checkpoint carries it
    monkeypatch.setattr(Scorer, "load_state_dict", lambda self, state: None)
    fresh = resumed_from_iteration_2(tmp_path / "fresh")
    assert fresh[3]["reward/implicit_loss"] != pytest.approx(full[3]["reward/implicit_loss"], abs=1e-6)


def test_a_batch_the_filter_empties_and_a_failing_ids_pass_are_handled(tmp_path: Path, monkeypatch) -> None:
    # group_accuracy in [0.9, 0.95] keeps no group of four: nothing reaches the implicit PRM's rewards
    none_kept = [*TINY, "train.iterations=1", "hybrid.filter=group_accuracy", "hybrid.filter_lo=0.9"]
    row = RLTrainer.from_config(load_config(overrides=[*none_kept, "hybrid.filter_hi=0.95"]), tmp_path / "a").run()
    assert row.history[-1]["reward/filtered"] == 16 and row.history[-1]["reward/errors"] == 0
    assert ImplicitPRM(_saved(tmp_path, 0), beta=0.5, lr=1e-3, steps=1).token_rewards([], []) == []
    # the ids pass failing, the source's own fn (the text path) scores each response, in process
    used = []
    monkeypatch.setattr(ImplicitPRM, "token_rewards", lambda *a: (_ for _ in ()).throw(RuntimeError("no ids")))
    text = ImplicitPRM.rewards
    monkeypatch.setattr(ImplicitPRM, "rewards", lambda self, p, s: used.append(len(p)) or text(self, p, s))
    last = RLTrainer.from_config(load_config(overrides=[*TINY, "train.iterations=1"]), tmp_path / "b").run().history[-1]
    assert last["reward/errors"] == 0 and used and set(used) == {1}  # one response a call


def test_implicit_prm_refuses_ray_scoring_workers_in_one_line() -> None:
    from creditrl.errors import ConfigError
    from creditrl.train.resolve import check

    cfg = load_config(overrides=[*TINY, "backend.name=ray", "backend.score_workers=2"])
    with pytest.raises(ConfigError, match="hybrid.dense_source: 'implicit_prm' learns during the run"):
        check(cfg, TASK)
