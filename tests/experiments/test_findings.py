"""FINDINGS.md: placeholders filled from results (no number typed by hand), and a quick end to end."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from creditrl.config import ConfigError
from creditrl.experiments.finding_files import fill, load_finding
from creditrl.experiments.findings import run_findings

ROWS = [
    {
        "arm": "grpo",
        "seeds": 3,
        "start": 0.234,
        "final": [0.273, 0.012],
        "step_final": [0.56, 0.01],
        "reached": 2,
        "iter_s": [1.2, 0.05],
        "wall_s": [30.0, 1.0],
        "tokens": [150000.0, 10.0],
        "samples": [3456.0, 0.0],
        "samples_to_target": None,
        "wall_to_target": None,
        "length": [31.24, 0.41],
        "length_start": 30.12,
    },
    {
        "arm": "gae + mc (VinePPO)",
        "seeds": 3,
        "start": 0.234,
        "final": [0.25, 0.02],
        "step_final": [0.5, 0.02],
        "reached": 0,
        "iter_s": [3.0, 0.1],
        "wall_s": [80.0, 2.0],
        "tokens": [151000.0, 5.0],
        "samples": [3000.0, 0.0],
        "samples_to_target": None,
        "wall_to_target": None,
    },
]


def test_fill_formats_every_field_and_ratios():
    text = fill(
        "{grpo.final} vs {gae_mc_VinePPO.final}; start {grpo.start}; {grpo.reached} seeds; "
        "{grpo.iter_s}; {ratio:gae_mc_VinePPO/grpo.iter_s} the time; {grpo.tokens}; {grpo.wall_to_target}",
        ROWS,
    )
    assert text == (
        "27.3 ± 1.2% vs 25.0 ± 2.0%; start 23.4%; 2/3 seeds; 1.20 ± 0.05 s; 2.5x the time; 150,000 ± 10; not reached"
    )
    assert fill("{grpo.length} from {grpo.length_start}", ROWS) == "31.2 ± 0.4 tokens from 30.1 tokens"
    with pytest.raises(ValueError, match="unknown arm 'ppo'; arms: gae_mc_VinePPO, grpo"):
        fill("{ppo.final}", ROWS)
    with pytest.raises(ValueError, match="unknown field 'best'"):
        fill("{grpo.best}", ROWS)


def _histories(outcomes: list[list[bool]]) -> list[list[dict]]:
    from creditrl.train.outcomes import pack_outcomes

    return [
        [{"eval/accuracy": sum(o) / len(o), "eval/correct": pack_outcomes(o), "time/total_s": 10.0}] for o in outcomes
    ]


def test_fill_gives_each_arms_diagnostics_from_its_runs_windows():
    """``{ARM.explained_variance}`` and the other diagnostics: each run's mean over its iterations
    (a summary's windows, weighted by their iterations), then the mean over seeds; "not recorded"
    where a run kept none (a summary from before the windows)."""
    from creditrl.experiments.summaries import history

    def run(ev: list[float], spread: float) -> list[dict]:
        windows = [
            {
                "iteration": 30 * (i + 1),
                "iterations": n,
                "value/explained_variance": v,
                "reward/zero_spread_groups": spread,
            }
            for i, (v, n) in enumerate(zip(ev, [30, 10]))
        ]
        return history({"iter_s": [], "evals": [], "windows": windows})

    results = {"grpo": [run([0.2, 0.6], 0.5), run([0.0, 0.4], 0.7)]}
    # seed 0: (0.2 * 30 + 0.6 * 10) / 40 = 0.3; seed 1: 0.1; their mean 0.2
    text = "{grpo.explained_variance}, {grpo.zero_spread}, {grpo.kl}"
    assert fill(text, ROWS[:1], results=results) == "0.20, 60%, not recorded"
    assert fill("{grpo.entropy}", ROWS[:1], results={"grpo": _histories([[True]])}) == "not recorded"
    # runs of which only some kept windows: the mean over those, naming their seeds
    mixed = {"grpo": [_histories([[True]])[0], run([0.2, 0.6], 0.5), run([0.0, 0.4], 0.7)]}
    assert fill("{grpo.explained_variance}", ROWS[:1], results=mixed, seeds={"grpo": [0, 3, 4]}) == (
        "0.20 on seeds 3, 4 (the others' summaries keep none)"
    )
    one = {"grpo": [_histories([[True]])[0], run([0.0, 0.4], 0.7)]}
    assert fill("{grpo.zero_spread}", ROWS[:1], results=one) == "70% on seed 1 (the others' summaries keep none)"


def test_fill_gives_each_seeds_final_and_start_accuracy_in_seed_order():
    """``{ARM.finals}``: each seed's last held-out exact match, so a reading can say which seeds
    collapsed where a mean and interval hide it."""
    runs = [
        [{"eval/accuracy": 0.2}, {"eval/accuracy": 0.243}],
        [{"eval/accuracy": 0.2}, {"eval/accuracy": 0.0}],
        [{"eval/accuracy": 0.2}, {"eval/accuracy": 0.229}],
    ]
    assert fill("{grpo.finals}", ROWS[:1], results={"grpo": runs}) == "24.3, 0.0, 22.9%"
    runs[2][0]["eval/accuracy"] = 0.314  # a seed from another SFT start (sft_seeds)
    assert fill("{grpo.starts}", ROWS[:1], results={"grpo": runs}) == "20.0, 20.0, 31.4%"
    with pytest.raises(ValueError, match="needs the arms' results"):
        fill("{grpo.finals}", ROWS[:1])


def test_fill_reads_another_findings_verdict_rows():
    """``{ID:A/B.verdict}`` and ``{ID:A/B.diff}``: a verdict row of another finding, so a reading
    sets its rows beside another setting's; a row not judged yet says so, an unknown finding or
    field is an error naming it."""
    from creditrl.experiments.finding_files import names_only

    difference = {"mean": 0.016, "lo": -0.037, "hi": 0.07, "level": 0.9989, "seeds": 5}
    row = {
        "arm": "token",
        "reference": "sequence + GRPO",
        "verdict": "inconclusive",
        "fragile": [],
        "difference": difference,
    }
    others = {"C1-long": [row, {**row, "arm": "step", "fragile": ["seed 3 left out"]}], "C1-longest": []}
    text = "{C1-long:token/sequence_GRPO.verdict} ({C1-long:token/sequence_GRPO.diff}); "
    text += "{C1-long:step/sequence_GRPO.verdict}"
    assert fill(text, ROWS[:1], others=others) == (
        "inconclusive (+1.6 points [-3.7, +7.0] at 99.89% on 5 seeds); inconclusive, fragile"
    )
    assert fill("{C1-longest:token/sequence_GRPO.verdict}", ROWS[:1], others=others) == "not judged yet"
    with pytest.raises(ValueError, match=r"names finding 'C9-long'; findings: C1-long, C1-longest"):
        fill("{C9-long:token/sequence_GRPO.verdict}", ROWS[:1], others=others)
    with pytest.raises(ValueError, match=r"gives 'verdict' or 'diff' only"):
        fill("{C1-long:token/sequence_GRPO.final}", ROWS[:1], others=others)
    with pytest.raises(ValueError, match=r"needs two arms"):
        fill("{C1-long:token.verdict}", ROWS[:1], others=others)
    changes = lambda arms: "all rows" if arms is None else " + ".join(arms)  # noqa: E731
    text = "{family.changes}; {grpo.changes}; {changes:grpo/gae_mc_VinePPO.verdicts}"
    assert fill(text, ROWS, changes=changes) == "all rows; grpo; grpo + gae + mc (VinePPO)"
    with pytest.raises(ValueError, match="unknown arm 'ppo'"):
        fill("{ppo.changes}", ROWS, changes=changes)
    with pytest.raises(ValueError, match=r"the changes of two arms' rows are '.verdicts'"):
        fill("{changes:grpo/gae_mc_VinePPO.final}", ROWS, changes=changes)
    with pytest.raises(ValueError, match="needs the claim's judged rows"):
        fill("{family.changes}", ROWS)
    # another finding's rows do not hold back a reading of this grid's reported arms
    assert names_only("{grpo.final} {C1-long:token/sequence_GRPO.verdict}", ["grpo"])
    assert not names_only("{grpo.final} {token.final}", ["grpo"])


def test_fill_gives_the_paired_difference_between_two_arms():
    """``{diff:A/B.final}`` is A's paired difference to B, seed by seed over the same problems, in
    points with the 95% seed-level t-interval: B right on 4 of 10 problems in each of 3 seeds, A on
    6, 7 and 6, so +23.3 points, with scipy's paired t-interval."""
    from scipy import stats

    from creditrl.experiments.finding_files import diff_text

    b = [[True] * 4 + [False] * 6] * 3
    a = [[True] * k + [False] * (10 - k) for k in (6, 7, 6)]
    rows = [{**ROWS[0], "arm": "grpo"}, {**ROWS[0], "arm": "gae + mc (VinePPO)"}]
    results = {"grpo": _histories(a), "gae + mc (VinePPO)": _histories(b)}
    text = fill("{diff:grpo/gae_mc_VinePPO.final}", rows, results=results)
    ci = stats.ttest_rel([0.6, 0.7, 0.6], [0.4, 0.4, 0.4]).confidence_interval(0.95)
    assert text == diff_text({"mean": 0.7 / 3, "lo": ci.low, "hi": ci.high}) == "+23.3 points [+9.0, +37.7]"
    assert fill("{diff:gae_mc_VinePPO/grpo.final}", rows, results=results) == "-23.3 points [-37.7, -9.0]"
    assert diff_text({"mean": 0.01, "lo": -0.02, "hi": 0.04, "level": 1 - 0.05 / 8}) == (
        "+1.0 points [-2.0, +4.0] at 99.38%"
    )
    with pytest.raises(ValueError, match="a difference between arms is of 'final' only"):
        fill("{diff:grpo/gae_mc_VinePPO.wall_s}", rows, results=results)
    with pytest.raises(ValueError, match="needs the arms' results"):
        fill("{diff:grpo/gae_mc_VinePPO.final}", rows)
    with pytest.raises(ValueError, match="needs two arms"):
        fill("{diff:grpo.final}", rows, results=results)


def test_length_points_pair_each_setting_and_keep_tasks_measured_at_several_lengths(tmp_path: Path):
    """The by-length figure's numbers: per task measured at two lengths or more, each arm's paired
    difference to the reference in each setting (the verdicts' bootstrap); a task at one length, an
    arm with other seeds than the reference, and settings with different references are left out."""
    from creditrl.experiments.findings_figures import length_figure, length_points
    from creditrl.experiments.verdicts import outcome_matrix, paired_difference

    ref = _histories([[True] * 4 + [False] * 6] * 2)
    better = _histories([[True] * 6 + [False] * 4] * 2)
    worse = _histories([[True] * 3 + [False] * 7] * 2)

    def setting(task: str, length: int, results: dict, reference: str = "gae") -> tuple[dict, dict]:
        return {
            "id": f"{task}-{length}",
            "task": task,
            "regime": f"about {length} generated tokens",
            "reference": reference,
        }, results

    panels = [
        setting("chain", 515, {"gae": ref, "step": better, "grpo": worse}),
        setting("chain", 155, {"gae": ref, "step": worse, "grpo": _histories([[True] * 10])}),  # one seed: left out
        setting("arith", 45, {"gae": ref, "step": better}),  # one length: no panel
    ]
    reference, points = length_points(panels)
    assert reference == "gae" and list(points) == ["chain"]
    d = paired_difference(outcome_matrix(better), outcome_matrix(ref))
    assert points["chain"]["step"][1] == (515, {"mean": d.mean, "lo": d.lo, "hi": d.hi})
    assert [n for n, _ in points["chain"]["step"]] == [155, 515]  # in order of length
    assert round(100 * points["chain"]["step"][0][1]["mean"], 6) == -10.0
    assert [n for n, _ in points["chain"]["grpo"]] == [515]
    assert length_points([*panels, setting("chain", 900, {"grpo": ref}, reference="grpo")]) == (None, {})
    line = length_figure("C1", panels, tmp_path / "docs", tmp_path)
    assert "(chain;" in line and (tmp_path / "docs" / "C1_by_length.png").stat().st_size > 10_000
    assert length_figure("C1", panels[2:], tmp_path / "docs", tmp_path) == ""


def test_finding_files_are_checked(tmp_path: Path):
    bad = tmp_path / "f.yaml"
    bad.write_text("id: F9\ntitle: t\n")
    with pytest.raises(ConfigError, match="a finding file has keys"):
        load_finding(bad)
    ok = "id: F9\ntitle: t\ngrid: g.yaml\nquestion: q\nreading: r\n"
    bad.write_text(ok)
    assert load_finding(bad)["plots"] == ["accuracy_vs_samples", "accuracy_vs_wall_time"]
    bad.write_text(ok + "plots: [loss_vs_time]\n")
    with pytest.raises(ConfigError, match="key 'plots' must be a non-empty list of accuracy_vs_samples"):
        load_finding(bad)


def test_committed_findings_name_existing_grids_and_arms():
    root = Path(__file__).resolve().parents[2]
    from creditrl.experiments.grid import load_grid
    from creditrl.experiments.plan import slug

    files = sorted((root / "findings").glob("*.yaml"))
    assert files
    others = {load_finding(f)["id"]: [] for f in files}  # another finding's rows: its id must exist
    for f in files:
        finding = load_finding(f)
        grid = load_grid(root / finding["grid"])
        diff = {"mean": 0.01, "lo": -0.01, "hi": 0.03, "se": 0.01, "mde": 0.028, "seeds": 5, "problems": 1024}
        fake = [{**ROWS[0], "arm": name, "diff": diff, "verdict": "inconclusive"} for name in grid.arms]
        results = {name: _histories([[True, False], [False, True]]) for name in grid.arms}
        # every placeholder names a real arm and field
        filled = fill(finding["reading"], fake, results=results, others=others, changes=lambda arms: "changes")
        assert "{" not in filled, f
        assert {slug(a) for a in grid.arms}
        assert set(finding.get("expect", {})) <= set(grid.arms) - {grid.reference}, f
        assert finding.get("sequence_level", grid.reference) in grid.arms, f
        assert all({x["arm"], x["against"]} <= set(grid.arms) for x in finding.get("also", [])), f


def test_quick_findings_write_the_file_with_filled_numbers(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "grids").mkdir()
    (tmp_path / "findings").mkdir()
    (tmp_path / "grids" / "g.yaml").write_text(
        "name: g\nbase: demo\nseeds: [0, 1]\nbudget: {tokens: 100000}\narms:\n"
        "  grpo: [credit.estimator=grpo]\n  rloo: [credit.estimator=rloo]\n"
    )
    (tmp_path / "findings" / "F0.yaml").write_text(
        "id: F0\ntitle: a test\ngrid: grids/g.yaml\nquestion: which?\nclaim: rloo wins\npower: two seeds, for cost\n"
        "reading: grpo ended at {grpo.final}, rloo at {rloo.final} ({ratio:rloo/grpo.iter_s} the time).\n"
    )
    out = run_findings(tmp_path, quick=True)
    text = out.read_text()
    assert "## F0: a test" in text and "*Folk claim:* rloo wins" in text and "Quick mode" in text
    assert "(then `creditrl findings`).\n\n*Power:* two seeds, for cost\n\n| arm |" in text
    assert "grpo ended at " in text and "{" not in text.split("*Reading.*")[1]
    assert (tmp_path / "docs" / "findings" / "F0_accuracy_vs_samples.png").stat().st_size > 5000
    assert "| grpo | 2 |" in text


GRID = (
    "name: g\nbase: demo_quick\nseeds: [0, 1]\nbudget: {samples: 32}\nreference: grpo\n"
    "set: [train.eval_every=1, train.checkpoint_every=1000, train.inspect_every=0]\n"
    "arms:\n  grpo: [credit.estimator=grpo]\n  rloo: [credit.estimator=rloo]\n"
)
FINDING = (
    "id: C9\nclaim_id: C4\ntitle: a test\ngrid: grids/g.yaml\nregime: tiny\ntask: arithmetic\n"
    "question: which?\nexpect: {rloo: better by 5}\n"
    "reading: rloo moved {rloo.diff} ({rloo.verdict}); grpo is {grpo.diff}.\n"
)


def _planted(source: Path, dest: Path, old: str, new: str, **fields) -> dict:
    """A run summary made from ``source``'s: ``old`` replaced by ``new`` in its overrides, ``fields``
    set, written to ``dest``; returned."""
    made = {**json.loads(source.read_text()), **fields}
    made["overrides"] = [o.replace(old, new) for o in made["overrides"]]
    dest.parent.mkdir(parents=True)
    dest.write_text(json.dumps(made))
    return made


def test_findings_persist_run_summaries_and_rebuild_from_them_alone(tmp_path: Path, monkeypatch, capsys):
    """Each finished run leaves a committed-size summary; --no-train rebuilds FINDINGS.md from the
    summaries alone, byte for byte, after the run directories are gone; a grid with runs missing
    is shown in progress; the verdict table opens the file."""
    from creditrl.cli import main
    from creditrl.experiments import launch, plan

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "grids").mkdir()
    (tmp_path / "findings").mkdir()
    (tmp_path / "grids" / "g.yaml").write_text(GRID)
    (tmp_path / "findings" / "C9.yaml").write_text(FINDING)
    (tmp_path / "findings" / "legacy.md").write_text("## Earlier findings\n\nAs they were.\n")
    pending = tmp_path / "pending.md"
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(pending)]) == 0
    assert "*In progress:* 0 of 4 runs finished and summarised" in pending.read_text()
    assert "Not measured yet: C1 (length" in pending.read_text()
    first = run_findings(tmp_path, runs=tmp_path / "runs").read_text()
    files = sorted((tmp_path / "findings" / "runs" / "g").glob("*/seed*.json"))
    assert [f.relative_to(tmp_path / "findings" / "runs" / "g").as_posix() for f in files] == [
        "grpo/seed0.json",
        "grpo/seed1.json",
        "rloo/seed0.json",
        "rloo/seed1.json",
    ]
    assert all(f.stat().st_size < 20_000 for f in files)
    import json

    summary = json.loads(files[0].read_text())
    assert summary["budget"] == 32 and summary["unit"] == "samples" and summary["seed"] == 0
    assert Path(summary["init"]).is_dir()  # the SFT start the run resolved, not "sft"
    assert [e["iteration"] for e in summary["evals"]] == [0, 1, 2] and "eval/correct" in summary["evals"][-1]
    row = next(x for x in first.splitlines() if x.startswith("| [C4](#c9) | rloo vs grpo | better by 5 points |"))
    assert row.split("|")[4].strip() in ("**supported**", "**contradicted**", "**inconclusive**")
    assert "rloo moved " in first and "grpo is the reference." in first and "## Earlier findings" in first
    assert "CPU-hours of RL and evaluation over 4 runs (the SFT start not counted); the 15-minute load average" in first
    assert summary["load"] >= 0 and "load" not in summary["launch"]
    import shutil

    shutil.rmtree(tmp_path / "runs")

    def no_training(*a, **k):
        raise AssertionError("a run trained")

    monkeypatch.setattr(launch, "_run_one", no_training)
    again = tmp_path / "again.md"
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(again)]) == 0
    assert again.read_text() == first
    printed = capsys.readouterr().out
    assert f"[creditrl findings] wrote {again} (2 findings)" in printed  # C9 and the legacy page
    assert re.search(r"\[creditrl findings\] done in \d+ s\n", printed)  # imports included
    # a second grid with the very same grpo arm reads its runs from the first grid's summaries;
    # the same arm with another override is another run
    from creditrl.experiments.grid import load_grid

    (tmp_path / "grids" / "g2.yaml").write_text(GRID.replace("name: g\n", "name: g2\n"))
    g2 = load_grid(tmp_path / "grids" / "g2.yaml")
    where = tmp_path / "findings" / "runs" / "g2"
    same = {"grpo": g2.arms["grpo"]}
    assert plan.summarised_arms(dataclasses.replace(g2, arms=same), where) == {"grpo": 2}
    other = {"grpo": [*g2.arms["grpo"], "loss.kl_coef=0.1"]}
    assert plan.summarised_arms(dataclasses.replace(g2, arms=other), where) == {"grpo": 0}
    shared = launch.run_arms(dataclasses.replace(g2, arms=same), tmp_path / "r2", "sft", summaries=where)
    assert [h[-1]["eval/correct"] for h in shared["grpo"]] == [
        json.loads(f.read_text())["evals"][-1]["eval/correct"] for f in files[:2]
    ]
    assert not where.exists()  # nothing was copied
    # a grid whose reference and one arm have every seed (read from g) and one arm has none: those
    # two are reported with their verdict, the third is named in progress, and a reading that
    # names the third waits; one that names only the reported arms is given
    (tmp_path / "grids" / "g3.yaml").write_text(
        GRID.replace("name: g\n", "name: g3\n") + "  reinforce: [credit.estimator=reinforce]\n"
    )
    c10 = (
        FINDING.replace("id: C9", "id: C10")
        .replace("grids/g.yaml", "grids/g3.yaml")
        .replace("{rloo: better by 5}", "{rloo: better by 5, reinforce: better}")
    )
    partial = tmp_path / "partial.md"
    (tmp_path / "findings" / "C10.yaml").write_text(c10.replace("grpo is {grpo.diff}", "{ratio:reinforce/grpo.wall_s}"))
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(partial)]) == 0
    text = partial.read_text()
    section = text[text.index("## C10:") : text.index("## C9:")]  # sorted by file name
    assert (
        "*In progress:* **reinforce** 0 of 2 seeds; the table and the verdicts above are those of the arms " in section
    )
    assert "the reading waits for the rest" in section
    assert "*Reading.*" not in section and "over 4 runs (the SFT start not counted)" in section
    (tmp_path / "findings" / "C10.yaml").write_text(c10)
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(partial)]) == 0
    text = partial.read_text()
    section = text[text.index("## C10:") : text.index("## C9:")]
    assert "*Reading.* rloo moved " in section and "; grpo is the reference.\n" in section
    assert "the table, the verdicts and the reading above are those of the arms with every seed (" in section
    assert "| rloo | 2 |" in section and "| reinforce |" not in section
    assert "arms not reported yet" not in section  # reinforce has no finished run to list
    assert text.count("| rloo vs grpo | better by 5 points |") == 2  # C9's row and C10's
    assert "reinforce vs grpo" not in text
    # the waiting arm with one of its seeds summarised: that run is listed on its own, with no verdict
    waiting = tmp_path / "findings" / "runs" / "g3" / "reinforce" / "seed0.json"
    # rloo seed 0, under the waiting arm's name and overrides
    made = _planted(files[2], waiting, "estimator=rloo", "estimator=reinforce", arm="reinforce")
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(partial)]) == 0
    text = partial.read_text()
    section = text[text.index("## C10:") : text.index("## C9:")]
    assert "*In progress:* **reinforce** 1 of 2 seeds;" in section
    listed = section[section.index("The finished runs of the arms not reported yet") :]
    end = 100 * made["evals"][-1]["eval/accuracy"]
    assert "| reinforce | 0 | " in listed and f"| {end:.1f}% |" in listed and "| rloo |" not in listed
    assert "reinforce vs grpo" not in text
    waiting.unlink()
    # one claim in two settings: small multiples under the verdict table; one setting alone has none
    assert "C4 in each of its settings (C10, C9):\n\n![C4_settings](docs/findings/C4_settings.png)" in text
    assert text.index("C4_settings.png") < text.index("## C10:") and "in each of its settings" not in first
    assert (tmp_path / "docs" / "findings" / "C4_settings.png").stat().st_size > 10_000
    # a grid whose reference has no run yet: no verdict, but each finished run's own numbers
    (tmp_path / "grids" / "g4.yaml").write_text(
        GRID.replace("name: g\n", "name: g4\n").replace("reference: grpo", "reference: reinforce")
        + "  reinforce: [credit.estimator=reinforce]\n"
    )
    (tmp_path / "findings" / "C11.yaml").write_text(FINDING.replace("id: C9", "id: C11").replace("g.yaml", "g4.yaml"))
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(partial)]) == 0
    text = partial.read_text()
    section = text[text.index("## C11:") : text.index("## C9:")]
    assert "*In progress:* 4 of 6 runs finished and summarised" in section and "*Reading.*" not in section
    assert " vs reinforce" not in section and "| verdict |" not in section  # no row against a reference with no run
    for f in files:  # grpo 0, grpo 1, rloo 0, rloo 1, in plan order, numbers from the summaries
        s = json.loads(f.read_text())
        acc = [100 * e["eval/accuracy"] for e in s["evals"]]
        row = (
            f"| {s['arm']} | {s['seed']} | {acc[0]:.1f}% | {acc[-1]:.1f}% | {max(acc):.1f}% "
            f"| {s['evals'][-1]['time/total_s']:,.0f} s | {s['launch']['cpu']} |"
        )
        assert row in section
    assert section.index("| grpo | 1 |") < section.index("| rloo | 0 |") and "| reinforce" not in section
    assert "(#c11)" not in text and "(#c9)" in text  # no verdict row of it in the table at the top
    # a grid whose seeds grew from 2 to 3 (its seeds 0 and 1 read from g's summaries): each arm on the
    # seeds it has, with a verdict, and the note says so
    (tmp_path / "grids" / "g5.yaml").write_text(GRID.replace("name: g\n", "name: g5\n").replace("[0, 1]", "[0, 1, 2]"))
    c12 = FINDING.replace("id: C9", "id: C12").replace("claim_id: C4", "claim_id: C6").replace("g.yaml", "g5.yaml")
    (tmp_path / "findings" / "C12.yaml").write_text(c12)
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(partial)]) == 0
    text = partial.read_text()
    section = text[text.index("## C12:") : text.index("## C9:")]
    assert (
        "*In progress:* **grpo** 2 of 3 seeds; **rloo** 2 of 3 seeds; the table, the verdicts and the reading"
        in section
    )
    assert "each on the seeds it has run, each difference and verdict on the seeds its two arms share" in section
    c9 = text[text.index("## C9:") :]
    assert (
        section[section.index("| arm |") : section.index("*Reading.*")].split("\n\n")[0]
        == (c9[c9.index("| arm |") :].split("\n\n")[0])
    )  # the same runs, the same table as the 2-seed grid's
    assert text.count("| rloo vs grpo | better by 5 points |") == 3  # C9's, C10's and C12's rows
    # the reference's seed 2 lands first (a copy of its seed 0's summary as seed 2): the reference is
    # shown on 3 seeds, and its difference to rloo and their verdict pair the 2 seeds both ran
    third = tmp_path / "findings" / "runs" / "g5" / "grpo" / "seed2.json"
    _planted(files[0], third, "train.seed=0", "train.seed=2", seed=2)  # grpo seed 0
    assert main(["findings", "--root", str(tmp_path), "--no-train", "--out", str(partial)]) == 0
    text = partial.read_text()
    section = text[text.index("## C12:") : text.index("## C9:")]
    assert "*In progress:* **rloo** 2 of 3 seeds; the table" in section
    assert "| grpo | 3 |" in section and "| rloo | 2 |" in section
    rloo = next(line for line in section.splitlines() if line.startswith("| rloo | +"))  # the differences row
    assert rloo.endswith("| 2 |")  # the seeds it pairs
    c9_rloo = next(line for line in c9.splitlines() if line.startswith("| rloo | +"))
    assert rloo.split("|")[2:6] == c9_rloo.split("|")[2:6]  # the 2-seed grid's difference, to the digit
    row = next(line for line in text.splitlines() if line.startswith("| [C6](#c12) | rloo vs grpo |"))
    assert "seed-level paired t, 2 seeds," in row
    third.unlink()


