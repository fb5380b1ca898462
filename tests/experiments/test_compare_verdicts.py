"""``creditrl compare``'s verdict lines (seed-level paired t, Holm over the arms judged, no verdict
without a learning signal), the diagnostics a run summary keeps per evaluation window, the grid's
``init``, and a grid anywhere starting from a kept start or the cache rather than training one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from creditrl.config import ConfigError
from creditrl.experiments.compare_report import verdict_lines, verdict_rows
from creditrl.experiments.demo import demo_config_path
from creditrl.experiments.grid import load_grid
from creditrl.experiments.grid_keys import KEY_HELP
from creditrl.experiments.summaries import diagnostic_windows, history, run_mean, run_summary
from creditrl.experiments.verdicts import detectable, holm
from creditrl.train.metrics import pack_outcomes, zero_spread_share

PROBLEMS = 20


def _runs(start: list[int], final: list[int], spread: float = 0.5) -> list[list[dict]]:
    """One history per seed: the start and the last evaluation with ``start[s]`` and ``final[s]``
    of the 20 problems right (the first ones), an iteration between them logging ``spread`` as
    its share of groups with zero reward spread."""

    def ev(it: int, right: int) -> dict:
        bits = [i < right for i in range(PROBLEMS)]
        return {"iteration": it, "eval/accuracy": right / PROBLEMS, "eval/correct": pack_outcomes(bits)}

    return [
        [ev(0, a), {"iteration": 1, "time/iter_s": 1.0, "reward/zero_spread_groups": spread}, ev(2, b)]
        for a, b in zip(start, final)
    ]


def test_zero_spread_share_counts_groups_whose_kept_rewards_are_all_equal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5 + 1e-8, 2.0, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3])
    keep = torch.ones(12, dtype=torch.bool)
    assert zero_spread_share(rewards, groups, keep) == 0.5  # groups 1 and 2 (within 1e-6)
    keep[2] = False  # group 0's only 0 dropped: all its kept rewards are 1
    assert zero_spread_share(rewards, groups, keep) == 0.75
    keep[10] = False  # group 3 keeps one response: no spread to learn from
    assert zero_spread_share(rewards, groups, keep) == 1.0
    assert zero_spread_share(rewards, groups, torch.zeros(12, dtype=torch.bool)) == 1.0


def test_verdicts_are_the_holm_adjusted_seed_level_t_and_skip_arms_without_signal():
    start = [4, 4, 4]
    results = {
        "ref": _runs(start, [8, 9, 10]),
        "up": _runs(start, [12, 12, 15]),  # +4, +3, +5 problems of 20: +0.20, +0.15, +0.25
        "flat": _runs(start, [7, 10, 10]),  # -0.05, +0.05, 0
        "silent": _runs(start, [16, 16, 16], spread=0.95),  # 95% of its groups gave no signal
    }
    rows = {r["arm"]: r for r in verdict_rows(results, "ref")}
    assert rows["ref"]["why"] == "reference" and rows["silent"]["why"] == "no signal"
    assert rows["silent"]["verdict"] is None and rows["silent"]["zero_spread"] == pytest.approx(0.95)
    diffs = {"up": np.array([0.20, 0.15, 0.25]), "flat": np.array([-0.05, 0.05, 0.0])}
    se = {k: d.std(ddof=1) / math.sqrt(3) for k, d in diffs.items()}
    p = {k: 2 * stats.t.sf(abs(d.mean()) / se[k], 2) if d.mean() else 1.0 for k, d in diffs.items()}
    adjusted, levels = holm([p["up"], p["flat"]])  # one family: the two arms judged, not the silent one
    assert levels == [0.975, 0.95]  # Holm rejects "up" at 0.05 / 2, then stops at "flat"
    for (arm, d), level, padj in zip(diffs.items(), levels, adjusted):
        got = rows[arm]["difference"]
        half = stats.t.ppf(1 - (1 - level) / 2, 2) * se[arm]
        assert got["mean"] == pytest.approx(d.mean(), abs=1e-12) and got["level"] == level
        assert (got["lo"], got["hi"]) == pytest.approx((d.mean() - half, d.mean() + half))
        assert got["mde"] == pytest.approx(detectable(se[arm], 2, level=level))
        assert got["p_holm"] == pytest.approx(padj) and got["family"] == 2
    assert rows["up"]["verdict"] == "better" and rows["flat"]["verdict"] == "no difference detectable"
    lines = verdict_lines(list(rows.values()), "ref")
    up = rows["up"]["difference"]
    assert lines == [
        "ref: the reference",
        f"up: better than ref, +20.0 points [+{100 * up['lo']:.1f}, +{100 * up['hi']:.1f}] (held-out accuracy at "
        "the last evaluation; seed-level paired t, 97.5% interval, Holm over 2 comparisons)",
        "flat: no difference detectable from ref, +0.0 points [-12.4, +12.4]; the smallest difference these 3 "
        f"seeds detect is {100 * rows['flat']['difference']['mde']:.1f} points (held-out accuracy at the last "
        "evaluation; seed-level paired t, 95% interval, Holm over 2 comparisons)",
        "silent: no verdict, no learning signal: its rewards had zero spread in 95% of its groups",
    ]
    assert stats.t.ppf(0.975, 2) * se["flat"] == pytest.approx(0.124, abs=5e-4)  # the [-12.4, +12.4] above


def test_no_verdict_when_no_arm_moved_and_none_from_one_seed():
    still = {"ref": _runs([4, 5], [4, 5]), "other": _runs([4, 5], [4, 5])}
    rows = verdict_rows(still, "ref")
    assert [r["why"] for r in rows] == ["reference", "none moved"] and not any(r["moved"] for r in rows)
    assert verdict_lines(rows, "ref")[-2:] == [
        "other: no verdict, no arm moved from the start",
        "no verdict: no arm moved from the start (every seed's held-out outcomes at the last evaluation equal its "
        "start's)",
    ]
    one = {"ref": _runs([4], [6]), "other": _runs([4], [9])}
    assert verdict_lines(verdict_rows(one, "ref"), "ref")[-1] == "other: no verdict, one seed gives no interval"
    # seeds still running: two runs each, one seed shared, so no interval; two shared seeds pair by seed
    apart = {"ref": _runs([4, 4], [6, 8]), "other": _runs([4, 4], [9, 12])}
    rows = verdict_rows(apart, "ref", {"ref": [0, 1], "other": [1, 2]})
    assert rows[1]["why"] == "one seed"
    three = {"ref": _runs([4, 4, 4], [6, 8, 7]), "other": _runs([4, 4], [12, 10])}  # other: seeds 2, 1
    rows = verdict_rows(three, "ref", {"ref": [0, 1, 2], "other": [2, 1]})
    d = rows[1]["difference"]  # +5 and +2 problems of 20 on seeds 2 and 1
    assert d["seeds"] == 2 and d["mean"] == pytest.approx((0.25 + 0.10) / 2)
    # every seed the same difference: the t has no spread, said so rather than a zero-width interval
    same = {"ref": _runs([4, 4], [6, 7]), "other": _runs([4, 4], [8, 9])}
    assert verdict_lines(verdict_rows(same, "ref"), "ref")[-1] == (
        "other: better than ref, +10.0 points on each of its 2 seeds: no spread between seeds to size an interval "
        "(held-out accuracy at the last evaluation; seed-level paired t, 95% interval, Holm over 1 comparison)"
    )


def test_a_summary_keeps_each_evaluation_windows_diagnostics_and_old_ones_still_read():
    merged = [  # a run's metrics rows, each evaluation merged into its iteration's row
        {"iteration": 0, "eval/accuracy": 0.1, "tokens/total": 0},
        {"iteration": 1, "time/iter_s": 1.0, "kl/ref": 0.1, "policy/entropy": 2.0, "response/length": 4.0},
        {"iteration": 2, "time/iter_s": 1.0, "kl/ref": 0.3, "policy/entropy": 1.0, "response/length": 6.0}
        | {"eval/accuracy": 0.2, "update/positions": 600.0},
        {"iteration": 3, "time/iter_s": 1.0, "kl/ref": 0.5, "response/length": 8.0, "loss/value": 1 / 3}
        | {"eval/accuracy": 0.3, "tokens/total": 120, "update/positions": 640.0},
    ]
    windows = diagnostic_windows(merged)
    assert windows == [
        {"iteration": 2, "iterations": 2, "kl/ref": 0.2, "policy/entropy": 1.5, "response/length": 5.0},
        {"iteration": 3, "iterations": 1, "loss/value": 0.333333, "kl/ref": 0.5, "response/length": 8.0},
    ]
    summary = run_summary(merged, {"arm": "a"}, {"threads": 1, "load": 0.5}, {"cpu_s": 12.5})
    assert summary["windows"] == windows
    assert summary["cost"] == {"generated_tokens": 120, "trained_positions": 1240, "cpu_s": 12.5}
    back = history(summary)
    assert back[2]["window/kl/ref"] == 0.2 and back[2]["window/iterations"] == 2
    assert run_mean(back, "kl/ref") == pytest.approx(0.3) == run_mean(merged, "kl/ref")  # (0.2 x 2 + 0.5) / 3
    assert run_mean(back, "value/explained_variance") is None
    old = {k: v for k, v in summary.items() if k not in ("windows", "cost")}  # a summary from before them
    assert history(old) == [{k: v for k, v in r.items() if not k.startswith("window/")} for r in back]


def test_the_update_counts_the_token_positions_it_forwards_and_backpropagates():
    """``update/positions``: every row's real prompt and generated tokens, once per PPO epoch, however
    the rows are cut into micro-batches; rows left out exactly (zero advantage) are not counted."""
    from creditrl.config import load_config
    from creditrl.policy.engines import HFEngine, SamplingParams
    from creditrl.policy.model import build_tiny
    from creditrl.rollout.batch import batch_from_generation
    from creditrl.train.update import update

    model, tok = build_tiny(0)
    prompts = [[tok.bos_token_id, *tok.encode(s, add_special_tokens=False)] for s in ["7+3=", "12*4-5=", "1=", "9-3="]]
    eos = tok.encode("#", add_special_tokens=False)[0]
    gen = HFEngine(model, eos_id=eos, pad_id=tok.pad_token_id).generate(
        prompts, 3, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(0)
    )
    batch = batch_from_generation(gen, gen.prompt_index, tok.pad_token_id)  # 4 prompts x 3 samples
    adv = torch.ones(batch.response_mask.shape)
    zero = batch.group_ids == 1
    adv[zero] = 0.0
    per_row = batch.prompt_mask.sum(-1) + batch.response_lengths

    def positions(skip: bool, micro: int) -> float:
        optim = {"skip_zero_advantage": skip, "minibatches": 2, "ppo_epochs": 2, "micro_batch_positions": micro}
        cfg = load_config(None, {"optim": optim})
        m = build_tiny(0)[0]
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        return update(m, opt, batch, adv, batch.response_mask, cfg, torch.Generator().manual_seed(4))[
            "update/positions"
        ]

    assert positions(False, 0) == positions(False, 40) == 2 * float(per_row.sum())
    assert positions(True, 40) == 2 * float(per_row[~zero].sum())


def test_a_grid_without_init_starts_as_train_init_auto_does(tmp_path: Path):
    body = "budget: {samples: 40}\narms: {a: []}\n"
    (tmp_path / "g.yaml").write_text(body)
    assert load_grid(tmp_path / "g.yaml").init == "sft"  # the embedded tiny preset needs its warm start
    (tmp_path / "g.yaml").write_text(f"set: [policy.model={tmp_path / 'mine'}]\n" + body)
    assert load_grid(tmp_path / "g.yaml").init == "policy"  # a model of the user's: as it is
    (tmp_path / "g.yaml").write_text("init: policy\n" + body)
    assert load_grid(tmp_path / "g.yaml").init == "policy"
    (tmp_path / "g.yaml").write_text("init: warm\n" + body)
    with pytest.raises(ConfigError, match="key 'init' must be auto, policy, sft or an existing checkpoint directory"):
        load_grid(tmp_path / "g.yaml")


def test_compare_help_lists_every_grid_key(capsys):
    from creditrl.cli import main

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = capsys.readouterr().out
    for key in KEY_HELP:
        assert f"\n  {key} " in text, key
    assert "docs/compare.md" in text and set(KEY_HELP) == {
        "name", "base", "set", "seeds", "budget", "target", "init", "sft_seeds", "reference", "arms", "grid",
    }  # fmt: skip


def test_a_grid_anywhere_starts_from_a_kept_start_or_the_cache_not_a_new_sft(tmp_path: Path, monkeypatch):
    """A grid file outside the checkout, of the same SFT recipe as a start the checkout keeps under
    findings/starts, starts from those weights on a machine with an empty cache; then from the
    cache entry they became; only with neither does SFT run."""
    from creditrl.config import load_config
    from creditrl.experiments.starts import any_start, known_starts
    from creditrl.train import sft

    base = demo_config_path(True)
    common = ["sft.steps=3", "sft.batch_size=4", "sft.warmup_steps=1", "train.eval_size=4", "train.progress=false"]
    said: list[str] = []
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache1"))
    trained = Path(any_start(base, common, [], said.append))
    assert said == [
        "start: supervised warm start of tiny, 3 steps (init: sft; init: policy starts RL from the model as it is)"
    ]
    repo = tmp_path / "repo"
    kept = repo / "findings" / "starts" / sft.recipe_key(load_config(base, common))
    sft.keep_start(trained, kept)
    (repo / "grids" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert repo / "findings" / "starts" in known_starts(repo / "grids" / "mine")

    def no_sft(*a, **k):
        raise AssertionError("a start of a kept recipe was trained again")

    monkeypatch.setattr(sft, "train_sft", no_sft)
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache2"))
    said.clear()
    path = Path(any_start(base, common, known_starts(repo / "grids" / "mine"), said.append))
    assert said == [f"start: the warm start kept at {kept} (the same SFT recipe), not trained again"]
    assert path.parent == tmp_path / "cache2" / "sft"
    assert (path / "model.safetensors").read_bytes() == (kept / "model.safetensors").read_bytes()
    said.clear()
    assert any_start(base, common, [], said.append) == str(path)  # now the cache entry: no kept start needed
    assert said == ["start: the cached supervised warm start of tiny (init: sft)"]
