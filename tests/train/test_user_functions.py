"""User functions bounded and covered: a checker that raises, returns NaN or hangs, under every
``reward.on_error``, in training and in held-out evaluation; and the bounded calls themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.tasks.bounded import BoundedCalls, CallCounts, Outcome, UserFunctionError, covered, finite_number
from creditrl.train.rl import RLTrainer

ROOT = Path(__file__).resolve().parents[2]

# An arithmetic task whose checker misbehaves, picked by the MODE environment variable: `raises`
# on the problems whose prompt's character codes sum to an even number, `nan` returns NaN there, `hangs` sleeps
# (once, the first call: a marker file says it happened) far past any timeout.
HOSTILE = textwrap.dedent(
    """
    import math, os, time
    from pathlib import Path
    from creditrl.tasks.arithmetic import ArithmeticTask

    class Hostile(ArithmeticTask):
        def check_outcome(self, problem, completion):
            mode = os.environ["HOSTILE_MODE"]
            if mode == "hangs":
                marker = Path(os.environ["HOSTILE_MARKER"])
                if not marker.exists():
                    marker.write_text("hung")
                    time.sleep(600)
            elif sum(map(ord, problem.prompt)) % 2 == 0:
                if mode == "raises":
                    raise RuntimeError("checker exploded")
                if mode == "nan":
                    return math.nan
            return super().check_outcome(problem, completion)

    def make(**kwargs):
        return Hostile(**kwargs)

    def cut(texts):  # a cut function that fails on about half the responses, or hangs once
        if os.environ["HOSTILE_MODE"] == "hangs":
            return Hostile().check_outcome(None, "") or [len(texts) - 1]
        if sum(map(ord, "".join(texts))) % 2:
            raise ValueError("cannot cut this")
        return [len(texts) - 1]
    """
)
TINY = [
    "task.name=hostile_task:make",
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "train.init=policy",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
    "train.eval_size=8",
    "train.progress=false",
    "train.threads=1",
    "train.iterations=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "reward.timeout_s=2",
]


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "hostile_task.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HOSTILE_MARKER", str(tmp_path / "hung.marker"))
    return tmp_path


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("on_error", ["zero", "skip"])
@pytest.mark.parametrize("mode", ["raises", "nan"])
def test_a_failing_checker_is_counted_and_the_run_finishes(hostile, monkeypatch, mode: str, on_error: str) -> None:
    monkeypatch.setenv("HOSTILE_MODE", mode)
    cfg = load_config(overrides=TINY + [f"reward.on_error={on_error}"])
    RLTrainer.from_config(cfg, hostile / "run").run()
    got = rows(hostile / "run")
    assert [r["iteration"] for r in got] == [0, 1, 2]
    train = got[1:]
    failed = sum(r["reward/errors/check_outcome"] for r in train)
    assert failed > 0
    for r in train:
        # zero: the outcome source (which calls the checker) fails on the same responses; skip: those
        # responses left the batch before it scored them
        source = r["reward/errors/check_outcome"] if on_error == "zero" else 0
        assert r["reward/errors/outcome"] == source and r["reward/errors"] == source
    assert all(r["reward/timeouts/check_outcome"] == 0 for r in train)
    assert got[0]["eval/errors"] + got[-1]["eval/errors"] > 0  # held-out evaluation obeys the policy too
    for r in got:
        assert all(v == v for v in r.values() if isinstance(v, float))  # no NaN reached the metrics


def test_a_checker_that_hangs_once_times_out_and_the_run_goes_on(hostile, monkeypatch) -> None:
    monkeypatch.setenv("HOSTILE_MODE", "hangs")
    cfg = load_config(overrides=TINY + ["reward.on_error=zero"])
    start = time.time()
    RLTrainer.from_config(cfg, hostile / "run").run()
    assert time.time() - start < 120  # the 600 s sleep was cut at reward.timeout_s = 2
    got = rows(hostile / "run")
    assert [r["iteration"] for r in got] == [0, 1, 2]
    timeouts = got[0]["eval/timeouts"] + sum(r.get("reward/timeouts/check_outcome", 0) for r in got[1:])
    assert timeouts == 1 and (hostile / "hung.marker").exists()


def test_monte_carlo_value_targets_check_outcomes_under_the_same_policy(hostile, monkeypatch) -> None:
    monkeypatch.setenv("HOSTILE_MODE", "raises")
    over = ["value.source=mc", "value.mc_samples=2", "credit.estimator=gae", "credit.lam=0.0", "reward.on_error=zero"]
    RLTrainer.from_config(load_config(overrides=TINY + over), hostile / "run").run()
    got = rows(hostile / "run")[1:]
    assert len(got) == 2 and sum(r["value/check_errors"] for r in got) > 0
    assert all(r["value/check_timeouts"] == 0 for r in got)


@pytest.mark.parametrize("mode", ["raises", "hangs"])
def test_a_failing_cut_function_is_bounded_and_counted(hostile, monkeypatch, mode: str) -> None:
    monkeypatch.setenv("HOSTILE_MODE", mode)
    over = ["reward.source=oracle_steps", "reward.granularity=step", "reward.cut_fn=hostile_task:cut"]
    cfg = load_config(overrides=TINY + over + ["task.name=arithmetic", "reward.on_error=zero"])
    RLTrainer.from_config(cfg, hostile / "run").run()
    got = rows(hostile / "run")[1:]
    assert len(got) == 2
    errors = sum(r["reward/errors/cut_fn:step"] for r in got)
    timeouts = sum(r["reward/timeouts/cut_fn:step"] for r in got)
    assert (errors > 0 and timeouts == 0) if mode == "raises" else (errors == 0 and timeouts == 1)


def test_under_raise_the_command_stops_with_one_line_naming_the_function(hostile) -> None:
    sets = [a for s in TINY + ["reward.on_error=raise"] for a in ("--set", s)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hostile), str(ROOT / "src")]),
        "HOSTILE_MODE": "raises",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "creditrl.cli", "train", *sets, "--run-dir", str(hostile / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [x for x in proc.stderr.splitlines() if not x.startswith(("creditrl: engine", "creditrl: start policy"))]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("creditrl: error: check_outcome failed on ")
    assert lines[0].endswith("RuntimeError: checker exploded") and "Traceback" not in proc.stderr


def _slow(x: float) -> float:
    time.sleep(x)
    return x


def _dies(code: int) -> None:
    os._exit(code)


def test_bounded_calls_time_out_restart_and_keep_order() -> None:
    calls = BoundedCalls(timeout_s=0.5)
    calls.register("slow", _slow)
    calls.register("dies", _dies)
    out = calls.map("slow", [(0.0,), (30.0,), (0.01,), (30.0,), (0.0,)])
    assert [o.value for o in out] == [0.0, None, 0.01, None, 0.0]
    assert [o.timed_out for o in out] == [False, True, False, True, False]
    assert out[1].error == "timed out after 0.5 s"
    died = calls.map("dies", [(3,)])
    assert died[0].error == "the call ended its worker process (exit code 3)" and not died[0].timed_out
    assert [o.value for o in calls.map("slow", [(0.0,)])] == [0.0]  # a fresh worker
    calls.close()
    here = BoundedCalls(timeout_s=0)
    here.register("boom", lambda: 1 / 0)  # in process: no pickling, no worker
    assert here.map("boom", [()]) == [Outcome(error="ZeroDivisionError: division by zero")]


def test_a_function_registered_after_the_fork_reaches_a_new_worker() -> None:
    calls = BoundedCalls(timeout_s=5)
    calls.register("one", lambda: 1)
    assert calls.map("one", [()])[0].value == 1
    calls.register("two", lambda: 2)
    assert calls.map("two", [()])[0].value == 2
    calls.close()


def test_covered_applies_the_policy_and_counts() -> None:
    outcomes = [
        Outcome(value=1.0),
        Outcome(value=float("nan")),
        Outcome(error="boom"),
        Outcome(error="t", timed_out=True),
    ]
    counts = CallCounts()
    values, ok = covered("check_outcome", outcomes, "zero", counts, check=finite_number)
    assert values == [1.0, None, None, None] and ok == [True, False, False, False]
    assert counts.errors == {"check_outcome": 2} and counts.timeouts == {"check_outcome": 1}
    with pytest.raises(UserFunctionError) as err:
        covered("check_outcome", outcomes, "raise", CallCounts(), check=finite_number, describe=lambda i: f"row {i}")
    assert str(err.value) == "check_outcome failed on row 1: returned a non-finite value nan"
    with pytest.raises(UserFunctionError, match=r"^check_outcome failed on row 3: t \(reward.timeout_s\)$"):
        covered("check_outcome", outcomes[3:], "raise", CallCounts(), describe=lambda i: f"row {i + 3}")


# A TRL reward function that hangs on its second call (the first is the evaluation before training;
# a file counts the calls): a call scores a whole batch, so its timeout is an error of each response.
HANGING_REWARD = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    def hangs_on_the_second_call(prompts, completions, **kwargs):
        marker = Path(os.environ["HOSTILE_MARKER"])
        with marker.open("a") as f:
            f.write("call\\n")
        if len(marker.read_text().splitlines()) == 2:
            time.sleep(600)
        return [0.5 for _ in completions]
    """
)


def test_a_batched_reward_function_that_hangs_times_out_for_its_whole_batch(hostile) -> None:
    (hostile / "hanging_reward.py").write_text(HANGING_REWARD)
    name = f"{hostile / 'hanging_reward.py'}:hangs_on_the_second_call"
    over = ["task.name=arithmetic", f"reward.source={name}", "reward.on_error=zero"]
    start = time.time()
    RLTrainer.from_config(load_config(overrides=TINY + over), hostile / "run").run()
    assert time.time() - start < 120  # the 600 s sleep was cut at reward.timeout_s = 2
    got = rows(hostile / "run")
    assert [r[f"reward/timeouts/{name}"] for r in got[1:]] == [16, 0]  # every response of the first batch
    assert [r["reward/mean"] for r in got[1:]] == [0.0, pytest.approx(0.5)]
    assert got[0]["eval/reward"] == got[-1]["eval/reward"] == 0.5  # evaluations call it once each, bounded too
    # one call per batch: the first evaluation, iteration 1 (hung), iteration 2, the last evaluation
    assert len((hostile / "hung.marker").read_text().splitlines()) == 4
