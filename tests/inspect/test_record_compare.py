"""Recording a batch, re-running estimators on it offline, and the inspector's input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from creditrl.config import ConfigError, load_config
from creditrl.inspect import record as record_mod
from creditrl.inspect.compare import TRAINED, compare_iteration, parse_estimators, recompute
from creditrl.inspect.data import InspectError, load_iteration, saved_iterations, spread
from creditrl.inspect.html import iteration_view, render_page
from creditrl.inspect.record import (
    InspectSettings,
    choose_groups,
    iteration_record,
    record_iteration,
    should_record,
    step_spans,
)
from creditrl.inspect.report import build_report
from creditrl.policy.engines import Generation
from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rollout.batch import batch_from_generation
from creditrl.tasks import make_task
from creditrl.train import stages
from creditrl.train.plan import CreditSettings
from creditrl.train.resolve import checked

TASK = ["task.args={min_ops: 2, max_ops: 2, operand_min: 1, operand_max: 9, operators: '+-'}"]


def variants(solution: str, answer: str) -> list[str]:
    """Four completions: right; right steps but a wrong answer; a wrong first step; garbage."""
    steps = solution.split(";")
    lhs, rhs = steps[0].split("=")
    wrong_first = ";".join([f"{lhs}={int(rhs) + 1}"] + steps[1:])
    return [solution, solution.rsplit("#", 1)[0] + f"#{int(answer) + 1}", wrong_first, "7;#0"]


def scored_batch(overrides: list[str], *, all_right_group: bool = True, values_seed: int | None = None):
    cfg = checked(load_config(overrides=TASK + overrides))
    task, tok = make_task(cfg.task.name, **cfg.task.args), build_char_tokenizer()
    problems = task.sample(3, split="train", seed=0)
    texts, index = [], []
    for i, p in enumerate(problems):
        group = [p.solution] * 4 if (all_right_group and i == 0) else variants(p.solution, p.answer)
        texts += group
        index += [i] * len(group)
    tokens = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    gen = Generation(
        index,
        [[tok.bos_token_id] + tok(problems[i].prompt, add_special_tokens=False)["input_ids"] for i in index],
        tokens,
        [[0.0] * len(t) for t in tokens],
        [True] * len(tokens),
    )
    batch = batch_from_generation(gen, index, tok.pad_token_id)
    batch.extras.update(problems=[problems[i] for i in index], completions=texts)
    scored = stages.Scorer(stages.ScoreSettings.of(cfg), task, tok)(
        batch, progress=0.0, generator=torch.Generator().manual_seed(0)
    )
    values = None
    if values_seed is not None:
        values = torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(values_seed))
    adv, ret = stages.credit(batch, scored, CreditSettings.of(cfg), values=values)
    return cfg, task, tok, batch, scored, values, adv, ret


CONFIGS = {
    "outcome-grpo": ["credit.estimator=grpo"],
    "steps-grpo_process-group": [
        "reward.source=oracle_steps",
        "credit.estimator=grpo_process",
        "credit.normaliser=group",
    ],
    "steps-rloo-token": [
        "reward.source=oracle_steps",
        "reward.granularity=token",
        "credit.estimator=rloo",
        "credit.gamma=0.9",
    ],
    "gae-critic": [
        "reward.source=oracle_steps",
        "credit.estimator=gae",
        "value.source=critic",
        "credit.lam=0.8",
        "credit.gamma=0.95",
    ],
    "gae-mc-step": ["credit.estimator=gae", "value.source=mc", "credit.lam=0.0"],
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_recompute_reproduces_the_runs_advantages(name: str) -> None:
    values_seed = 1 if "gae" in name else None
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch(CONFIGS[name], values_seed=values_seed)
    cfg = cfg.updated({"train": {"inspect_groups": 3}})
    rec = json.loads(
        json.dumps(iteration_record(4, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task, values=values))
    )
    assert rec["settings"]["resolution"] == ("step" if "mc" in name else "token")
    rows = [r["row"] for g in rec["groups"] for r in g["responses"]]
    again = recompute(rec, cfg.credit.estimator)
    for i, row in enumerate(rows):
        n = int(batch.response_lengths[row])
        assert torch.equal(again[i, :n], adv[row, :n]), (name, row)  # float32 round trip: bit for bit
        saved = torch.tensor(rec["groups"][i // 4]["responses"][i % 4]["adv"], dtype=torch.float32)
        assert torch.equal(saved, adv[row, :n])  # the shortest decimals read back as the same float32


def test_saved_response_contents() -> None:
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch(["reward.source=oracle_steps"])
    cfg = cfg.updated({"train": {"inspect_groups": 1}})
    rec = iteration_record(2, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)
    (g,) = rec["groups"]
    assert g["group_id"] == 1  # group 0 is all right (no mixed outcomes), so group 1 comes first
    right, wrong_answer, wrong_first, garbage = g["responses"]
    assert right["labels"] == [True, True, True] and right["outcome"] == 1.0
    assert wrong_answer["labels"] == [True, True, False] and wrong_answer["outcome"] == 0.0
    assert wrong_first["labels"] == [False, False, True]  # the answer is judged on its own
    assert garbage["completion"] == "7;#0" and garbage["steps"] == [[0, 1], [2, 4]]
    assert garbage["special"] == {"4": "<eos>"} and garbage["texts"][4] == ""
    last = len(right["texts"]) - 1  # the segmenter closes the final step on the last token
    assert right["step_ends"] == [i for i, t in enumerate(right["texts"]) if t == ";"] + [last]
    assert right["reward_mask"] == right["step_ends"]  # one oracle reward per step
    assert right["values"] is None and right["credit_step_ends"] is None and right["kept"]


def test_choose_groups_and_schedule() -> None:
    ids, outcome = torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    assert choose_groups(ids, outcome, 2) == [1, 0]
    assert choose_groups(ids, outcome, 5) == [1, 0, 2]
    assert [i for i in range(1, 26) if should_record(i, 10, 25)] == [1, 10, 20, 25]
    assert not any(should_record(i, 0, 25) for i in range(1, 26))
    assert step_spans([2, 5], 8) == [[0, 2], [3, 5], [6, 7]] and step_spans([3], 4) == [[0, 3]]
    assert spread(list(range(1, 101)), 5, must=37) == [1, 26, 37, 51, 75, 100]


def test_files_are_bounded_and_written_on_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch([])
    cfg = cfg.updated({"train": {"inspect_groups": 3, "inspect_every": 2, "iterations": 5}})
    first = int(batch.response_lengths[batch.group_ids == 1].sum())
    monkeypatch.setattr(record_mod, "MAX_TOKENS_PER_FILE", first + 1)  # room for one group only
    for it in range(1, 6):
        record_iteration(tmp_path, it, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)
    assert saved_iterations(tmp_path) == [1, 2, 4, 5]
    assert [g["group_id"] for g in load_iteration(tmp_path, 4)["groups"]] == [1]
    assert not list((tmp_path / "inspect").glob("*.tmp"))


def test_estimators_needing_values_are_marked_unavailable() -> None:
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch([])
    rec = iteration_record(1, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)
    out = compare_iteration(rec, ["grpo", "gae", "reinforce"])
    assert list(out) == [TRAINED, "grpo", "gae", "reinforce"]
    assert not out["gae"]["available"] and "needs values" in out["gae"]["reason"] and out["gae"]["adv"] is None
    assert out["grpo"]["adv"] == out[TRAINED]["adv"]
    # reinforce: A = reward-to-go = the outcome on every token of a sequence-level reward
    for g, advs in zip(rec["groups"], out["reinforce"]["adv"]):
        for r, a in zip(g["responses"], advs):
            assert set(a) == {r["outcome"]}


def test_bad_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InspectError, match="no such run directory"):
        saved_iterations(tmp_path / "missing")
    with pytest.raises(InspectError, match="train.inspect_every"):
        saved_iterations(tmp_path)
    (tmp_path / "inspect").mkdir()
    (tmp_path / "inspect" / "iter_000003.json").write_text("{}")
    with pytest.raises(InspectError, match="iteration 7 was not saved; saved iterations: 3"):
        load_iteration(tmp_path, 7)
    with pytest.raises(InspectError, match="unknown estimator 'nope'; valid: dr_grpo, gae, grpo"):
        parse_estimators("grpo,nope", "grpo")
    assert parse_estimators(None, "rloo")[0] == "rloo" and len(parse_estimators(None, "rloo")) == 8
    for key in ("train.inspect_every", "train.inspect_groups"):
        with pytest.raises(ConfigError, match=key):
            load_config(overrides=[f"{key}=-1"])
    assert (load_config().train.inspect_every, load_config().train.inspect_groups) == (10, 2)


def test_page_is_self_contained_and_escapes_token_text() -> None:
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch([])
    rec = json.loads(json.dumps(iteration_record(1, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)))
    rec["groups"][0]["responses"][0]["texts"][0] = "</script><script>alert(1)</script>"
    data = {"run": "r", "initial": 0, "iterations": [iteration_view(rec, ["grpo"])], "metrics": [], "charts": []}
    page = render_page(data)
    assert page.count("</script>") == 2  # the data block's and the code block's own
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert "<link" not in page and " src=" not in page


def test_a_group_without_reward_spread_says_why() -> None:
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch([])  # group 0: four right completions
    cfg = cfg.updated({"train": {"inspect_groups": 3}})
    rec = json.loads(json.dumps(iteration_record(1, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)))
    view = iteration_view(rec, ["grpo", "reinforce"])
    assert [(g["group_id"], g["spread"]) for g in view["groups"]] == [(1, True), (2, True), (0, False)]
    assert view["groups"][2]["spread_note"] == "no reward spread: all 4 completions scored 1"
    assert [g["spread_note"] for g in view["groups"][:2]] == ["", ""]
    assert view["spread"] == {"none": 1, "groups": 3, "text": "1 of 3 saved groups has no reward spread"}
    for key in (TRAINED, "grpo"):
        *mixed, flat = view["estimators"][key]["precision"]["groups"]
        assert flat == {
            "value": None,
            "text": "n/a",
            "why": "no reward spread: all 4 completions scored 1, so every advantage is 0",
            "short": "no reward spread",
            "note": "",
        }
        assert all(p["value"] is not None and p["why"] == p["short"] == p["note"] == "" for p in mixed)
    flat = view["estimators"]["reinforce"]["precision"]["groups"][2]  # A = 1 on every token: credit, none negative
    assert flat["why"] == "no negative credit on a labelled step"
    assert flat["note"] == (
        "no reward spread: all 4 completions scored 1; every advantage is 1, so the credit does not tell them apart"
    )
    # batch whitening moves the group's zeros to one shared value, which tells nothing apart either
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch(["credit.normaliser=batch"])
    cfg = cfg.updated({"train": {"inspect_groups": 3}})
    rec = json.loads(json.dumps(iteration_record(1, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)))
    note = iteration_view(rec, [])["estimators"][TRAINED]["precision"]["groups"][2]["note"]
    assert note.startswith("no reward spread: all 4 completions scored 1; every advantage is -")


def test_report_can_open_on_groups_with_spread(tmp_path: Path) -> None:
    cfg, task, tok, batch, scored, values, adv, ret = scored_batch([])
    cfg = cfg.updated({"train": {"inspect_groups": 3}})
    record_iteration(tmp_path, 1, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task)
    for only in (False, True):
        report = build_report(tmp_path, estimators="grpo", out=tmp_path / f"r{only}", png=False, only_spread=only)
        page = report.html.read_text()
        blob = page.split('id="inspector-data">', 1)[1].split("</script>", 1)[0]
        data = json.loads(blob)
        assert data["only_spread"] is only and data["spread"] == {"none": 1, "groups": 3}
        assert 'id="spread-filter"' in page and 'id="spread-count"' in page


def test_cli_only_spread_opens_the_page_filtered(tmp_path: Path) -> None:
    from creditrl.cli import main

    cfg, task, tok, batch, scored, values, adv, ret = scored_batch([])
    record_iteration(
        tmp_path,
        1,
        batch,
        scored,
        adv,
        ret,
        InspectSettings.of(cfg.updated({"train": {"inspect_groups": 3}})),
        tok,
        task,
    )
    assert main(["inspect", str(tmp_path), "--out", str(tmp_path / "r"), "--no-png", "--only-spread"]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    data = json.loads(page.split('id="inspector-data">', 1)[1].split("</script>", 1)[0])
    assert data["only_spread"] is True
