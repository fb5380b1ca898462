"""``creditrl compare`` on a user's own setting: a tiny Qwen2 saved with its own BPE tokenizer, a
JSONL and a TRL-style reward function in a temporary folder, a grid with no ``init``: RL starts
from the model as it is (no SFT), and the output ends with a verdict line per arm, or, under a
constant reward, with the no-signal line and no verdict."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

REWARDS = """
def exact(completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def constant(completions, **kwargs):
    return [1.0 for _ in completions]
"""


@pytest.fixture(scope="module")
def setting(tmp_path_factory) -> Path:
    """The user's folder: ``model/`` (a random Qwen2 and a character-level BPE tokenizer trained on
    the data), ``data.jsonl`` (``a+b=`` -> the parity of a + b) and ``reward.py``."""
    where = tmp_path_factory.mktemp("mine")
    rows = [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 2)} for a in range(10) for b in range(10)]
    (where / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bpe = Tokenizer(models.BPE())
    bpe.decoder = decoders.Fuse()
    alphabet = list("0123456789+=")
    trainer = trainers.BpeTrainer(vocab_size=15, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=alphabet)
    bpe.train_from_iterator([r["prompt"] + r["answer"] for r in rows], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(where / "model")
    tok.save_pretrained(where / "model")
    (where / "reward.py").write_text(REWARDS)
    return where


def _grid(where: Path, reward: str) -> Path:
    grid = where / f"{reward}.yaml"
    grid.write_text(
        "set:\n"
        f"  - policy.model={where / 'model'}\n"
        "  - task.name=math\n"
        f'  - "task.args={{train_file: {where / "data.jsonl"}, heldout_file: {where / "data.jsonl"}}}"\n'
        f"  - reward.source={where / 'reward.py'}:{reward}\n"
        "  - rollout.prompts_per_iter=4\n"
        "  - rollout.group_size=8\n"
        "  - rollout.max_new_tokens=1\n"
        "  - train.eval_size=16\n"
        "  - train.eval_every=1\n"
        "  - train.progress=false\n"
        "  - optim.lr=0.01\n"
        "seeds: [0, 1]\n"
        "budget: {samples: 96}\n"
        "arms:\n"
        "  grpo: [credit.estimator=grpo]\n"
        "  rloo: [credit.estimator=rloo]\n"
    )
    return grid


def _compare(setting: Path, reward: str, tmp_path: Path, monkeypatch, capsys) -> tuple[list[str], dict]:
    from creditrl.cli import main
    from creditrl.train import sft

    def no_sft(*a, **k):
        raise AssertionError("a supervised warm start ran")

    monkeypatch.setattr(sft, "train_sft", no_sft)
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["compare", str(_grid(setting, reward)), "--out", str(out), "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "warm start" not in printed.replace("no warm start", "")
    assert f"start: {setting / 'model'} as it is (init: policy), no warm start" in printed
    assert not (tmp_path / "cache" / "sft").exists()
    return printed.rstrip("\n").splitlines(), json.loads((out / "summary.json").read_text())


def test_a_users_own_model_gets_a_verdict_line_per_arm_with_no_sft(setting, tmp_path, monkeypatch, capsys):
    lines, summary = _compare(setting, "exact", tmp_path, monkeypatch, capsys)
    assert summary["init"] == "policy" and summary["grid"]["init"] == "policy"
    assert lines[-3] == "Verdicts against grpo:" and lines[-2] == "grpo: the reference"
    assert re.match(
        r"rloo: (better than|worse than|no difference detectable from|no difference from) grpo, [+-]\d+\.\d points "
        r".*\(held-out accuracy at the last evaluation; seed-level paired t, 95% interval, Holm over 1 comparison\)$",
        lines[-1],
    ), lines[-1]
    rows = {r["arm"]: r for r in summary["verdicts"]}
    assert rows["rloo"]["why"] is None and rows["rloo"]["difference"]["seeds"] == 2
    assert rows["rloo"]["difference"]["problems"] == 16
    assert all(r["zero_spread"] < 0.9 and r["moved"] for r in rows.values())
    # the runs' costs: every run's CPU seconds, and its generated tokens (one per sample here)
    for arm in ("grpo", "rloo"):
        for seed in (0, 1):
            assert json.loads((tmp_path / "out" / arm / f"seed{seed}" / "cost.json").read_text())["cpu_s"] > 0
    assert [c["generated_tokens"] for c in summary["costs"]] == [[96.0, 0.0], [96.0, 0.0]]
    assert all(c["cpu_s"][0] > 0 for c in summary["costs"])
    for cost, arm in zip(summary["costs"], ("grpo", "rloo")):  # the updates' positions, summed over iterations
        runs = [(tmp_path / "out" / arm / f"seed{s}" / "metrics.jsonl").read_text().splitlines() for s in (0, 1)]
        sums = [sum(json.loads(x).get("update/positions", 0) for x in run) for run in runs]
        assert cost["trained_positions"][0] == pytest.approx(sum(sums) / 2) and min(sums) > 0
    assert "| grpo | 96 ± 0 |" in (tmp_path / "out" / "results.md").read_text()


def test_a_constant_reward_prints_the_no_signal_line_and_no_verdict(setting, tmp_path, monkeypatch, capsys):
    lines, summary = _compare(setting, "constant", tmp_path, monkeypatch, capsys)
    assert lines[-4:] == [
        "Verdicts against grpo:",
        "grpo: the reference; no learning signal: its rewards had zero spread in 100% of its groups",
        "rloo: no verdict, no learning signal: its rewards had zero spread in 100% of its groups",
        "no verdict: no arm moved from the start (every seed's held-out outcomes at the last evaluation equal "
        "its start's)",
    ]
    assert all(r["verdict"] is None and r["zero_spread"] == 1.0 for r in summary["verdicts"])
