"""The TRL GRPO peer and the HF generate baseline of the speed benchmark."""

from __future__ import annotations

import tempfile

import pytest
import torch

from creditrl.policy.model import build_tiny
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks.arithmetic import ArithmeticTask
from creditrl.train.rl import iteration_seed
from hf_peer import hf_generate_throughput
from trl_peer import (
    PeerSettings,
    _build_trainer,
    make_outcome_reward,
    peer_problems,
    trl_grpo_run,
    trl_prompt_text,
)

TINY_RUN = PeerSettings(prompts_per_iter=2, group_size=2, max_new_tokens=8)
# Answers are 0 or 1: a policy that writes "#0" or "#1" at random is right half the time, so groups
# have mixed rewards, non-zero advantages, and GRPO moves the weights.
COIN_TASK = dict(min_ops=1, max_ops=1, operators="*", operand_min=0, operand_max=1)


@pytest.fixture(scope="module")
def coin_policy():
    """build_tiny() taught the format "#<0 or 1><eos>", the digit a fair coin independent of the prompt."""
    model, tok = build_tiny()
    task = ArithmeticTask(**COIN_TASK)
    problems = task.sample(32, split="train", seed=0)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        rows, masks = [], []
        for p in problems:
            digit = str(int(torch.randint(0, 2, (1,), generator=gen)))
            prompt = encode_prompt(tok, p.prompt)
            completion = tok("#" + digit, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append(prompt + completion)
            masks.append([0] * len(prompt) + [1] * len(completion))
        ids, mask = torch.tensor(rows), torch.tensor(masks)[:, 1:].float()
        logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # "#" and eos are learnt, the digit stays a coin: about ln 2 over the three completion tokens
    assert float(loss.detach()) < 0.3
    return model, tok, task


def test_prompt_text_prepends_bos_for_the_char_tokenizer():
    _, tok = build_tiny()
    assert tok("7+3=")["input_ids"] == encode_prompt(tok, "7+3=")[1:]  # it adds no bos itself
    assert trl_prompt_text(tok, "7+3=") == "<bos>7+3="


@pytest.mark.filterwarnings("ignore:.*deprecated and will be removed in v6:FutureWarning")
def test_trl_tokenizes_prompts_to_creditrl_ids_and_logs_the_same_reward():
    model, tok = build_tiny()
    task = ArithmeticTask()
    settings = PeerSettings(prompts_per_iter=4, group_size=2, max_new_tokens=4, seed=3)
    problems = peer_problems(task, 2, settings)
    # iteration i gets exactly the problems of creditrl's iteration i
    assert problems[4:] == task.sample(4, split="train", seed=iteration_seed(3, 1))
    with tempfile.TemporaryDirectory() as out:
        trainer, reward, timer = _build_trainer(model, tok, task, 1, settings, out)
        texts = list(trainer.train_dataset["prompt"])
        trl_ids, _, _ = trainer._tokenize_prompts(texts)  # what TRL feeds generate
        expected = [encode_prompt(tok, p.prompt) for p in problems[:4]]  # the 1 iteration built
        assert [list(ids) for ids in trl_ids] == expected
        assert len({len(ids) for ids in expected}) > 1  # prompts of several lengths (left padding happens)
        trainer.train()
    # the key this TRL version logs the mean reward under agrees with our reward calls
    logged = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    assert len(reward.calls) == 1 and len(reward.calls[0]) == 8 and len(timer.times) == 1
    assert logged == pytest.approx([sum(reward.calls[0]) / 8])


def test_outcome_reward_uses_the_task_checker():
    _, tok = build_tiny()
    task = ArithmeticTask()
    problems = task.sample(3, split="train", seed=0)
    reward = make_outcome_reward(tok, task, problems)

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    right = [ids(p.solution) for p in problems]
    wrong = [ids(problems[0].solution + "7"), ids("garbage"), ids("#" + str(int(problems[2].answer) + 1))]
    got = reward(prompts=[""] * 6, completions=[""] * 6, completion_ids=right + wrong, problem_index=[0, 1, 2] * 2)
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert reward.calls == [got]
    assert reward.tokens == [sum(len(x) for x in right + wrong)]


def test_trl_grpo_run_trains_and_times_each_step(coin_policy):
    model, tok, task = coin_policy
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng_before = torch.get_rng_state()
    records = trl_grpo_run(model, tok, task, 2, TINY_RUN)
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["time_s"] > 0 for r in records)
    assert all(0.0 <= r["reward"] <= 1.0 for r in records)
    # each reward is a mean over 2 x 2 completions
    assert all(r["reward"] * 4 == pytest.approx(round(r["reward"] * 4)) for r in records)
    # completion tokens of the step's 2 x 2 completions, each up to and including its eos
    assert all(4 <= r["tokens"] <= 4 * TINY_RUN.max_new_tokens for r in records)
    # at least one Adam step with a non-zero gradient: the first Adam step moves a weight by at most lr
    # (update m / sqrt(v) = sign(g)), two steps by at most 2 lr
    change = max(float((p.detach() - before[name]).abs().max()) for name, p in model.named_parameters())
    assert 0.5 * TINY_RUN.lr < change <= 2 * TINY_RUN.lr * 1.01
    assert "forward" not in vars(model)  # TRL's fused-head patch is gone
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is untouched


def test_trl_import_error_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_trl(name, *args, **kwargs):
        if name == "trl" or name.startswith("trl."):
            raise ImportError("No module named 'trl'", name="trl")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_trl)
    model, tok = build_tiny()
    with pytest.raises(ImportError, match=r"pip install 'creditrl\[bench\]'"):
        trl_grpo_run(model, tok, ArithmeticTask(), 1, TINY_RUN)


def test_hf_generate_throughput_counts_every_token_without_eos():
    model, tok = build_tiny()
    prompts = [encode_prompt(tok, "7+3="), encode_prompt(tok, "1*2-3=")]
    out = hf_generate_throughput(model, prompts, 3, 6, temperature=1.0, pad_id=tok.pad_token_id, eos_id=None, seed=0)
    assert out["new_tokens"] == len(prompts) * 3 * 6
    assert out["time_s"] > 0
    assert out["tokens_per_s"] == pytest.approx(out["new_tokens"] / out["time_s"])


def test_hf_generate_throughput_stops_counting_at_eos(coin_policy):
    model, tok, _ = coin_policy  # writes "#d<eos>": 3 new tokens per row
    prompts = [encode_prompt(tok, "0*1="), encode_prompt(tok, "1*1=")]
    out = hf_generate_throughput(
        model, prompts, 2, 8, temperature=1.0, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, seed=0
    )
    assert out["new_tokens"] == 4 * 3


def test_peer_device_and_precision_set_trls_flags_and_bad_values_are_refused():
    from trl_config import grpo_config

    with tempfile.TemporaryDirectory() as out:
        cpu = grpo_config(out, 1, PeerSettings())
        assert (cpu.use_cpu, cpu.bf16, cpu.fp16) == (True, False, False)  # the CPU benchmark's settings
        gpu = PeerSettings(device="cuda", precision="bf16")
        assert gpu.device == "cuda" and gpu.precision == "bf16"
    with pytest.raises(ValueError, match="PeerSettings.device: expected cpu or cuda, got 'tpu'"):
        PeerSettings(device="tpu")
    with pytest.raises(ValueError, match="PeerSettings.precision: expected fp32 or bf16, got 'fp16'"):
        PeerSettings(precision="fp16")