def test_the_committed_findings_rebuild_from_their_summaries(tmp_path: Path) -> None:
    """FINDINGS.md is exactly what `creditrl findings --no-train` writes from the committed summaries."""
    root = Path(__file__).resolve().parents[2]
    out = run_findings(root, out=tmp_path / "FINDINGS.md", runs=tmp_path / "runs", train=False)
    assert out.read_text() == (root / "FINDINGS.md").read_text()
    written = json.loads((tmp_path / "docs" / "findings" / "verdicts.json").read_text())
    assert written == json.loads((root / "docs" / "findings" / "verdicts.json").read_text())
    table = out.read_text().split("\n\n## ")[0]
    for row in written["rows"]:  # each row's verdict and interval, as FINDINGS.md's opening table states them
        d = row["difference"]
        assert d["lo"] <= d["mean"] <= d["hi"] and 0 < d["level"] < 1
        assert f"{100 * d['mean']:+.1f}" in table and row["verdict"] in table


def test_only_names_grid_findings_and_an_unknown_id_is_one_line(tmp_path: Path, capsys) -> None:
    from creditrl.cli import main

    (tmp_path / "grids").mkdir()
    (tmp_path / "findings").mkdir()
    (tmp_path / "grids" / "g.yaml").write_text(GRID)
    (tmp_path / "findings" / "C9.yaml").write_text(FINDING)
    assert main(["findings", "--root", str(tmp_path), "--only", "C9", "C7-x"]) == 2
    assert "--only: no grid finding C7-x; findings: C9" in capsys.readouterr().err
    # --only trains; with --no-train (nothing trains) it is refused before anything runs
    assert main(["findings", "--root", str(tmp_path), "--only", "C9", "--no-train"]) == 2
    err = capsys.readouterr().err
    assert "--only C9 trains those grids, and --no-train trains nothing" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "FINDINGS.md").exists()


