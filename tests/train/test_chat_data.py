"""A TRL user's conversational data trains: a ``messages``-format JSONL's prompts reach the policy
through its tokenizer's chat template, and ``task.args.system_prompt`` adds a system turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.policy.model import build_tiny
from creditrl.train import stages
from creditrl.train.rl import RLTrainer

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
RUN = [
    "task.name=math",
    "rollout.prompts_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "train.eval_size=2",
    "train.progress=false",
    "train.threads=1",
    "train.iterations=3",
    "loss.entropy_coef=0.01",
]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """The tiny policy saved with a chat template in its tokenizer."""
    model, tok = build_tiny(0)
    tok.chat_template = TEMPLATE
    out = tmp_path_factory.mktemp("chat") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _seen_prompts(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The prompt ids the rollout stage encodes, recorded as it does."""
    seen: list[list[int]] = []
    encode = stages.encode_problem

    def spy(tokenizer, problem):
        seen.append(encode(tokenizer, problem))
        return seen[-1]

    monkeypatch.setattr(stages, "encode_problem", spy)
    return seen


def _run(cfg_over: list[str], run_dir: Path) -> tuple[RLTrainer, list[dict]]:
    trainer = RLTrainer.from_config(load_config(overrides=RUN + cfg_over), run_dir)
    trainer.run()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, rows


def test_a_messages_jsonl_trains_through_the_chat_template(chat_model, tmp_path, monkeypatch) -> None:
    rows = [
        {
            "messages": [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f" {a + b}"}],
            "answer": str(a + b),
        }
        for a in range(3)
        for b in range(3)
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = _seen_prompts(monkeypatch)
    over = [f"policy.model={chat_model}", f"task.args={{train_file: {data}, heldout_file: {data}}}"]
    trainer, metrics = _run(over, tmp_path / "run")
    assert trainer.parts.config.policy.chat_template == "template"
    assert [r["iteration"] for r in metrics] == [0, 1, 2, 3] and all("reward/mean" in r for r in metrics[1:])
    tok = trainer.parts.tokenizer
    texts = {tok.decode(ids) for ids in seen}
    assert len(seen) == 3 * 2  # three iterations of 2 prompts (each encoded once for its group)
    assert texts <= {f"<user>{a}+{b}?|<assistant>" for a in range(3) for b in range(3)}


def test_a_system_prompt_reaches_the_policy(chat_model, tmp_path, monkeypatch) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1?", "answer": str(a + 1)}) + "\n" for a in range(4)))
    seen = _seen_prompts(monkeypatch)
    args = f"task.args={{train_file: {data}, heldout_file: {data}, system_prompt: Be brief.}}"
    trainer, _ = _run([f"policy.model={chat_model}", args, "train.iterations=1"], tmp_path / "run")
    texts = {trainer.parts.tokenizer.decode(ids) for ids in seen}
    assert texts and all(t.startswith("<system>Be brief.|<user>") and t.endswith("+1?|<assistant>") for t in texts)
