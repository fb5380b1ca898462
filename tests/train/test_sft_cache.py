"""The SFT cache: configs that differ only in their RL task share one SFT's weights, each with its
own held-out report; other SFT settings train anew; entries written before the sharing are read as is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.policy.model import load_policy, policy_options
from creditrl.tasks import make_task
from creditrl.train import sft
from creditrl.train.checkpoint import verify_checkpoint
from creditrl.train.sft import cached_sft, heldout_report, recipe_key, sft_key, start_outcomes

TINY = [
    "task.name=chain",
    "task.args={min_steps: 1, max_steps: 1, modulus: 5}",
    "sft.task_args={min_steps: 1, max_steps: 2}",
    "sft.steps=5",
    "sft.batch_size=4",
    "sft.warmup_steps=1",
    "train.eval_size=8",
    "rollout.max_new_tokens=16",
    "train.progress=false",
]
OTHER_TASK = TINY + ["task.args={min_steps: 1, max_steps: 1, modulus: 4}"]  # same sft.task_args


def _forbid(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} called")

    monkeypatch.setattr(sft, name, fail)


def _count_training(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = sft.train_sft

    def counted(cfg, out_dir, **kwargs):
        calls.append(Path(out_dir))
        return real(cfg, out_dir, **kwargs)

    monkeypatch.setattr(sft, "train_sft", counted)
    return calls


def _state(path: Path) -> dict:
    return json.loads((path / "trainer_state.json").read_text())


def test_configs_differing_only_in_the_rl_task_share_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path))
    first_cfg, other_cfg = load_config(overrides=TINY), load_config(overrides=OTHER_TASK)
    assert sft_key(first_cfg) != sft_key(other_cfg) and recipe_key(first_cfg) == recipe_key(other_cfg)
    for choice in ("policy.engine=hf", "policy.kernels=torch", "policy.forward=hf"):  # not what SFT runs
        assert sft_key(load_config(overrides=TINY + [choice])) == sft_key(first_cfg)
        assert recipe_key(load_config(overrides=TINY + [choice])) == recipe_key(first_cfg)

    with monkeypatch.context() as mp:
        calls = _count_training(mp)
        first, first_metrics = cached_sft(first_cfg, progress=False)
    assert calls == [first] and first == tmp_path / "sft" / sft_key(first_cfg)
    assert (tmp_path / "sft-recipes" / recipe_key(first_cfg)).read_text() == first.name
    assert first_metrics["sft/steps"] == 5 and set(first_metrics) == {
        "sft/steps",
        "sft/final_loss",
        "sft/time_s",
        "eval/accuracy",
        "eval/step_accuracy",
    }

    with monkeypatch.context() as mp:
        _forbid(mp, "train_sft")  # the second config must not train
        other, other_metrics = cached_sft(other_cfg, progress=False)
    assert other == tmp_path / "sft" / sft_key(other_cfg) != first
    assert (other / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()
    assert sorted(f.name for f in other.iterdir()) == sorted(f.name for f in first.iterdir())
    assert {k: v for k, v in other_metrics.items() if k.startswith("sft/")} == {
        k: v for k, v in first_metrics.items() if k.startswith("sft/")
    }
    # its own held-out report: that of the shared weights on the second config's task ('-' chains)
    model, tokenizer = load_policy(str(other), **policy_options(other_cfg))
    own = heldout_report(other_cfg, model, tokenizer, make_task("chain", **other_cfg.task.args))
    assert _state(other)["heldout_correct"] == own.pop("eval/correct")
    assert {k: v for k, v in other_metrics.items() if k.startswith("eval/")} == own
    assert verify_checkpoint(other) is None and verify_checkpoint(first) is None  # each its own manifest
    assert set(other_metrics) == set(first_metrics)
    assert _state(other)["metrics"] == other_metrics and _state(other)["sft"] == _state(first)["sft"]
    assert _state(first)["metrics"] == first_metrics  # the source entry's report is left alone
    assert not list((tmp_path / "sft").glob("*.tmp"))

    with monkeypatch.context() as mp:  # both entries now read back: no training, no report
        _forbid(mp, "train_sft")
        _forbid(mp, "heldout_report")
        assert cached_sft(other_cfg, progress=False) == (other, other_metrics)
        assert cached_sft(first_cfg, progress=False) == (first, first_metrics)

    steps_cfg = load_config(overrides=OTHER_TASK + ["sft.steps=6"])  # another recipe: trains anew
    assert recipe_key(steps_cfg) != recipe_key(other_cfg)
    with monkeypatch.context() as mp:
        calls = _count_training(mp)
        again, again_metrics = cached_sft(steps_cfg, progress=False)
    assert calls == [again] and again not in (first, other) and again_metrics["sft/steps"] == 6
    assert (again / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()

    # a start kept elsewhere (here: the 6-step recipe's weights) replaces what the cache holds, untrained
    kept = tmp_path / "kept"
    sft.keep_start(again, kept)
    with monkeypatch.context() as mp:
        _forbid(mp, "train_sft")
        path, metrics = cached_sft(other_cfg, progress=False, weights=kept)
        assert (
            path == other and (other / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
        )
        assert metrics["sft/steps"] == 6 and verify_checkpoint(other) is None and verify_checkpoint(kept) is None
        _forbid(mp, "heldout_report")
        assert cached_sft(other_cfg, progress=False, weights=kept) == (other, metrics)  # now the cached entry


def test_an_entry_in_the_old_layout_is_used_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry written before recipes existed (``<sft_key>/trainer_state.json``, no pointer under
    ``sft-recipes/``) is returned with its stored metrics: nothing is trained, linked or re-evaluated."""
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path))
    cfg = load_config(overrides=TINY)
    entry = tmp_path / "sft" / sft_key(cfg)
    source = tmp_path / "elsewhere"
    sft.train_sft(cfg, source, progress=False)
    shutil.copytree(source, entry)
    stored = {"sft/steps": 5, "sft/final_loss": 1.5, "sft/time_s": 2.0, "eval/accuracy": 0.125}
    state = _state(entry)
    state["metrics"] = stored
    del state["heldout_correct"]  # not kept before grids checked their starts
    (entry / "trainer_state.json").write_text(json.dumps(state))
    assert not (tmp_path / "sft-recipes").exists()

    _forbid(monkeypatch, "train_sft")
    _forbid(monkeypatch, "heldout_report")
    _forbid(monkeypatch, "_link_entry")
    path, metrics = cached_sft(cfg, progress=False)
    assert (path, metrics) == (entry, stored)
    assert _state(entry)["metrics"] == stored
    assert [p.name for p in (tmp_path / "sft").iterdir() if p.is_dir()] == [entry.name]  # no copy

    # its held-out outcomes (a grid's check of its start) are evaluated once and stored, the manifest kept true
    monkeypatch.undo()
    model, tokenizer = load_policy(str(entry), **policy_options(cfg))
    outcomes = heldout_report(cfg, model, tokenizer, make_task(cfg.task.name, **cfg.task.args))["eval/correct"]
    assert start_outcomes(cfg, entry) == outcomes == _state(entry)["heldout_correct"]
    assert verify_checkpoint(entry) is None and outcomes.startswith(f"{cfg.train.eval_size}:")
    _forbid(monkeypatch, "heldout_report")
    assert start_outcomes(cfg, entry) == outcomes  # read back


