"""``creditrl compare``: grid parsing and expansion, the table numbers, resumability, --quick."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from creditrl.config import ConfigError
from creditrl.experiments.compare_report import (
    charged_s,
    cpu_hours,
    difference_rows,
    differences_markdown,
    launch_text,
    prm_markdown,
    prm_rows,
    reach_stat,
    reach_text,
    results_csv,
    results_markdown,
    summarise_arm,
)
from creditrl.experiments.demo import demo_config_path
from creditrl.experiments.grid import Grid, expand_grid, load_grid
from creditrl.experiments.report import cpu_kind
from creditrl.train.metrics import pack_outcomes


def _write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_expand_grid_is_a_cartesian_product_with_generated_names():
    arms = expand_grid(
        {"credit.estimator": ["grpo", "rloo"], "credit.lam": [0.0, 1.0], "task.args": [{"min_ops": 5, "max_ops": 7}]}
    )
    assert list(arms) == [
        "estimator=grpo, lam=0.0, args={min_ops: 5, max_ops: 7}",
        "estimator=grpo, lam=1.0, args={min_ops: 5, max_ops: 7}",
        "estimator=rloo, lam=0.0, args={min_ops: 5, max_ops: 7}",
        "estimator=rloo, lam=1.0, args={min_ops: 5, max_ops: 7}",
    ]
    assert arms["estimator=rloo, lam=1.0, args={min_ops: 5, max_ops: 7}"] == [
        "credit.estimator=rloo",
        "credit.lam=1.0",
        "task.args={min_ops: 5, max_ops: 7}",
    ]
    # two keys with the same last part are named in full
    assert list(expand_grid({"reward.source": ["outcome"], "value.source": ["none", "mc"]})) == [
        "reward.source=outcome, value.source=none",
        "reward.source=outcome, value.source=mc",
    ]


def test_load_grid_arms_times_grid_and_budgets(tmp_path: Path):
    g = load_grid(
        _write(
            tmp_path,
            "base: demo_quick\nseeds: [3, 4]\nbudget: {samples: 40}\ntarget: 0.5\n"
            "arms: {a: [credit.estimator=rloo], b: []}\ngrid: {credit.normaliser: [none, batch]}\n",
        )
    )
    assert g.name == "g" and g.seeds == [3, 4] and g.unit == "samples" and g.budget == 40 and g.target == 0.5
    assert g.arms == {
        "a, normaliser=none": ["credit.estimator=rloo", "credit.normaliser=none"],
        "a, normaliser=batch": ["credit.estimator=rloo", "credit.normaliser=batch"],
        "b, normaliser=none": ["credit.normaliser=none"],
        "b, normaliser=batch": ["credit.normaliser=batch"],
    }
    q = load_grid(tmp_path / "g.yaml", quick=True)
    assert q.budget == 32 and q.seeds == [3, 4] and "rollout.group_size=4" in q.common
    assert load_grid(tmp_path / "g.yaml", seeds=1).seeds == [0]
    assert load_grid(Path("grids/estimators.yaml")).gain == pytest.approx(0.05)


def test_packaged_bases_resolve_and_quick_swaps_in_the_smoke_sizes(tmp_path: Path):
    from creditrl.config.loader import arith_config_path, packaged_config

    body = "budget: {samples: 40}\narms: {a: []}\n"
    assert load_grid(_write(tmp_path, "base: arith\n" + body)).base == arith_config_path(False)
    assert load_grid(_write(tmp_path, "base: demo\n" + body)).base == demo_config_path(False)
    assert load_grid(_write(tmp_path, body)).base == demo_config_path(False)  # no base: the demo's
    for name in ("arith", "demo"):
        assert load_grid(_write(tmp_path, f"base: {name}\n" + body), quick=True).base == demo_config_path(True)
    assert load_grid(_write(tmp_path, "base: paths\n" + body)).base == packaged_config("paths")
    # every committed grid was measured on the operand-1-9 config, the second task's or the chains'
    for grid in sorted(Path("grids").glob("*.yaml")):
        task = next((t for t in ("paths", "chain") if f"_{t}" in grid.stem), None)
        want = packaged_config(task) if task else arith_config_path(False)
        assert load_grid(grid).base == want, grid


@pytest.mark.parametrize(
    "text, match",
    [
        ("budget: {tokens: 10}\n", "needs 'arms'"),
        ("budget: {steps: 10}\narms: {a: []}\n", "key 'budget'"),
        ("budget: {tokens: 10}\narms: {a: []}\nseeds: []\n", "key 'seeds'"),
        ("budget: {tokens: 10}\narms: {a: [credit.estimator]}\n", "arm 'a'"),
        ("budget: {tokens: 10}\narms: {a: [credit.estimator=nope]}\n", "arm 'a'.*estimator"),
        ("budget: {tokens: 10}\ngrid: {credit.lam: []}\n", "grid key 'credit.lam'"),
        ("budget: {tokens: 10}\narms: {a: []}\ntarget: {gain: x}\n", "key 'target'"),
        ("budget: {tokens: 10}\narms: {a: []}\nbase: nowhere.yaml\n", "key 'base'"),
        ("budget: {tokens: 10}\narms: {a: []}\nbudgets: 1\n", "unknown key"),
        ("budget: {tokens: 10}\narms: {a: []}\ninit: sft\nsft_seeds: [1]\n", "key 'sft_seeds' must map"),
        ("budget: {tokens: 10}\narms: {a: []}\ninit: policy\nsft_seeds: {1: 1}\n", "'sft_seeds' needs init: sft"),
        ("budget: {tokens: 10}\narms: {a: []}\ninit: sft\nsft_seeds: {7: 1}\n", "does not run: \\[7\\]"),
    ],
)
def test_load_grid_errors_name_the_file_and_key(tmp_path: Path, text: str, match: str):
    with pytest.raises(ConfigError, match=match) as err:
        load_grid(_write(tmp_path, text))
    assert "g.yaml" in str(err.value)


def _hist(accs: list[float], iter_s: float) -> list[dict]:
    """Evaluated every iteration; 10 samples, 100 tokens and 2 s of RL wall time per iteration."""
    return [
        {
            "iteration": i,
            "samples/total": 10 * i,
            "tokens/total": 100 * i,
            "time/total_s": 2.0 * i,
            **({"time/iter_s": iter_s} if i else {}),
            "eval/accuracy": a,
            "eval/step_accuracy": a / 2,
        }
        for i, a in enumerate(accs)
    ]


def test_summarise_arm_table_numbers_against_hand_computed_histories():
    hs = [_hist([0.2, 0.25, 0.35, 0.3], 1.0), _hist([0.2, 0.3, 0.3, 0.5], 3.0), _hist([0.2, 0.2, 0.2, 0.2], 2.0)]
    r = summarise_arm("x", hs, gain=0.1)  # target 0.3: seed 0 at iteration 2, seed 1 at 1, seed 2 never
    assert r.start == pytest.approx(0.2) and r.target == pytest.approx(0.3) and r.reached == 2
    assert r.final[0] == pytest.approx(1 / 3)
    assert r.final[1] == pytest.approx(
        4.302653 * ((0.0333333**2 + 0.1666667**2 + 0.1333333**2) / 2) ** 0.5 / 3**0.5, rel=1e-4
    )
    assert r.step_final[0] == pytest.approx(1 / 6)
    # to target over every seed: 20 and 10 samples (4 s and 2 s), seed 2 never, so half reached by 20
    assert r.samples_to_target == (20.0, 10.0, None) and r.wall_to_target == (4.0, 2.0, None)
    assert r.tokens == (300.0, 0.0) and r.samples == (30.0, 0.0) and r.wall_s == (6.0, 0.0)
    assert r.iter_s == pytest.approx((2.0, 4.302653 * 1.0 / 3**0.5))
    assert summarise_arm("x", hs, target=0.9).samples_to_target is None
    md = results_markdown([r])
    assert (
        "| x | 3 | 20.0% | 30.0% | 33.3 ± " in md
        and "| 2/3 | 20 (10 – not reached) | 4.0 s (2.0 s – not reached) | 300 ± 0 |" in md
    )
    row = next(csv.DictReader(results_csv([r, summarise_arm("y", hs, target=0.9)]).splitlines()[:2]))
    assert float(row["samples_to_target_median"]) == 20.0 and float(row["samples_to_target_first"]) == 10.0
    assert row["samples_to_target_last"] == "" and float(row["final_ci95"]) == pytest.approx(r.final[1])
    assert r.length is None and md.rstrip().endswith("| – |")  # histories without eval/length
    for h, n in zip(hs, (30.0, 34.0, 38.0)):
        h[-1]["eval/length"] = n
    with_len = summarise_arm("x", hs, gain=0.1)
    assert with_len.length == pytest.approx((34.0, 4.302653 * 4.0 / 3**0.5)) and with_len.length_start is None
    for h in hs:
        h[0]["eval/length"] = 20.0
    assert summarise_arm("x", hs, gain=0.1).length_start == 20.0
    assert results_markdown([with_len]).rstrip().endswith("| 34.0 ± 9.9 |")
    # seeds from two SFT starts: each seed's target is its own start + gain (0.3 and 0.5), the row's their mean
    apart = [_hist([0.2, 0.3, 0.3], 1.0), _hist([0.4, 0.45, 0.45], 1.0)]
    two = summarise_arm("x", apart, gain=0.1)
    assert two.target == pytest.approx(0.4) and two.reached == 1 and two.samples_to_target == (10.0, 10.0, None)


def test_reach_stat_is_the_smallest_value_by_which_half_the_seeds_reached_against_a_count():
    rng = random.Random(0)
    for _ in range(300):
        values = [rng.choice([None, *range(1, 9)]) for _ in range(rng.randint(1, 6))]
        hits = sorted(v for v in values if v is not None)
        got = reach_stat(values)
        if not hits:
            assert got is None
            continue
        # reference: scan the candidates upwards, count the seeds reached by each
        half = next((v for v in hits if 2 * sum(h <= v for h in hits) >= len(values)), None)
        assert got == (half, hits[0], hits[-1] if len(hits) == len(values) else None), values
    assert reach_stat([1.0, 2.0, 3.0, 4.0]) == (2.0, 1.0, 4.0) and reach_stat([5.0, None]) == (5.0, 5.0, None)
    assert reach_stat([5.0, None, None]) == (None, 5.0, None)
    assert reach_text((5.0, 5.0, None), " s", 1) == "5.0 s (5.0 s – not reached)" and reach_text(None) == "–"
    assert reach_text((None, 7680.0, None)) == "not reached (first 7,680)"


def test_a_runs_prm_cost_is_charged_to_its_wall_times_and_counted_once_in_cpu_hours():
    plain = [_hist([0.2, 0.3, 0.4], 1.0), _hist([0.2, 0.2, 0.3], 1.0)]
    prm = [_hist([0.2, 0.3, 0.4], 1.0), _hist([0.2, 0.2, 0.3], 1.0)]
    for h in prm:
        h[0]["time/prm_s"] = 100.0  # one cached PRM, shared by both seeds
    assert charged_s(prm[0], prm[0][2]) == 104.0 and charged_s(plain[0], plain[0][2]) == 4.0
    r, p = summarise_arm("plain", plain, gain=0.1), summarise_arm("prm", prm, gain=0.1)
    assert (r.wall_s, p.wall_s) == ((4.0, 0.0), (104.0, 0.0))
    assert p.wall_to_target == (102.0, 102.0, 104.0)  # 102 s and 104 s: half the seeds by 102 s
    for row in [row for h in plain + prm for row in h]:
        row["eval/correct"] = pack_outcomes([True, False])
    rows = {row["arm"]: row for row in difference_rows({"plain": plain, "prm": prm}, "plain")}
    assert rows["prm"]["cost"] == pytest.approx(26.0) and rows["plain"]["cost"] == 1.0
    assert cpu_hours({"plain": plain, "prm": prm}, [{"jobs": 1, "threads": 2}]) == pytest.approx((2 * 16 + 100) / 3600)
    # the PRM table: the arms whose start rows record a PRM, the mean over their seeds
    prm[0][0].update({"prm/label_agreement": 0.6, "prm/label_coverage": 1.0, "prm/label_fpr": 0.1})
    prm[1][0].update({"prm/label_agreement": 0.7, "prm/label_coverage": 1.0, "prm/label_fpr": 0.2})
    (row,) = prm_rows({"plain": plain, "prm": prm})
    assert row["arm"] == "prm" and row["prm/label_agreement"] == pytest.approx(0.65)
    assert row["prm/label_fpr"] == pytest.approx(0.15) and row["prm/heldout_auroc"] is None
    assert prm_markdown([row]).rstrip().endswith("| prm | 0.650 | 1.000 | 0.150 | – | 100 s |")
    assert prm_rows({"plain": plain}) == []


def test_wall_times_compare_only_between_arms_run_on_one_kind_of_cpu():
    """A wall-time ratio is given between arms whose runs share one CPU kind (all unrecorded counts
    as one); otherwise the table, the reading and the launch line say why it is missing."""
    from creditrl.experiments.finding_files import fill

    plain = [_hist([0.2, 0.3, 0.4], 1.0), _hist([0.2, 0.2, 0.3], 1.0)]
    fast = [_hist([0.2, 0.3, 0.4], 0.5), _hist([0.2, 0.2, 0.3], 0.5)]
    for row in [row for h in plain + fast for row in h]:
        row["eval/correct"] = pack_outcomes([True, False])
    for row in [row for h in fast for row in h]:
        row["time/total_s"] /= 2  # half the plain arm's wall time
    results = {"plain": plain, "fast": fast}
    same = {"plain": ["EPYC, AVX512, 2 cores"] * 2, "fast": ["EPYC, AVX512, 2 cores"] * 2}
    other = {"plain": ["EPYC, AVX2, 2 cores", None], "fast": ["EPYC, AVX512, 2 cores"] * 2}
    for machines, cost in [(None, 0.5), ({"plain": [None] * 2, "fast": [None] * 2}, 0.5), (same, 0.5), (other, None)]:
        rows = {r["arm"]: r for r in difference_rows(results, "plain", machines)}
        assert rows["fast"]["cost"] == (None if cost is None else pytest.approx(cost)) and rows["plain"]["cost"] == 1.0
    table = differences_markdown(difference_rows(results, "plain", other), "plain")
    assert "No wall-time ratio (–) where an arm and the reference share no kind of CPU." in table
    assert table.rstrip().splitlines()[-1].endswith("| – |")
    assert "kinds of CPU" not in differences_markdown(difference_rows(results, "plain", same), "plain")
    arm_rows = [{"arm": a, "wall_s": (w, 0.0)} for a, w in (("plain", 4.0), ("fast", 2.0))]
    assert fill("at {ratio:fast/plain.wall_s} the time", arm_rows, same) == "at 0.5x the time"
    assert fill("at {ratio:fast/plain.wall_s}", arm_rows, other) == (
        "at not comparable, the arms ran on different kinds of CPU"
    )
    assert fill("at {ratio:fast/plain.wall_s}", arm_rows, other, results) == (
        "at not comparable, the arms share no kind of CPU"
    )
    launches = [{"jobs": 2, "threads": 1}, {"jobs": 2, "threads": 1, "cpu": "EPYC, AVX512, 2 cores"}]
    assert launch_text(launches) == (
        "2 runs at a time in the grid's process, 1 thread each (CPU not recorded); "
        "2 runs at a time in the grid's process, 1 thread each on EPYC, AVX512, 2 cores"
    )
    assert launch_text(launches[:1]) == "2 runs at a time in the grid's process, 1 thread each"
    assert cpu_hours(results, launches) == pytest.approx(12 / 3600)  # one thread each, in both launches


@pytest.mark.parametrize("unit", ["samples", "tokens"])
def test_quick_compare_writes_every_output_and_resumes(tmp_path: Path, monkeypatch, capsys, unit: str):
    from creditrl.cli import main

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    grid = _write(
        tmp_path,
        f"name: two\nbudget: {{{unit}: 100000}}\narms:\n  grpo: [credit.estimator=grpo]\n"
        "  rloo: [credit.estimator=rloo]\n",
    )
    out = tmp_path / "out"
    assert main(["compare", str(grid), "--quick", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["arm"] for r in summary["rows"]] == ["grpo", "rloo"] and summary["grid"]["seeds"] == [0, 1]
    rows = [json.loads(x) for x in (out / "rloo" / "seed1" / "metrics.jsonl").read_text().splitlines()]
    assert all("eval/accuracy" in r for r in rows)
    if unit == "samples":  # quick: 32 samples = 2 iterations of 4 prompts x 4 samples
        assert [r["iteration"] for r in rows] == [0, 1, 2] and summary["rows"][1]["samples"][0] == 32
    else:  # quick: 600 tokens; the run stops at the first iteration that reaches them
        assert rows[-1]["tokens/total"] >= 600 > rows[-2]["tokens/total"]
    assert "| grpo | 2 |" in (out / "results.md").read_text()
    assert len((out / "results.csv").read_text().splitlines()) == 3
    for png in ("accuracy_vs_samples.png", "accuracy_vs_wall_time.png", "length_vs_samples.png"):
        assert (out / "plots" / png).stat().st_size > 10_000
    capsys.readouterr()
    main(["compare", str(grid), "--quick", "--out", str(out)])  # every run finished: nothing is rerun
    assert capsys.readouterr().out.count("finished earlier, read back") == 4


def test_a_run_counts_as_finished_only_for_its_own_budget(tmp_path: Path):
    from creditrl.experiments.plan import _finished

    def write(rows):
        p = tmp_path / "metrics.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return p

    its = write(
        [{"iteration": i, "tokens/total": 100 * i, **({"eval/accuracy": 0.2} if i in (0, 3) else {})} for i in range(4)]
    )
    assert _finished(its, 3, "iteration") is not None
    assert _finished(its, 2, "iteration") is None  # made for 3 iterations, not 2
    assert _finished(its, 4, "iteration") is None  # not there yet
    assert _finished(its, 250, "tokens/total") is not None  # the first iteration at or past 250 tokens is the last
    assert _finished(its, 150, "tokens/total") is None  # it ran on past a 150-token budget
    write([{"iteration": 0, "tokens/total": 0, "eval/accuracy": 0.2}, {"iteration": 1, "tokens/total": 90}])
    assert _finished(tmp_path / "metrics.jsonl", 50, "tokens/total") is None  # the last row was not evaluated


def test_parallel_runs_equal_one_at_a_time_runs_and_record_their_launch(tmp_path: Path, monkeypatch):
    """--jobs 2 (two spawned processes, one thread each) gives every run the numbers of a serial
    run with one thread; each run records how it was launched, and the report says so."""
    from creditrl.cli import main

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    grid = _write(
        tmp_path,
        "name: par\nbudget: {samples: 100}\narms:\n  grpo: [credit.estimator=grpo]\n  rloo: [credit.estimator=rloo]\n",
    )
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    threads = torch.get_num_threads()
    try:
        assert main(["compare", str(grid), "--quick", "--out", str(serial), "--threads", "1"]) == 0
        torch.set_num_threads(2)
        assert main(["compare", str(grid), "--quick", "--out", str(parallel), "--jobs", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    timing = ("time/", "perf/")
    for arm in ("grpo", "rloo"):
        for seed in (0, 1):
            rows = [
                [
                    {k: v for k, v in json.loads(x).items() if not k.startswith(timing)}
                    for x in (d / arm / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
                ]
                for d in (serial, parallel)
            ]
            assert rows[0] == rows[1] and len(rows[0]) == 3
            for where, jobs in ((serial, 1), (parallel, 2)):
                launch = json.loads((where / arm / f"seed{seed}" / "launch.json").read_text())
                assert launch.pop("load") >= 0 and launch == {"threads": 1, "jobs": jobs, "cpu": cpu_kind()}
    assert (
        f"launched: 2 runs at a time in the grid's process, 1 thread each on {cpu_kind()}."
        in (parallel / "results.md").read_text()
    )
    assert json.loads((serial / "summary.json").read_text())["launches"] == [
        {"threads": 1, "jobs": 1, "cpu": cpu_kind()}
    ]


def test_a_failing_parallel_run_names_its_arm_and_seed(tmp_path: Path, monkeypatch):
    from creditrl.experiments.launch import run_arms

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="arm 'bad' seed 0 failed: .*no-such-checkpoint"):
        grid = Grid(base=demo_config_path(True), arms={"bad": []}, seeds=[0], budget=32, unit="samples")
        run_arms(grid, tmp_path / "out", str(tmp_path / "no-such-checkpoint"), jobs=2)


def test_an_interrupted_grid_run_continues_from_its_last_checkpoint(tmp_path: Path, monkeypatch):
    """A grid run killed after its checkpoint at iteration 2 continues from there when the grid is
    rerun (iterations 0-1 are not replayed) and ends with the metrics of an uninterrupted run;
    a run directory left by another plan is started afresh."""
    from creditrl.experiments.launch import run_arms
    from creditrl.experiments.plan import PLAN_FILE
    from creditrl.train.rl import RLTrainer

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    logged: list[str] = []

    # one addition of 1s and 2s: rewards from the start, so the killed run has learned something
    easy = "{min_ops: 1, max_ops: 1, operand_min: 1, operand_max: 2, operators: '+', heldout_mod: 2}"
    common = [f"task.args={easy}", f"sft.task_args={easy}", "sft.steps=30", "sft.lr=0.003", "train.eval_every=2"]

    def run(out: Path) -> None:  # 64 samples: 4 iterations of 4 prompts x 4 samples, evaluated every 2
        grid = Grid(base=demo_config_path(True), arms={"grpo": []}, seeds=[0], budget=64, common=common, unit="samples")
        run_arms(grid, out, "sft", logged.append)

    run(whole)
    ran: list[int] = []
    kill = [3]
    real = RLTrainer.iteration

    def iteration(self, it):
        ran.append(it)
        if it in kill:
            kill.clear()
            raise RuntimeError("killed in iteration 3")
        return real(self, it)

    monkeypatch.setattr(RLTrainer, "iteration", iteration)
    with pytest.raises(RuntimeError, match="killed in iteration 3"):
        run(killed)
    assert ran == [0, 1, 2, 3]
    logged.clear()
    run(killed)
    assert ran == [0, 1, 2, 3, 2, 3]  # on from the checkpoint at iteration 2
    assert "arm 'grpo' seed 0: continues from its checkpoint at iteration 2, up to 64 generated samples" in logged

    def rows(where: Path) -> list[dict]:
        lines = (where / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "perf/"))} for x in lines]

    assert rows(killed) == rows(whole) and [r["iteration"] for r in rows(whole)] == [0, 1, 2, 3, 4]
    assert any(r["reward/mean"] > 0 and r["grad/norm"] > 0 for r in rows(whole)[1:])  # the policy learned
    # the same directory under another plan (here: the run killed, then its plan edited) starts afresh
    (killed / "grpo" / "seed0" / "metrics.jsonl").write_text(
        "\n".join((killed / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()[:3]) + "\n"
    )
    plan = killed / "grpo" / "seed0" / PLAN_FILE
    plan.write_text(plan.read_text().replace('"seed": 0', '"seed": 7'))
    ran.clear()
    run(killed)
    assert ran == [0, 1, 2, 3] and rows(killed) == rows(whole)


def test_a_grid_keeps_its_start_and_runs_only_from_the_one_its_summarised_runs_started_from(
    tmp_path: Path, monkeypatch
):
    """A grid's start is kept next to its summaries (findings/starts/<recipe>); on a machine without
    it in the cache the kept weights are used, not retrained; the start's held-out outcomes equal a
    run's iteration-0 evaluation; and a run is launched only when every summarised run of the grid
    started from those outcomes."""
    from creditrl.config import load_config
    from creditrl.experiments import launch
    from creditrl.experiments.starts import kept_start
    from creditrl.train import sft
    from creditrl.train.checkpoint import verify_checkpoint

    cache = tmp_path / "cache"
    monkeypatch.setenv("CREDITRL_CACHE", str(cache))
    easy = "{min_ops: 1, max_ops: 1, operand_min: 1, operand_max: 2, operators: '+', heldout_mod: 2}"
    common = [f"task.args={easy}", f"sft.task_args={easy}", "sft.steps=30", "sft.lr=0.003", "train.eval_every=2"]
    summaries = tmp_path / "findings" / "runs" / "g"

    def run(seeds_: list[int]) -> None:  # 32 samples: 2 iterations of 4 prompts x 4 samples
        grid = Grid(
            base=demo_config_path(True), arms={"grpo": []}, seeds=seeds_, budget=32, common=common, unit="samples"
        )
        launch.run_arms(grid, tmp_path / "runs", "sft", lambda m: None, summaries=summaries)

    run([0])
    (entry,) = [p for p in (cache / "sft").iterdir() if p.is_dir()]
    kept = tmp_path / "findings" / "starts" / sft.recipe_key(load_config(demo_config_path(True), common))
    assert (kept / "model.safetensors").read_bytes() == (entry / "model.safetensors").read_bytes()
    assert verify_checkpoint(kept) is None and not (kept / "rng.pt").exists()
    state = json.loads((entry / "trainer_state.json").read_text())
    first = json.loads((summaries / "grpo" / "seed0.json").read_text())["evals"][0]
    assert first["iteration"] == 0 and state["heldout_correct"] == first["eval/correct"]
    assert "eval/correct" not in state["metrics"] and state["metrics"]["eval/accuracy"] == first["eval/accuracy"]
    # the summary keeps each evaluation window's diagnostics and what the run cost, not its metrics file
    kept_summary = json.loads((summaries / "grpo" / "seed0.json").read_text())
    rows = [json.loads(x) for x in (tmp_path / "runs" / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    (window,) = kept_summary["windows"]  # 2 iterations, evaluated at the last
    assert window["iteration"] == 2 and window["iterations"] == 2
    for key in ("response/length", "reward/zero_spread_groups", "kl/ref", "policy/entropy"):
        assert window[key] == pytest.approx(np.mean([r[key] for r in rows[1:]]), rel=1e-5), key
    cost = kept_summary["cost"]
    assert cost["generated_tokens"] == rows[-1]["tokens/total"] and cost["cpu_s"] > 0
    assert cost["trained_positions"] == sum(r["update/positions"] for r in rows[1:]) > 0
    assert (summaries / "grpo" / "seed0.json").stat().st_size < 4096

    # another machine: no cache, and SFT there would train other weights; the kept start is used
    shutil.rmtree(cache)

    def fail(*args, **kwargs):
        raise AssertionError("trained a start that was kept")

    monkeypatch.setattr(sft, "train_sft", fail)
    run([0, 1])
    assert (entry / "model.safetensors").read_bytes() == (kept / "model.safetensors").read_bytes()
    assert (
        json.loads((summaries / "grpo" / "seed1.json").read_text())["evals"][0]["eval/correct"] == first["eval/correct"]
    )

    # the findings name the kept start as the one these runs started from
    found = [json.loads((summaries / "grpo" / f"seed{s}.json").read_text()) for s in (0, 1)]
    assert kept_start(demo_config_path(True), common, tmp_path / "findings" / "starts", found) == kept

    # a summary from another start (its first held-out problem's outcome flipped)
    other = json.loads((summaries / "grpo" / "seed1.json").read_text())
    count, _, digits = first["eval/correct"].partition(":")
    other["evals"][0]["eval/correct"] = f"{count}:{int(digits[0], 16) ^ 8:x}{digits[1:]}"
    other["evals"][0]["eval/accuracy"] = 0.9
    (summaries / "grpo" / "seed1.json").write_text(json.dumps(other))
    assert kept_start(demo_config_path(True), common, tmp_path / "findings" / "starts", [found[0], other]) is None
    assert kept_start(demo_config_path(True), common, tmp_path / "elsewhere", found) is None
    share = f"{first['eval/accuracy']:.1%}"
    with pytest.raises(
        ConfigError, match=rf"held out {share} here, but 1 of the 2 summarised runs of this grid started from 90\.0%"
    ):
        run([0, 1, 2])
    assert not (tmp_path / "runs" / "grpo" / "seed2").exists()  # nothing launched

    # a grid of the same SFT recipe on other RL problems starts from the kept weights too; its
    # held-out outcomes there are noted beside the start, so the findings name the start for it
    from creditrl.experiments.starts import HELDOUT

    other_task = "{min_ops: 2, max_ops: 2, operand_min: 1, operand_max: 2, operators: '+', heldout_mod: 2}"
    common2 = [f"task.args={other_task}", *common[1:], "train.eval_size=8"]  # 8 problems, not 16
    summaries2 = tmp_path / "findings" / "runs" / "g2"
    grid2 = Grid(base=demo_config_path(True), arms={"grpo": []}, seeds=[0], budget=32, common=common2, unit="samples")
    launch.run_arms(grid2, tmp_path / "runs2", "sft", lambda m: None, summaries=summaries2)
    first2 = json.loads((summaries2 / "grpo" / "seed0.json").read_text())["evals"][0]
    assert first2["eval/correct"].startswith("8:") and first["eval/correct"].startswith("16:")
    cfg2 = load_config(demo_config_path(True), common2)
    assert json.loads((kept / HELDOUT).read_text()) == {sft.sft_key(cfg2): first2["eval/correct"]}
    assert kept_start(demo_config_path(True), common2, tmp_path / "findings" / "starts", [{"evals": [first2]}]) == kept
    assert kept_start(demo_config_path(True), common, tmp_path / "findings" / "starts", found) == kept  # still
    assert verify_checkpoint(kept) is None  # the note is beside the kept files, not among them
    noted = (kept / HELDOUT).read_text()
    (kept / HELDOUT).unlink()  # without the note the start is not known to be theirs
    assert kept_start(demo_config_path(True), common2, tmp_path / "findings" / "starts", [{"evals": [first2]}]) is None
    (kept / HELDOUT).write_text(noted)

    # a damaged kept start is named, not used
    (kept / "model.safetensors").write_bytes(b"0" + (kept / "model.safetensors").read_bytes()[1:])
    shutil.rmtree(cache)
    with pytest.raises(ConfigError, match=r"kept start .*: model.safetensors: checksum mismatch"):
        run([0, 1, 2])


def test_pending_runs_go_seed_by_seed(tmp_path: Path, monkeypatch):
    """A grid's runs start seed by seed (every arm of seed 0, then of seed 1), so that two arms
    that build different cached PRMs first build them side by side."""
    from creditrl.experiments import launch

    launched: list[tuple[str, int]] = []

    class Launched(Exception):
        pass

    def capture(pending, *a, **k):
        launched.extend((r.arm, r.seed) for r in pending)
        raise Launched

    monkeypatch.setattr(launch, "_launch", capture)
    arms = {"a": ["credit.estimator=grpo"], "b": ["credit.estimator=rloo"], "c": ["credit.estimator=reinforce"]}
    with pytest.raises(Launched):
        grid = Grid(base=demo_config_path(True), arms=arms, seeds=[3, 1], budget=64)
        launch.run_arms(grid, tmp_path / "runs", str(tmp_path / "start"))
    assert launched == [("a", 3), ("b", 3), ("c", 3), ("a", 1), ("b", 1), ("c", 1)]


def test_seeds_of_a_second_sft_start_run_from_it_and_the_others_keep_their_plan(tmp_path: Path, monkeypatch):
    """``sft_seeds``: the seeds it names carry ``sft.seed=k`` and start from that recipe's start,
    resolved once per start; every other seed's plan (its identity, hence its committed summary)
    is the one it had without the key."""
    from creditrl.experiments import launch
    from creditrl.experiments.plan import plan_runs

    arms = {"a": ["credit.estimator=grpo"], "b": ["credit.estimator=rloo"]}
    base, where = demo_config_path(True), tmp_path / "runs"
    grid = Grid(base=base, arms=arms, seeds=[0, 1, 2], budget=32, unit="samples")
    before = plan_runs(grid, where, "sft", None)
    after = plan_runs(dataclasses.replace(grid, sft_seeds={2: 1}), where, "sft", None)
    assert [r.identity for r in after if r.seed != 2] == [r.identity for r in before if r.seed != 2]
    assert [r.overrides[:3] for r in after if r.seed == 2] == [
        ["credit.estimator=grpo", "sft.seed=1", "train.seed=2"],
        ["credit.estimator=rloo", "sft.seed=1", "train.seed=2"],
    ]
    starts: list[list[str]] = []

    def fake_start(base, common, starts_dir, summarised):
        starts.append(list(common))
        return f"start-{common[-1] if common else 'own'}"

    launched: dict[tuple[str, int], str] = {}

    def fake_launch(pending, *a, **k):
        launched.update({(r.arm, r.seed): r.identity["init"] for r in pending})

    monkeypatch.setattr(launch, "grid_start", fake_start)
    monkeypatch.setattr(launch, "_launch", fake_launch)
    launch.run_arms(dataclasses.replace(grid, sft_seeds={2: 1}), where, "sft")
    assert starts == [[], ["sft.seed=1"]]
    assert launched == {(a, s): ("start-sft.seed=1" if s == 2 else "start-own") for a in arms for s in (0, 1, 2)}


def test_wall_time_ratios_pair_runs_within_each_kind_of_cpu():
    """Arms whose runs span kinds of CPU get a ratio from the kinds they share, each kind's ratio of
    means weighted by the arm's runs on it; unrecorded runs pair only when nothing was recorded."""
    from creditrl.experiments.compare_report import wall_ratio
    from creditrl.experiments.finding_files import fill

    def runs(*walls: float) -> list[list[dict]]:
        hs = [_hist([0.2, 0.3], 1.0) for _ in walls]
        for h, w in zip(hs, walls):
            h[-1]["time/total_s"] = w
            for row in h:
                row["eval/correct"] = pack_outcomes([True, False])
        return hs

    fast_cpu, slow_cpu = "EPYC, AVX512, 2 cores", "EPYC, AVX2, 2 cores"
    results = {"ref": runs(100.0, 150.0, 160.0), "arm": runs(50.0, 90.0, 300.0)}
    machines = {"ref": [fast_cpu, slow_cpu, slow_cpu], "arm": [fast_cpu, slow_cpu, None]}
    # fast: 50/100 from one run of the arm; slow: 90/155 from one; the unrecorded run pairs with nothing
    expected = (0.5 + 90.0 / 155.0) / 2
    assert wall_ratio(results, machines, "arm", "ref") == pytest.approx(expected)
    machines["arm"] = [slow_cpu, slow_cpu, fast_cpu]  # slow: (50+90)/2 over 155, two runs; fast: 300/100
    assert wall_ratio(results, machines, "arm", "ref") == pytest.approx((2 * 70.0 / 155.0 + 3.0) / 3)
    rows = {r["arm"]: r for r in difference_rows(results, "ref", machines)}
    assert rows["arm"]["cost"] == pytest.approx((2 * 70.0 / 155.0 + 3.0) / 3) and rows["ref"]["cost"] == 1.0
    table = differences_markdown(difference_rows(results, "ref", machines), "ref", machines)
    assert "an arm's ratio to the reference within each kind both ran on" in table and "share no kind" not in table
    assert wall_ratio(results, {"ref": [fast_cpu] * 3, "arm": [slow_cpu] * 3}, "arm", "ref") is None
    assert wall_ratio(results, {"ref": [fast_cpu, None, None], "arm": [None] * 3}, "arm", "ref") is None
    nothing = {"ref": [None] * 3, "arm": [None] * 3}  # nothing recorded: all one kind, the plain ratio
    assert wall_ratio(results, nothing, "arm", "ref") == pytest.approx(440.0 / 410.0)
    arm_rows = [{"arm": a, "wall_s": (w, 0.0)} for a, w in (("ref", 410.0 / 3), ("arm", 440.0 / 3))]
    assert fill("{ratio:arm/ref.wall_s}", arm_rows, machines, results) == "1.3x"  # not 440/410
    assert fill("{ratio:arm/ref.wall_s}", arm_rows, {"ref": [fast_cpu] * 3, "arm": [None] * 3}, results) == (
        "not comparable, the arms share no kind of CPU"
    )
    idle = {"ref": runs(0.0, 0.0, 0.0), "arm": results["arm"]}  # no time to divide by: no ratio, said so
    assert fill("{ratio:arm/ref.wall_s}", arm_rows, nothing, idle) == "n/a"


