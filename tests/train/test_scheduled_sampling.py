"""Scheduled sampling in SFT: the schedules, the one-pass mixing against a token-by-token reference,
the SFT loop and cache key, and the exposure-bias measurement on hand-made predictions."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.experiments.evaluate import exposure_bias
from creditrl.policy.model import build_tiny
from creditrl.tasks import make_task
from creditrl.train import scheduled_sampling as ss
from creditrl.train.sft import sft_batch, sft_fields, sft_key, train_sft

TASK = make_task("arithmetic", min_ops=2, max_ops=3)


def test_linear_and_inverse_sigmoid_schedules() -> None:
    assert [ss.sampling_probability("linear", s, 11, 0.5) for s in (0, 5, 10)] == [0.0, 0.25, 0.5]
    assert ss.sampling_probability("none", 7, 10, 0.5) == 0.0
    assert ss.sampling_probability("linear", 7, 10, 0.0) == 0.0
    k = ss.midpoint_k(1000)
    assert k * math.log(k) == pytest.approx(500.0)
    assert ss.sampling_probability("inverse_sigmoid", round(k * math.log(k)), 1000, 0.4) == pytest.approx(0.2, abs=2e-3)
    ps = [ss.sampling_probability("inverse_sigmoid", s, 1000, 0.4) for s in range(0, 1000, 50)]
    assert ps == sorted(ps) and ps[0] < 0.01 and 0.39 < ps[-1] <= 0.4
    eps = 10 / (10 + math.exp(30 / 10))  # Bengio's teacher-forcing probability at step 30, k = 10
    assert ss.sampling_probability("inverse_sigmoid", 30, 1000, 1.0, k=10) == pytest.approx(1 - eps)
    with pytest.raises(ValueError, match="unknown schedule 'cosine'; schedules: none, linear, inverse_sigmoid"):
        ss.sampling_probability("cosine", 1, 10, 0.5)


def test_mixing_feeds_the_models_own_next_token_against_a_token_by_token_reference() -> None:
    model, tok = build_tiny(seed=3)
    model.eval()
    problems = TASK.sample(6, split="train", seed=1)
    ids, mask, labels = sft_batch(tok, problems)
    gen = torch.Generator().manual_seed(0)
    same, none = ss.mix_inputs(model, ids, mask, labels, 0.0, gen, greedy=True)
    assert torch.equal(same, ids) and none == 0.0
    mixed, share = ss.mix_inputs(model, ids, mask, labels, 1.0, gen, greedy=True)
    assert share == 1.0
    for i in range(len(problems)):
        for t in range(ids.shape[1]):
            if labels[i, t] == -100:  # prompt, padding: never replaced
                assert mixed[i, t] == ids[i, t]
                continue
            with torch.no_grad():  # the slow reference: the model on the reference prefix alone
                want = model(input_ids=ids[i : i + 1, :t]).logits[0, -1].argmax()
            assert mixed[i, t] == want, (i, t)


def test_mixing_replaces_about_p_of_the_response_tokens() -> None:
    model, tok = build_tiny(seed=0)
    problems = TASK.sample(64, split="train", seed=2)
    ids, mask, labels = sft_batch(tok, problems)
    _, share = ss.mix_inputs(model, ids, mask, labels, 0.3, torch.Generator().manual_seed(1))
    n = int((labels != -100).sum())
    assert abs(share - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)  # binomial: within 4 standard errors


TINY_SFT = [
    "sft.steps=6",
    "sft.batch_size=4",
    "sft.warmup_steps=1",
    "train.eval_size=4",
    "rollout.max_new_tokens=16",
    "train.progress=false",
]


def test_sft_with_scheduled_sampling_records_the_share_and_keys_its_own_cache(tmp_path: Path) -> None:
    plain = load_config(overrides=TINY_SFT)
    assert not any(k.startswith("ss_") or k == "scheduled_sampling" for k in sft_fields(plain))
    mixed = load_config(overrides=[*TINY_SFT, "sft.scheduled_sampling=linear", "sft.ss_max=0.5"])
    assert sft_fields(mixed)["scheduled_sampling"] == "linear" and sft_key(mixed) != sft_key(plain)
    _, _, metrics = train_sft(mixed, tmp_path / "ss", progress=False)
    # linear over 6 steps to 0.5: mean probability 0.25, replaced shares drawn around it
    assert 0.05 < metrics["sft/ss_replaced"] < 0.45 and math.isfinite(metrics["sft/final_loss"])
    _, _, base = train_sft(plain, tmp_path / "plain", progress=False)
    assert "sft/ss_replaced" not in base


def test_a_bad_schedule_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="sft.scheduled_sampling"):
        load_config(overrides=["sft.scheduled_sampling=cosine"])
    with pytest.raises(ConfigError, match="sft.ss_max"):
        load_config(overrides=["sft.ss_max=1.5"])


class _Oracle(torch.nn.Module):
    """Predicts the next input token at every position (perfect under teacher forcing), except
    at the (row, position) pairs in ``wrong``."""

    def __init__(self, vocab: int, wrong: set[tuple[int, int]]) -> None:
        super().__init__()
        self.vocab, self.wrong = vocab, wrong

    def forward(self, input_ids, attention_mask=None):
        nxt = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1).clone()
        for i, t in self.wrong:
            nxt[i, t] = (nxt[i, t] + 1) % self.vocab
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


def test_exposure_bias_on_hand_made_predictions_and_solutions(monkeypatch) -> None:
    _, tok = build_tiny(seed=0)
    problems = [TASK.make_problem("7+3*2-5="), TASK.make_problem("2*3+4=")]  # 3 steps + answer; 2 + answer
    ids, _, labels = sft_batch(tok, problems)
    first = int((labels[0] != -100).nonzero()[0])  # row 0's first solution token, "3" of "3*2=6;"
    oracle = _Oracle(len(tok), {(0, first + 7 - 1)})  # a wrong token in row 0's second step "7+6=13;"
    completions = [
        "3*2=6;7+6=13;13-5=8;#8",  # row 0 right everywhere when free
        "2*3=6;6+4=11;#11",  # row 1: the second step wrong
    ]
    monkeypatch.setattr(
        "creditrl.train.evaluate.evaluate",
        lambda *a, **k: SimpleNamespace(completions=completions, accuracy=0.5),
    )
    out = exposure_bias(oracle, tok, TASK, problems, max_new_tokens=32)
    assert out["tf_step_accuracy"] == pytest.approx((3 / 4 + 1) / 2)
    assert out["free_step_accuracy"] == pytest.approx((1 + 1 / 3) / 2)
    assert out["gap"] == pytest.approx(out["tf_step_accuracy"] - out["free_step_accuracy"])
    assert out["accuracy"] == 0.5
