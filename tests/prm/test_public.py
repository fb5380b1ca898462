"""Public PRMs (Math-Shepherd, Qwen2.5-Math-PRM, RLHFlow conventions) as step scorers: tiny random
models saved in each convention, scored through ``reward.prm`` and compared with a forward pass
written here from each model card; detection from the saved files; search with a public PRM."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    Qwen2Config,
    Qwen2ForTokenClassification,
)

from creditrl.config import ConfigError, load_config
from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.prm.model import ProcessRewardModel
from creditrl.prm.public import FORMATS, PublicPRM, detect_format
from creditrl.prm.source import load_prm, prm_step_scores
from creditrl.rewards.sources import make_source, score_batch
from creditrl.tasks import make_task

QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

TASK = make_task("arithmetic", min_ops=1, max_ops=2, operand_max=3)
PROMPTS = ["1+2*3=", "2-1="]
SPANS = [["2*3=6;", "1+6=7;", "#7"], ["2-1=1;", "#1", ""]]  # "": an eos-only span, no reward


def _tokenizer(special: tuple[str, ...] = (), template: str | None = None, *, tag: bool = False):
    tok = build_char_tokenizer()
    tok.add_tokens(["\n", *(["ки"] if tag else [])])
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    tok.chat_template = template
    return tok


def _llama(tok, cls=LlamaForCausalLM, **extra):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,  # peaked logits: step scores far apart, so a wrong read shows
        pad_token_id=tok.pad_token_id,
        **extra,
    )
    return cls(config)


def _qwen(tok):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,
        num_labels=2,
        pad_token_id=tok.pad_token_id,
    )
    return Qwen2ForTokenClassification(config)


def _save(path: Path, model, tok) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    """One tiny random model per convention, saved as its hub repository is laid out."""
    root = tmp_path_factory.mktemp("public_prms")
    shepherd = _tokenizer(tag=True)
    qwen = _tokenizer(("<extra_0>", "<|im_start|>", "<|im_end|>"), QWEN_TEMPLATE)
    llama3 = _tokenizer(
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), LLAMA3_TEMPLATE
    )
    return {
        "math_shepherd": _save(root / "shepherd", _llama(shepherd), shepherd),
        "qwen_prm": _save(root / "qwen", _qwen(qwen), qwen),
        "rlhflow": _save(root / "rlhflow", _llama(llama3), llama3),
    }


# ------------------------------------------------------- each model card's own reading, written out


def _card_shepherd(path: str, prompt: str, steps: list[str]) -> list[float]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    candidates = [tok.encode("+")[-1], tok.encode("-")[-1]]
    tag_id = tok.encode("ки")[-1]
    text = f"{prompt} " + "\n".join(f"{s} ки" for s in steps)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        logits = model(ids).logits[:, :, candidates]
    return logits.softmax(dim=-1)[:, :, 0][ids == tag_id].tolist()


def _card_qwen(path: str, prompt: str, steps: list[str]) -> list[float]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForTokenClassification.from_pretrained(path)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
    ]
    ids = torch.tensor([tok.encode(tok.apply_chat_template(messages, tokenize=False))])
    with torch.no_grad():
        probs = model(input_ids=ids)[0].softmax(dim=-1)
    return probs[0, ids[0] == tok.encode("<extra_0>")[0], 1].tolist()


def _card_rlhflow(path: str, prompt: str, steps: list[str]) -> list[float]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    candidates = [tok.encode("+")[-1], tok.encode("-")[-1]]
    conversation, scores = [], []
    for k, step in enumerate(steps):
        conversation.append({"role": "user", "content": f"{prompt} {step}" if k == 0 else step})
        conversation.append({"role": "assistant", "content": "+"})
        ids = tok(tok.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -3, candidates]  # the card: '-3' predicts '+'
        scores.append(logits.softmax(dim=-1)[0, 0].item())
    return scores


CARDS = {"math_shepherd": _card_shepherd, "qwen_prm": _card_qwen, "rlhflow": _card_rlhflow}


@pytest.mark.parametrize("fmt", list(CARDS))
def test_the_prm_source_gives_each_card_s_step_scores(saved, fmt) -> None:
    assert detect_format(saved[fmt]) == fmt
    source = make_source("prm", {"prm": saved[fmt]})  # prm.format=auto
    problems = [TASK.make_problem(p) for p in PROMPTS]
    res = score_batch(source, TASK, problems, ["".join(s) for s in SPANS], SPANS, granularity="step")
    direct = [CARDS[fmt](saved[fmt], p, [s.strip() for s in steps if s]) for p, steps in zip(PROMPTS, SPANS)]
    assert res.scores[0] == pytest.approx(direct[0], rel=1e-4, abs=1e-7)
    assert res.scores[1][:2] == pytest.approx(direct[1], rel=1e-4, abs=1e-7) and res.scores[1][2] is None
    log_odds = [math.log(x / (1 - x)) for row in direct for x in row]
    assert max(log_odds) - min(log_odds) > 1.0  # the scores differ, so a misplaced read would show
    # one row at a time (no padding) gives the same numbers as the padded batch
    prm, tok = load_prm(saved[fmt], "cpu", fmt)
    assert isinstance(prm, PublicPRM)
    single = [prm.score(tok, [(p, [s for s in steps if s])], batch_size=1)[0] for p, steps in zip(PROMPTS, SPANS)]
    assert single[0] == pytest.approx(direct[0], rel=1e-4, abs=1e-7) and single[1] == pytest.approx(
        direct[1], rel=1e-4, abs=1e-7
    )


@pytest.mark.parametrize("fmt", list(CARDS))
def test_steps_past_the_context_score_none(saved, fmt) -> None:
    prm, tok = load_prm(saved[fmt], "cpu", fmt)
    steps = [f"{k}+1={k + 1};" for k in range(40)]  # ~300+ tokens: past max_position_embeddings=256
    row = prm.score(tok, [(PROMPTS[0], steps)])[0]
    kept = [x for x in row if x == x]
    assert 0 < len(kept) < len(steps) and row[: len(kept)] == kept  # a scored prefix, then NaN
    assert prm_step_scores(prm, tok, [PROMPTS[0]], [steps])[0][len(kept)] is None


def test_rlhflow_without_a_prefix_consistent_template_scores_each_prefix(saved, tmp_path) -> None:
    """A template that renders the turn count first makes each prefix conversation differ from the
    whole one: each step is then its own row, read as the card reads it."""
    tok = AutoTokenizer.from_pretrained(saved["rlhflow"])
    tok.chat_template = "{{ messages | length }}" + LLAMA3_TEMPLATE
    path = _save(tmp_path / "counted", AutoModelForCausalLM.from_pretrained(saved["rlhflow"]), tok)
    prm, tok = load_prm(path, "cpu", "rlhflow")
    steps = [s for s in SPANS[0] if s]
    assert len(FORMATS["rlhflow"].rows(tok, PROMPTS[0], steps)) == len(steps)  # one row per prefix
    whole = AutoTokenizer.from_pretrained(saved["rlhflow"])
    assert len(FORMATS["rlhflow"].rows(whole, PROMPTS[0], steps)) == 1  # a Llama-3 template: one pass
    assert prm.score(tok, [(PROMPTS[0], steps)])[0] == pytest.approx(
        _card_rlhflow(path, PROMPTS[0], steps), rel=1e-4, abs=1e-7
    )


def test_detection_reads_creditrl_prms_and_refuses_other_models_in_one_line(saved, tmp_path) -> None:
    policy = ProcessRewardModel.from_policy("tiny", seed=0)
    policy.save(tmp_path / "own")
    assert detect_format(tmp_path / "own") == "creditrl"
    tok = _tokenizer()
    rm = _save(tmp_path / "rm", _llama(tok, LlamaForSequenceClassification, num_labels=1), tok)
    with pytest.raises(ConfigError) as err:
        detect_format(rm)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"reward.prm: '{rm}' (LlamaForSequenceClassification) matches no PRM convention")
    assert "set prm.format to one of creditrl, math_shepherd, qwen_prm, rlhflow" in message
    plain = _save(tmp_path / "plain", _llama(tok), tok)  # a causal LM with neither a tag nor a chat template
    with pytest.raises(ConfigError, match="matches no PRM convention"):
        detect_format(plain)
    # a format named by the key is checked against the tokenizer's tokens
    with pytest.raises(
        ConfigError, match=r"prm.format=qwen_prm: the PRM's tokenizer has no single token for '<extra_0>'"
    ):
        load_prm(saved["math_shepherd"], "cpu", "qwen_prm")


def test_prm_format_is_checked_when_a_run_is_built(saved) -> None:
    from creditrl.train.resolve import check

    cfg = load_config(overrides=["reward.source=prm", f"reward.prm={saved['qwen_prm']}", "prm.format=qwen"])
    with pytest.raises(ConfigError, match="prm.format: unknown value 'qwen'"):
        check(cfg, TASK)
    bare = Path(saved["qwen_prm"]).parent / "bare"
    bare.mkdir(exist_ok=True)
    cfg = load_config(overrides=["reward.source=prm", f"reward.prm={bare}"])
    with pytest.raises(ConfigError, match="matches no PRM convention"):
        check(cfg, TASK)