def _committed(finding_file: str) -> tuple[dict, dict, list[int]]:
    """A finding and its grid's per-arm histories, from the committed summaries."""
    from creditrl.experiments.grid import load_grid
    from creditrl.experiments.plan import summary_files
    from creditrl.experiments.summaries import history, read_summary

    root = Path(__file__).resolve().parents[2]
    finding = load_finding(root / "findings" / finding_file)
    grid = load_grid(root / finding["grid"])
    where = root / "findings" / "runs" / grid.name
    files = iter(summary_files(grid, where))
    results = {arm: [history(read_summary(next(files))) for _ in grid.seeds] for arm in grid.arms}
    return {**finding, "reference": grid.reference}, results, grid.seeds


def _reading(finding: dict, results: dict, seeds: list[int]) -> str:
    from dataclasses import asdict

    from creditrl.experiments.claim_verdicts import comparisons, judge
    from creditrl.experiments.compare_report import summarise_arm

    rows = [asdict(summarise_arm(arm, hs, None, 0.05)) for arm, hs in results.items()]
    judged = judge(comparisons(finding, results, finding["reference"], seeds))
    base = [r for r in judged if r["role"] == "stated baseline"]
    for r in rows:
        mine = [x for x in base if x["arm"] == r["arm"]]
        r["diff"], r["verdict"] = (mine[0]["difference"], mine[0]["verdict"]) if mine else (None, "not judged")
    return fill(finding["reading"], rows, results=results, verdicts=judged)