@pytest.mark.parametrize("kept", [True, False], ids=["kept start", "same-recipe entry"])
def test_an_entry_stopped_before_its_report_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """A new entry linked from a start of the same recipe (kept in a repository, or cached for another
    RL task) appears only with its own held-out report: a process stopped while evaluating leaves no
    entry carrying the source's outcomes on another task, which a grid's start check would then read
    as this task's and refuse runs that began from these very weights."""
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path))
    first_cfg, other_cfg = load_config(overrides=TINY), load_config(overrides=OTHER_TASK)
    first, _ = cached_sft(first_cfg, progress=False)
    weights = None
    if kept:
        weights = tmp_path / "kept"
        sft.keep_start(first, weights)
        shutil.rmtree(first)
    entry = tmp_path / "sft" / sft_key(other_cfg)

    class Stopped(BaseException):  # as SIGTERM stops a grid: not an Exception a caller might handle
        pass

    def stopped(*args, **kwargs):
        raise Stopped

    with monkeypatch.context() as mp:
        _forbid(mp, "train_sft")
        mp.setattr(sft, "heldout_report", stopped)
        with pytest.raises(Stopped):
            cached_sft(other_cfg, progress=False, weights=weights)
    assert not (entry / "trainer_state.json").exists()

    with monkeypatch.context() as mp:
        _forbid(mp, "train_sft")
        path, metrics = cached_sft(other_cfg, progress=False, weights=weights)
    model, tokenizer = load_policy(str(path), **policy_options(other_cfg))
    own = heldout_report(other_cfg, model, tokenizer, make_task("chain", **other_cfg.task.args))
    assert path == entry and start_outcomes(other_cfg, entry) == own.pop("eval/correct")
    assert {k: v for k, v in metrics.items() if k.startswith("eval/")} == own
    assert verify_checkpoint(entry) is None and not list((tmp_path / "sft").glob("*.tmp"))

    # an entry an older creditrl left that way (its state holding the source's outcomes on another task)
    # is evaluated again by a grid's start check before it refuses the runs that began from these weights
    from creditrl.experiments.starts import _check_start

    truth, state = _state(entry)["heldout_correct"], _state(entry)
    count, _, digits = truth.partition(":")
    state["heldout_correct"] = f"{count}:{int(digits[0], 16) ^ 8:x}{digits[1:]}"  # another task's, as it were
    sft._write_state(entry, state)
    summary = tmp_path / "seed0.json"
    summary.write_text(
        json.dumps({"version": 1, "evals": [{"iteration": 0, "eval/correct": truth, "eval/accuracy": 0.5}]})
    )
    _check_start(other_cfg, entry, [summary])
    assert _state(entry)["heldout_correct"] == truth and verify_checkpoint(entry) is None