def test_a_grid_with_a_second_sft_start_names_each_start_with_its_seeds(tmp_path: Path, monkeypatch):
    """With ``sft_seeds``, the report names every start its runs began from: the grid's own for the
    other seeds, then each second start for its seeds, each judged kept or not on its own runs only."""
    from creditrl.experiments import compare
    from creditrl.experiments.findings import _starts_text

    grid = Grid(base=demo_config_path(True), arms={"a": [], "b": []}, seeds=[0, 1, 3], budget=32, unit="samples")
    grid = dataclasses.replace(grid, sft_seeds={3: 1})
    seeds = [0, 1, 3, 0, 1, 3]
    found = [{"init": f"/cache/sft/{'second' if s == 3 else 'first'}", "seed": s} for s in seeds]
    summaries = tmp_path / "findings" / "runs" / "g"
    asked: list[tuple[list[str], list[int]]] = []

    def fake_kept(base, common, starts, group):
        asked.append(([c for c in common if c.startswith("sft.seed")], [f["seed"] for f in group]))
        return None if common and common[-1] == "sft.seed=1" else tmp_path / "findings" / "starts" / "own"

    monkeypatch.setattr(compare, "kept_start", fake_kept)
    starts = compare._starts(grid, found, seeds, summaries)
    assert asked == [([], [0, 1, 0, 1]), (["sft.seed=1"], [3, 3])]
    assert starts == [{"init": "findings/starts/own", "seeds": [0, 1]}, {"init": "/cache/sft/second", "seeds": [3]}]
    text = _starts_text({"init": starts[0]["init"], "starts": starts})
    assert text.index("`findings/starts/own` (seeds 0, 1)") < text.index("`/cache/sft/second` (seeds 3)")
    assert _starts_text({"init": "findings/starts/own"}) == "start `findings/starts/own`"
