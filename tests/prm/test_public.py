"""Public PRMs (Math-Shepherd, Qwen2.5-Math-PRM, RLHFlow conventions) as step scorers: tiny random
models saved in each convention, scored through ``reward.prm`` and compared with a forward pass
written here from each model card; detection from the saved files; search with a public PRM."""

from __future__ import annotations

import functools
import json
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
from creditrl.policy.engines import make_engine
from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.prm import public
from creditrl.prm.model import ProcessRewardModel
from creditrl.prm.pipeline import to_steps
from creditrl.prm.public import FORMATS, PublicPRM, detect_format
from creditrl.prm.source import load_prm, prm_step_scores
from creditrl.rewards.sources import make_source, score_batch
from creditrl.search import SearchConfig, make_context, search
from creditrl.search.methods import sample_candidates
from creditrl.tasks import make_task
from creditrl.train.rl import RLTrainer

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
        max_position_embeddings=1024,
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
        max_position_embeddings=1024,
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


@functools.lru_cache(maxsize=8)
def _load(path: str, cls=AutoModelForCausalLM):
    return AutoTokenizer.from_pretrained(path), cls.from_pretrained(path)


def _card_shepherd(path: str, prompt: str, steps: list[str]) -> list[float]:
    tok, model = _load(path)
    candidates = [tok.encode("+")[-1], tok.encode("-")[-1]]
    tag_id = tok.encode("ки")[-1]
    text = f"{prompt} " + "\n".join(f"{s} ки" for s in steps)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        logits = model(ids).logits[:, :, candidates]
    return logits.softmax(dim=-1)[:, :, 0][ids == tag_id].tolist()


def _card_qwen(path: str, prompt: str, steps: list[str]) -> list[float]:
    tok, model = _load(path, AutoModelForTokenClassification)
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
    tok, model = _load(path)
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
    assert isinstance(prm, PublicPRM) and prm.keeps_logits == (fmt != "qwen_prm")  # LM logits at reads only
    single = [prm.score(tok, [(p, [s for s in steps if s])], batch_size=1)[0] for p, steps in zip(PROMPTS, SPANS)]
    assert single[0] == pytest.approx(direct[0], rel=1e-4, abs=1e-7) and single[1] == pytest.approx(
        direct[1], rel=1e-4, abs=1e-7
    )


@pytest.mark.parametrize("fmt", list(CARDS))
def test_steps_past_the_context_score_none(saved, fmt) -> None:
    prm, tok = load_prm(saved[fmt], "cpu", fmt)
    steps = [f"{k}+1={k + 1};" for k in range(150)]  # over 1,100 tokens: past max_position_embeddings=1024
    row = prm.score(tok, [(PROMPTS[0], steps)])[0]
    kept = [x for x in row if x == x]
    assert 0 < len(kept) < len(steps) and row[: len(kept)] == kept  # a scored prefix, then NaN
    assert prm_step_scores(prm, tok, [PROMPTS[0]], [steps])[0][len(kept)] is None


def test_batches_are_bounded_in_padded_tokens_without_changing_scores(saved, monkeypatch) -> None:
    prm, tok = load_prm(saved["math_shepherd"], "cpu", "math_shepherd")
    examples = [(p, [s for s in spans if s]) for p, spans in zip(PROMPTS, SPANS)] * 3  # 6 rows
    forward, shapes = prm.model.forward, []
    monkeypatch.setattr(prm.model, "forward", lambda **kw: shapes.append(kw["input_ids"].shape) or forward(**kw))
    whole = [x for row in prm.score(tok, examples) for x in row]
    assert len(shapes) == 1
    bound = 2 * shapes[0][1]  # two rows of the longest length
    monkeypatch.setattr(public, "TOKENS_PER_CALL", bound)
    shapes.clear()
    assert [x for row in prm.score(tok, examples) for x in row] == pytest.approx(whole, rel=1e-5, abs=1e-7)
    assert len(shapes) == 3 and all(b * width <= bound for b, width in shapes)


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
    _llama(tok).save_pretrained(tmp_path / "untokenized")  # a causal LM saved without its tokenizer
    with pytest.raises(ConfigError, match=r"reward.prm: '.*untokenized' has no tokenizer that loads \(") as err:
        detect_format(tmp_path / "untokenized")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="matches no PRM convention"):
        detect_format(plain)
    # a format named by the key is checked against the files and the tokenizer's tokens
    with pytest.raises(ConfigError, match=r"prm.format=creditrl: '.*' has no prm_config.json"):
        load_prm(saved["rlhflow"], "cpu", "creditrl")
    wrong_kind = r"prm.format=rlhflow: '.*' holds Qwen2ForTokenClassification, not a \*ForCausalLM"
    with pytest.raises(ConfigError, match=wrong_kind):
        load_prm(saved["qwen_prm"], "cpu", "rlhflow")
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