def test_a_readings_words_follow_the_numbers_when_two_arms_swap() -> None:
    """C1-short's reading from its committed summaries, then with the summaries of 8-token segments
    and the outcome with GRPO swapped: every word that says a direction or a verdict follows the
    numbers (none is typed in the template)."""
    finding, results, seeds = _committed("C1_arith_short.yaml")
    text = _reading(finding, results, seeds)
    swapped = {**results, "segment K=8": results["sequence + GRPO"], "sequence + GRPO": results["segment K=8"]}
    other = _reading(finding, swapped, seeds)
    segments = re.compile(r"segments (above|below|not shown different from) it \(([-+][\d.]+) points")
    assert segments.search(text).groups()[0] == "below" and segments.search(other).groups()[0] == "above"
    assert float(segments.search(text).group(2)) == -float(segments.search(other).group(2))
    verdicts = re.compile(r"8-token segments [-+][\d.]+ points \[[^]]+\] at [\d.]+% \((\w+)\)")
    grpo = re.compile(r"the outcome with GRPO moved ([-+][\d.]+) points \[[^]]+\] at [\d.]+% \((\w+)\)")
    assert verdicts.search(text).group(1) == "supported"  # no better than the critic arm, as predicted
    assert verdicts.search(other).group(1) == "inconclusive"  # the GRPO runs under the segment arm's name
    assert grpo.search(other).group(2) == "contradicted"  # the segment runs are not "the same" as the critic arm
    assert float(grpo.search(other).group(1)) < 0 < float(grpo.search(text).group(1))
    starts = re.compile(r"ended at [\d.]+ ± [\d.]+%, (above|below|not shown different from) its start")
    gae = {**results, "sequence + GAE": results["token"], "token": results["sequence + GAE"]}
    assert starts.search(text).group(1) == "above" and starts.search(_reading(finding, gae, seeds)).group(1) == (
        "not shown different from"
    )
