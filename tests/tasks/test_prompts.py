"""Prompts as TRL users keep them: text or conversational prompt columns, messages with the
assistant's reply as the SFT solution, completion columns, system prompts for any task, and
datasets folders and hub names as sources."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.policy.model import build_tiny
from creditrl.policy.tokenizer import encode_problem
from creditrl.tasks import make_task
from creditrl.tasks.datafile import DataFileError
from creditrl.tasks.prompts import read_prompt
from creditrl.train.resolve import run_task, task_args
from creditrl.train.sft import sft_batch

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
SYSTEM = {"role": "system", "content": "Answer briefly."}


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_read_prompt_takes_text_or_turns_and_a_final_reply() -> None:
    assert read_prompt("Q: 2+2?") == ("Q: 2+2?", (), None)
    turns = [SYSTEM, _user("2+2?")]
    assert read_prompt(turns) == ("2+2?", (("system", "Answer briefly."), ("user", "2+2?")), None)
    reply = read_prompt([*turns, {"role": "assistant", "content": " 4"}])
    assert reply.text == "2+2?" and len(reply.messages) == 2 and reply.solution == " 4"


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ([], r"expected text or a non-empty list of \{role, content\} turns, got \[\]"),
        ([{"role": "robot", "content": "x"}], "turn 1: role 'robot' is not one of system, user, assistant"),
        ([_user("x"), {"role": "user", "content": 3}], "turn 2: content must be text, got int"),
        ([SYSTEM], "the conversation must end in a user turn"),
        ([_user("x"), "hello"], "turn 2: expected an object with 'role' and 'content', got str"),
        ("  ", "is empty"),
    ],
)
def test_read_prompt_says_what_is_wrong(cell, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_prompt(cell)


def test_a_text_prompt_column_is_used_as_it_is_with_the_other_columns_kept(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "Add: 2+2 =", "answer": "4", "level": 1}] * 3)
    task = make_task("math", train_file=path, heldout_file=path)
    p = task.pools["train"][0]
    assert p.prompt == "Add: 2+2 =" and p.messages == () and p.solution == " \\boxed{4}"
    assert p.meta["level"] == 1 and p.meta["question"] == "Add: 2+2 ="  # TRL reward functions get the columns


def test_a_conversational_prompt_renders_through_the_chat_template(tmp_path: Path) -> None:
    rows = [{"prompt": [SYSTEM, _user("What is 2+2?")], "answer": "4"}]
    task = make_task("math", train_file=_jsonl(tmp_path / "c.jsonl", rows), heldout_file=str(tmp_path / "c.jsonl"))
    p = task.pools["train"][0]
    assert p.prompt == "What is 2+2?" and p.messages == (("system", "Answer briefly."), ("user", "What is 2+2?"))
    _, tok = build_tiny(0)
    plain = tok.decode(encode_problem(tok, p))  # no template: bos + the contents
    assert plain == "<bos>Answer briefly. What is 2+2?"  # the character tokenizer has no newline
    tok.chat_template = TEMPLATE
    assert tok.decode(encode_problem(tok, p)) == "<system>Answer briefly.|<user>What is 2+2?|<assistant>"


def test_messages_with_the_reply_are_sft_data(tmp_path: Path) -> None:
    """A messages row's final assistant turn is the solution the warm start learns; a completion
    column (text or assistant turns) is one too."""
    rows = [
        {"messages": [_user("1+1?"), {"role": "assistant", "content": " 2"}], "answer": "2"},
        {"prompt": "3+1?", "completion": [{"role": "assistant", "content": " 4"}], "answer": "4"},
        {"prompt": "1+2?", "completion": " 3", "answer": "3"},
    ]
    path = _jsonl(tmp_path / "s.jsonl", rows)
    problems = make_task("math", train_file=path, heldout_file=path).pools["train"]
    assert [(p.prompt, p.solution, p.messages) for p in problems] == [
        ("1+1?", " 2", (("user", "1+1?"),)),  # a conversation stays one (reward functions get its turns)
        ("3+1?", " 4", ()),
        ("1+2?", " 3", ()),
    ]
    _, tok = build_tiny(0)
    ids, _, labels = sft_batch(tok, problems[:1])
    learnt = [t for t in labels[0].tolist() if t != -100]
    assert tok.decode(ids[0]).startswith("<bos>1+1? 2<eos>") and tok.decode(learnt) == " 2<eos>"


def test_bad_turns_in_a_file_name_the_file_line_and_field(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "b.jsonl", [{"prompt": "1?", "answer": "1"}, {"prompt": [_user("x"), SYSTEM], "answer": "1"}]
    )
    with pytest.raises(DataFileError) as err:
        make_task("math", train_file=path)
    resolved = Path(path).resolve()
    assert str(err.value) == (
        f"{resolved}, line 2: field 'prompt': the conversation must end in a user turn (or a user turn and the "
        "assistant's reply)"
    )
    path = _jsonl(tmp_path / "c.jsonl", [{"prompt": "1?", "completion": [_user("no")], "answer": "1"}])
    with pytest.raises(DataFileError, match="line 1: field 'completion': expected text or assistant turns only$"):
        make_task("math", train_file=path)


def test_a_system_prompt_is_any_tasks_and_a_rows_own_one_wins(tmp_path: Path) -> None:
    plain = make_task("arithmetic", min_ops=1, max_ops=2)
    task = make_task("arithmetic", min_ops=1, max_ops=2, system_prompt="Show each step.")
    a, b = plain.sample(4, split="train", seed=3), task.sample(4, split="train", seed=3)
    assert [p.prompt for p in a] == [p.prompt for p in b]  # the checkers still read the task's prompt
    assert all(p.messages == (("system", "Show each step."), ("user", p.prompt)) for p in b)
    assert task.check_steps(b[0], [b[0].solution]) == plain.check_steps(a[0], [a[0].solution])
    assert task.step_separator == plain.step_separator and task.name == "arithmetic"
    path = _jsonl(tmp_path / "own.jsonl", [{"prompt": [SYSTEM, _user("2+2?")], "answer": "4"}])
    own = make_task("math", train_file=path, heldout_file=path, system_prompt="Other.")
    assert own.sample(1, split="train", seed=0)[0].messages[0] == ("system", "Answer briefly.")
    with pytest.raises(ValueError, match="system_prompt must be non-empty text"):
        make_task("arithmetic", system_prompt=" ")


def test_a_save_to_disk_folder_is_a_source(tmp_path: Path) -> None:
    rows = [{"prompt": [_user(f"{i}+1?")], "answer": str(i + 1)} for i in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    task = make_task("math", train_file=str(tmp_path / "ds"), heldout_file=str(tmp_path / "ds"), heldout_split="train")
    assert [p.prompt for p in task.pools["train"]] == ["0+1?", "1+1?", "2+1?", "3+1?"]
    with pytest.raises(DataFileError, match=r"ds: no split 'test' \(splits: train\)$"):
        make_task("math", train_file=str(tmp_path / "ds"), train_split="test")


def test_hub_names_follow_policy_local_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    over = ["task.name=math", "task.args={train_file: someone/math-prompts}"]
    with pytest.raises(
        ConfigError,
        match=(
            "^task.args: someone/math-prompts: no such file or dataset folder; a hub dataset name needs "
            "local_files_only=false$"
        ),
    ):
        run_task(load_config(overrides=over))
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"question": "1+1?", "answer": "2"}] * 5)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = load_config(overrides=[*over, "policy.local_files_only=false"])
    assert task_args(cfg)["local_files_only"] is False
    assert len(run_task(cfg).pools["train"]) + len(run_task(cfg).pools["heldout"]) == 5
    assert calls[0] == ("someone/math-prompts", None, "train")
    assert "local_files_only" not in task_args(load_config())  # the arithmetic task takes no such argument