def _step_policy(peaked_tiny):
    """A peaked tiny policy that ends steps (';') and responses (eos) often, as tests/search uses."""
    model, tok = peaked_tiny(0, 1)
    bias = torch.zeros(len(tok))
    bias[tok.convert_tokens_to_ids(";")] = 3.0
    bias[tok.eos_token_id] = 2.0
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    return model.eval(), tok


@pytest.mark.parametrize("fmt", list(CARDS))
def test_search_verifies_with_a_public_prm(saved, peaked_tiny, fmt) -> None:
    """Best-of-N's candidates carry the card's step scores; beam search and MCTS run on the public
    PRM within their budgets."""
    model, tok = _step_policy(peaked_tiny)
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    task = make_task("arithmetic", min_ops=2, max_ops=3)
    problems = task.sample(2, split="heldout", seed=0)
    prm = load_prm(saved[fmt], "cpu", fmt)
    cfg = SearchConfig(method="best_of_n", n=3, selector="prm_min", budget=400, max_new_tokens=24)
    ctx = make_context(problems, engine=engine, tokenizer=tok, task=task, config=cfg, prm=prm)
    groups = sample_candidates(ctx, 3, prm=True, orm=False)
    checked = 0
    for problem, group in zip(problems, groups):
        for sampled in group:
            steps = [s.strip() for s in to_steps(sampled.completion, ";")]
            if steps:
                card = CARDS[fmt](saved[fmt], problem.prompt, steps)
                assert sampled.candidate.step_scores == pytest.approx(card, rel=1e-4, abs=1e-7)
                checked += len(steps)
    assert checked >= 6
    for method in (dict(method="beam", width=2, expansions=2), dict(method="mcts", expansions=2, simulations=6)):
        config = SearchConfig(**method, budget=300, max_new_tokens=24)
        result = search(problems, engine=engine, tokenizer=tok, task=task, config=config, prm=prm)
        assert len(result.problems) == 2 and all(0 < r.tokens <= 300 for r in result.problems)


@pytest.mark.parametrize(
    ("fmt", "credit"),
    [
        ("qwen_prm", ["credit.estimator=grpo_process"]),
        ("math_shepherd", ["credit.estimator=gae", "value.source=critic"]),
        ("rlhflow", ["credit.estimator=min_form"]),
    ],
)
def test_three_rl_iterations_with_a_public_prm_as_step_reward(saved, scored_by, tmp_path, fmt, credit) -> None:
    """reward.prm=<a public PRM>: three RL iterations (any estimator), then the trainer's score
    stage places the card's step scores at the policy's step ends."""
    cfg = load_config(
        overrides=[
            "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
            "reward.source=prm",
            f"reward.prm={saved[fmt]}",
            *credit,
            "rollout.prompts_per_iter=2",
            "rollout.group_size=3",
            "rollout.max_new_tokens=16",
            "train.iterations=3",
            "train.eval_every=100",
            "train.eval_size=2",
            "train.progress=false",
            "train.init=policy",
            "policy.model=tiny",
        ]
    )
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    rows = trainer.run().history
    assert [r["iteration"] for r in rows[1:]] == [1, 2, 3]
    assert all(r["reward/placed_per_response"] >= 1 and 0.0 <= r["reward/mean"] for r in rows[1:])
    problems = [TASK.make_problem(p) for p in PROMPTS]
    completions = ["".join(SPANS[0]), "".join(SPANS[1])]
    scored = scored_by(trainer, problems, completions)
    for i, (prompt, spans) in enumerate(zip(PROMPTS, SPANS)):
        card = CARDS[fmt](saved[fmt], prompt, [s for s in spans if s])
        ends = [len("".join(spans[: k + 1])) - 1 for k, s in enumerate(spans) if s]  # one token per character
        ends[-1] += 1  # the last step ends at the eos after it
        assert scored.reward_mask[i].nonzero().flatten().tolist() == ends
        assert scored.rewards[i, ends].tolist() == pytest.approx(card, rel=1e-4, abs=1e-7)


