"""The prompt-length guard: a prompt over the tokenizer's limit (``rollout.max_prompt_tokens``, by
default the policy's context) is one PromptTooLong line naming its row, before any engine sees it;
a long prompt is counted piece by piece, never tokenised whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.policy.model import load_policy, policy_options
from creditrl.policy.tokenizer import (
    _PIECE,
    PromptTooLong,
    _pieces,
    build_char_tokenizer,
    encode_problem,
    encode_prompt,
    prompt_limit,
    set_prompt_limit,
)
from creditrl.tasks.base import Problem

ROOT = Path(__file__).resolve().parents[2]
REFUSED = (
    "over rollout.max_prompt_tokens={}; shorten it, or raise rollout.max_prompt_tokens (at most the policy's context)"
)


def limited(max_tokens: int, template: str | None = None):
    tok = build_char_tokenizer()
    tok.chat_template = template
    set_prompt_limit(tok, max_tokens)
    return tok


def refusal(fn, *args) -> str:
    with pytest.raises(PromptTooLong) as err:
        fn(*args)
    assert isinstance(err.value, ConfigError)  # the CLI prints it as one line
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_prompt_at_the_limit_passes_and_one_token_more_is_refused():
    tok = limited(10)  # bos + one token per character
    assert encode_prompt(tok, "x" * 9) == [tok.bos_token_id] + tok("x" * 9, add_special_tokens=False)["input_ids"]
    assert refusal(encode_prompt, tok, "x" * 10) == f"the prompt is 11 tokens, {REFUSED.format(10)}"


def test_the_chat_templates_tokens_count():
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    tok = limited(30, template)
    rendered = "<user>" + "x" * 13 + "<assistant>"  # 30 characters, 30 tokens
    assert len(encode_prompt(tok, "x" * 13)) == len(rendered) == 30
    assert refusal(encode_prompt, tok, "x" * 14) == f"the prompt is 31 tokens, {REFUSED.format(30)}"


def test_without_a_limit_nothing_is_refused():
    tok = build_char_tokenizer()
    assert prompt_limit(tok) is None and len(encode_prompt(tok, "x" * 5000)) == 5001


def test_pieces_rejoin_and_cut_after_whitespace():
    text = ("word " * 40_000) + "x" * (3 * _PIECE)
    pieces = _pieces(text)
    assert "".join(pieces) == text and all(len(p) <= _PIECE for p in pieces)
    assert all(p.endswith(" ") for p in pieces[:3]) and pieces[4] == "x" * _PIECE


def test_a_50_mb_prompt_is_refused_without_tokenising_it_whole():
    # unguarded, the character tokenizer took 805 MB for a 2 MB prompt (measured), so 50 MB would take ~20 GB
    probe = (
        "import resource\n"
        "from creditrl.policy.tokenizer import PromptTooLong, build_char_tokenizer, encode_prompt, set_prompt_limit\n"
        "tok = build_char_tokenizer()\n"
        "set_prompt_limit(tok, 2048)\n"
        "text = 'x' * (50 * 2**20)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    encode_prompt(tok, text)\nexcept PromptTooLong as exc:\n    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    error, growth = run.stdout.strip().splitlines()
    # one piece of 65536 characters, + bos
    assert error == f"the prompt is at least {_PIECE + 1} tokens ({50 * 2**20} characters), {REFUSED.format(2048)}"
    assert int(growth) < 2**28  # one piece's tokens (measured: 73 MB, the 50 MB string's copy among them)


def test_a_problem_is_named_by_its_file_and_row_or_its_prompt():
    tok = limited(8)
    jsonl = Problem("x" * 8, "1", "1", meta={"file": "data/m.jsonl", "row": 7})
    assert refusal(encode_problem, tok, jsonl) == f"data/m.jsonl, line 7: the prompt is 9 tokens, {REFUSED.format(8)}"
    parquet = Problem("x" * 8, "1", "1", meta={"file": "data/m.parquet", "row": 3})
    assert refusal(encode_problem, tok, parquet).startswith("data/m.parquet, row 3: the prompt is 9 tokens")
    bare = Problem("What is   1+1? " * 3, "2", "2")
    assert refusal(encode_problem, limited(20), bare).startswith(
        "the problem whose prompt starts 'What is 1+1? What is 1+1? What is': the prompt is 46 tokens"
    )


def test_load_policy_sets_the_limit_from_the_config_or_the_context():
    _, tok = load_policy("tiny")
    assert prompt_limit(tok) == 2048  # the tiny preset's max_position_embeddings
    _, tok = load_policy("tiny", **policy_options(load_config(None, ["rollout.max_prompt_tokens=100"])))
    assert prompt_limit(tok) == 100
    with pytest.raises(ConfigError, match="rollout.max_prompt_tokens: must be >= 0, got -1"):
        load_config(None, ["rollout.max_prompt_tokens=-1"])


def test_creditrl_train_on_a_long_prompt_prints_one_line(tmp_path, capsys, monkeypatch):
    from creditrl.cli import main

    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    rows[2]["question"] = "What is " + "1 + " * 30 + "1?"
    data = tmp_path / "m.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--set", "task.name=math", "--set", f"task.args.train_file={data}"]
    argv += ["--set", "rollout.max_prompt_tokens=40", "--set", "train.init=policy", "--run-dir", "run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # "Q: " + question + " A: " and bos: 3 + 130 + 4 + 1 tokens
    assert err.splitlines()[-1] == (
        f"creditrl: error: {data.resolve()}, line 3: the prompt is 138 tokens, {REFUSED.format(40)}"
    )
