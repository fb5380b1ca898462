"""The inspector's colour scale has a floor, its figures draw every token text without a missing
glyph and without the title over the colour bar, and --only-spread opens on a group with spread."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_rgba

from creditrl.config import load_config
from creditrl.inspect.figures import credit_figure, draw_credit, printable
from creditrl.inspect.html import page_data
from creditrl.inspect.record import InspectSettings, iteration_record
from creditrl.inspect.report import build_report
from creditrl.inspect.scale import ADV_FLOOR, scale_label, scale_max, shown
from creditrl.policy.engines import Generation
from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rollout.batch import batch_from_generation
from creditrl.tasks import make_task
from creditrl.train import stages
from creditrl.train.plan import CreditSettings
from creditrl.train.resolve import checked

WHITE = to_rgba(plt.get_cmap("RdBu_r")(0.5))


def test_scale_floor_numbers() -> None:
    assert ADV_FLOOR == 1e-6
    assert scale_max([5.7e-8, -5.7e-8, 0.0]) == 0.0 and scale_max([]) == 0.0
    assert scale_max([0.5, -0.75, 1e-7]) == 0.75 and scale_max([-2e-6]) == 2e-6
    assert shown(9.9e-7) == 0.0 and shown(-9.9e-7) == 0.0 and shown(1e-6) == 1e-6 and shown(-0.3) == -0.3
    assert [scale_label(x) for x in (0.0, 0.25, -1.0, 3.2e-5)] == ["0", "0.250", "-1.000", "3.2e-05"]


def response(texts: list[str], *, outcome: float = 1.0) -> dict:
    n = len(texts)
    return {
        "texts": texts,
        "special": {},
        "steps": [[0, n - 1]],
        "step_ends": [n - 1],
        "reward_mask": [n - 1],
        "labels": [True],
        "outcome": outcome,
    }


def cell_colours(fig) -> list[tuple]:
    ax = fig.axes[0]
    return [p.get_facecolor() for p in ax.patches]


def test_rounding_sized_advantages_are_drawn_white() -> None:
    """A group without spread: advantages of about 5.7e-8 (the issue's) are white, not saturated."""
    group = {"responses": [response(list("1+2=3")), response(list("1+2=3"))]}
    adv = [[5.7e-8] * 5, [-5.7e-8] * 5]
    fig = draw_credit(group, adv, "no spread", scale_max(a for row in adv for a in row))
    try:
        assert cell_colours(fig) == [WHITE] * 10
        bar = fig.axes[1]
        assert [t.get_text() for t in bar.get_yticklabels()] == ["0"]
    finally:
        plt.close(fig)
    # with a real scale, the same rounding-sized values beside real credit are still white
    adv = [[0.5, -0.5, 5.7e-8, 0.0, 0.25], [0.0] * 5]
    fig = draw_credit(group, adv, "spread", scale_max(a for row in adv for a in row))
    try:
        colours = cell_colours(fig)
        assert colours[2] == colours[3] == WHITE and colours[0] != WHITE and colours[1] != WHITE
        assert colours[0] == to_rgba(plt.get_cmap("RdBu_r")(1.0))  # +max: fully red
    finally:
        plt.close(fig)


def test_every_token_text_draws_without_a_missing_glyph(tmp_path: Path) -> None:
    texts = ["a", "\x08", "\x00", "\u2028", "\n", "é", "\x7f", "b"]
    assert printable("a\x08b") == "a\\x08b" and printable("é") == "é"
    group = {"responses": [response(texts)]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        credit_figure(group, [[0.1] * len(texts)], "title \x08 with a control character", tmp_path / "c.png", 0.1)
    assert [str(w.message) for w in caught if "missing from font" in str(w.message)] == []
    assert (tmp_path / "c.png").stat().st_size > 0


def test_the_title_keeps_clear_of_the_colour_bar() -> None:
    """A small scale (3e-5) once put the colour bar's exponent (offset text) under a long title."""
    group = {"responses": [response(list("12+34=46;#46")) for _ in range(4)]}
    adv = [[3e-5 * (k - 1.5)] * 12 for k in range(4)]
    title = "iteration 1, 12+34= (group 0): GRPO (the run's own); credit precision n/a (no negative credit) " * 2
    fig = draw_credit(group, adv, title, scale_max(a for row in adv for a in row))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax, bar = fig.axes
        assert bar.yaxis.get_offset_text().get_text() == ""
        assert "e-05" in " ".join(t.get_text() for t in bar.get_yticklabels())
        title_box, bar_box = ax.title.get_window_extent(renderer), bar.get_tightbbox(renderer)
        assert not title_box.overlaps(bar_box)
    finally:
        plt.close(fig)


TASK = ["task.args={min_ops: 2, max_ops: 2, operand_min: 1, operand_max: 9, operators: '+-'}"]


def record(iteration: int, all_same: bool) -> dict:
    """An iteration's saved groups: three groups, each with spread unless ``all_same`` (then every
    completion of every group is its problem's solution, and advantages are 0 up to rounding)."""
    cfg = checked(load_config(overrides=[*TASK, "train.inspect_groups=3"]))
    task, tok = make_task(cfg.task.name, **cfg.task.args), build_char_tokenizer()
    problems = task.sample(3, split="train", seed=0)
    texts, index = [], []
    for i, p in enumerate(problems):
        texts += [p.solution] * 4 if all_same else [p.solution, p.solution, "7;#0", "1;#1"]
        index += [i] * 4
    tokens = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    prompts = [[tok.bos_token_id] + tok(problems[i].prompt, add_special_tokens=False)["input_ids"] for i in index]
    gen = Generation(index, prompts, tokens, [[0.0] * len(t) for t in tokens], [True] * len(tokens))
    batch = batch_from_generation(gen, index, tok.pad_token_id)
    batch.extras.update(problems=[problems[i] for i in index], completions=texts)
    scored = stages.Scorer(stages.ScoreSettings.of(cfg), task, tok)(
        batch, progress=0.0, generator=torch.Generator().manual_seed(0)
    )
    adv, ret = stages.credit(batch, scored, CreditSettings.of(cfg))
    return json.loads(
        json.dumps(iteration_record(iteration, batch, scored, adv, ret, InspectSettings.of(cfg), tok, task))
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """Iteration 1 has groups with spread; iterations 11 and 20 (the last) have none."""
    run = tmp_path_factory.mktemp("run")
    (run / "inspect").mkdir()
    spread, flat = record(1, False), record(1, True)
    for it, rec in ((1, spread), (11, flat), (20, flat)):
        rec = copy.deepcopy(rec)
        rec["iteration"] = it
        (run / "inspect" / f"iter_{it:06d}.json").write_text(json.dumps(rec))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(21)))
    return run


def test_only_spread_opens_on_the_first_group_with_spread(run_dir: Path, tmp_path: Path) -> None:
    plain = build_report(run_dir, estimators="grpo", out=tmp_path / "plain", png=False)
    assert plain.shown == 20  # the last saved: it has no group with spread
    only = build_report(run_dir, estimators="grpo", out=tmp_path / "only", only_spread=True)
    assert only.shown == 1 and only.iterations == [1, 11, 20]
    data = page_data(run_dir, only.iterations, ["grpo"], only.shown, only_spread=True)
    view = data["iterations"][data["initial"]]
    assert data["initial"] == 0 and data["only_spread"] is True and data["floor"] == ADV_FLOOR
    assert view["iteration"] == 1 and [g["spread"] for g in view["groups"]] == [True, True, True]
    assert all(not g["spread"] for v in data["iterations"][1:] for g in v["groups"])
    credit_pngs = [p.name for p in only.pngs if p.name.startswith("credit_")]
    assert credit_pngs and all(name.startswith("credit_iter_000001_") for name in credit_pngs)
    # an explicit iteration is kept
    assert build_report(run_dir, iteration=11, out=tmp_path / "it", png=False, only_spread=True).shown == 11


def test_no_spread_advantages_are_rounding_and_scale_to_zero(run_dir: Path) -> None:
    """The saved no-spread groups' advantages are 0 or float rounding: the scale has no range."""
    data = page_data(run_dir, [20], ["grpo"], 20)
    advs = [
        a
        for e in data["iterations"][0]["estimators"].values()
        if e["available"]
        for g in e["adv"]
        for r in g
        for a in r
    ]
    assert max(abs(a) for a in advs) < ADV_FLOOR and scale_max(advs) == 0.0