def test_cli_scores_and_searches_with_a_public_prm(saved, tmp_path, capsys) -> None:
    from creditrl.cli import main

    completion = "".join(SPANS[0])
    assert main(["prm", "score", saved["rlhflow"], "--prompt", PROMPTS[0], "--completion", completion]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    card = _card_rlhflow(saved["rlhflow"], PROMPTS[0], SPANS[0])
    assert [line.split()[1] for line in lines] == SPANS[0]
    assert [float(line.split()[0]) for line in lines] == pytest.approx(card, abs=5e-5)  # printed to 4 places
    sets = [
        "train.init=policy",
        "policy.model=tiny",
        "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
        "search.method=beam",
        "search.problems=2",
        "search.budget=60",
        "search.max_new_tokens=20",
        f"search.prm={saved['math_shepherd']}",
        "prm.format=math_shepherd",
    ]
    out = tmp_path / "beam.json"
    assert main(["search", *[x for kv in sets for x in ("--set", kv)], "--out", str(out)]) == 0
    capsys.readouterr()
    rows = json.loads(out.read_text())["problems"]
    assert len(rows) == 2 and all(1 <= r["tokens"] <= 60 for r in rows)
    bare = tmp_path / "bare"
    bare.mkdir()
    argv = [x for kv in [*sets[:-2], f"search.prm={bare}"] for x in ("--set", kv)]
    assert main(["search", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matches no PRM convention" in err


CUSTOM_HEAD = '''
import torch
from torch import nn
from transformers import Qwen2Model, Qwen2PreTrainedModel


class Qwen2ForProcessRewardModel(Qwen2PreTrainedModel):
    """A backbone and a two-layer head with 2 outputs per token, returned as a tuple."""

    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen2Model(config)
        hidden = config.hidden_size
        self.score = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        states = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return (self.score(states),)
'''


def test_a_qwen_prm_with_its_own_head_code_is_detected_and_read(saved, tmp_path) -> None:
    """Qwen2.5-Math-PRM ships its head as code (config.json's auto_map): it is detected from its
    architecture name and loaded from that code, and scores as the card reads it."""
    import sys

    from transformers import AutoModel

    path = tmp_path / "qwen_custom"
    path.mkdir()
    (path / "modeling_prm.py").write_text(CUSTOM_HEAD)
    sys.path.insert(0, str(path))
    try:
        from modeling_prm import Qwen2ForProcessRewardModel
    finally:
        sys.path.remove(str(path))
    source = AutoModelForTokenClassification.from_pretrained(saved["qwen_prm"])
    torch.manual_seed(1)
    model = Qwen2ForProcessRewardModel(source.config)
    model.config.auto_map = {"AutoModel": "modeling_prm.Qwen2ForProcessRewardModel"}
    _save(path, model, AutoTokenizer.from_pretrained(saved["qwen_prm"]))
    assert detect_format(path) == "qwen_prm"
    prm, tok = load_prm(str(path), "cpu")
    assert type(prm.model).__name__ == "Qwen2ForProcessRewardModel"  # its own head, not a stand-in
    card_model = AutoModel.from_pretrained(path, trust_remote_code=True)
    steps = [s for s in SPANS[0] if s]
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROMPTS[0]},
        {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
    ]
    ids = torch.tensor([tok.encode(tok.apply_chat_template(messages, tokenize=False))])
    with torch.no_grad():
        probs = card_model(input_ids=ids)[0].softmax(dim=-1)
    card = probs[0, ids[0] == tok.encode("<extra_0>")[0], 1].tolist()
    assert prm.score(tok, [(PROMPTS[0], steps)])[0] == pytest.approx(card, rel=1e-4, abs=1e-7)
