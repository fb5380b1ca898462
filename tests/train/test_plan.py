"""The loop reads the plan, not the config: ``build_run`` resolves every setting once
(:mod:`creditrl.train.plan`), the loop's modules read no config attribute, and nothing calls back
into :mod:`creditrl.train.resolve` after the plan is built."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import shutil
import sys
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.train import plan as plan_module
from creditrl.train import resolve
from creditrl.train.plan import CreditSettings, UpdateSettings, plan_of

TRAIN = Path(plan_module.__file__).resolve().parent
LOOP = ("rl.py", "rl_start.py", "rl_output.py", "stages.py", "update.py")  # the loop and what it calls
BEHAVIOUR = Path(__file__).resolve().parents[1] / "fixtures" / "behaviour"


def config_reads(source: str) -> list[str]:
    """Each read of an attribute of ``cfg`` / ``config``, or of an attribute named so (``self.cfg``,
    ``parts.config``), in ``source``, as ``line: text``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        value = node.value
        if (isinstance(value, ast.Name) and value.id in ("cfg", "config")) or node.attr in ("cfg", "config"):
            out.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(out)]


# the one read, of the config object whole: the trainer keeps it as ``trainer.cfg`` for callers
# that inspect a built run
PASSED_WHOLE = {"rl.py": ["parts.config"]}


@pytest.mark.parametrize("name", LOOP)
def test_the_loop_reads_no_config_attribute(name: str) -> None:
    reads = [r.split(": ", 1)[1] for r in config_reads((TRAIN / name).read_text())]
    assert reads == PASSED_WHOLE.get(name, [])


# the parts the loop calls: each takes its settings (its config sections), read from the config in
# at most one ``of`` classmethod
STAGES = ("rewards/stage.py", "values/stage.py", "inspect/record.py")


@pytest.mark.parametrize("name", STAGES)
def test_the_stages_read_the_config_only_where_their_settings_are_made(name: str) -> None:
    source = (TRAIN.parent / name).read_text()
    made = [
        range(node.lineno, node.end_lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "of"
    ]
    reads = config_reads(source)
    outside = [r for r in reads if not any(int(r.split(":")[0]) in lines for lines in made)]
    assert outside == []


def test_the_checker_finds_config_reads() -> None:
    src = "def f(self, cfg, p):\n    a = cfg.train.seed\n    b = self.cfg\n    c = p.config.x\n    self.cfg = 1\n"
    assert config_reads(src) == ["2: cfg.train", "3: self.cfg", "4: p.config"]


def test_the_plan_holds_the_resolved_settings() -> None:
    over = ["train.iterations=10", "optim.warmup_iterations=4", "credit.lam=0.5", "credit.lam_end=0.9"]
    cfg = load_config(overrides=[*over, "train.max_tokens=100", "train.eval_every=3"])
    plan = plan_of(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.iterations = 3
    assert plan.saved_config == cfg.to_dict() and plan.credit == CreditSettings.of(cfg)
    assert plan.update == UpdateSettings.of(cfg) and plan.update.loss is cfg.loss
    assert [plan.lr_at(i) / cfg.optim.lr for i in (0, 3, 9)] == [0.25, 1.0, 1.0]
    assert plan.lam_at(0) == 0.5 and plan.lam_at(5) == pytest.approx(0.7) and plan.lam_at(10) == pytest.approx(0.9)
    assert [plan.due(d, plan.eval_every, False) for d in (1, 3, 4, 10)] == [False, True, False, True]
    assert plan.spent(100) and not plan.spent(99) and not plan_of(load_config()).spent(10**9)


def _test_behaviour():
    spec = importlib.util.spec_from_file_location("behaviour_test", Path(__file__).with_name("test_behaviour.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refuse_resolution(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every function of creditrl.train.resolve, wherever it was imported, raises from now on."""
    calls: list[str] = []
    originals = {
        id(f): name for name, f in vars(resolve).items() if inspect.isfunction(f) and f.__module__ == resolve.__name__
    }

    def refusing(name: str):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"creditrl.train.resolve.{name} called after the plan was built")

        return refuse

    for module in [m for n, m in sys.modules.items() if n.startswith("creditrl") and m is not None]:
        for attr, value in list(vars(module).items()):
            if id(value) in originals and inspect.isfunction(value):
                monkeypatch.setattr(module, attr, refusing(originals[id(value)]))
    return calls


@pytest.mark.slow
def test_resolution_is_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's quick outcome arm, built, then run with resolution refused: it completes with the
    behaviour fixture's numbers (``tests/train/test_behaviour.py``)."""
    import creditrl.rollout.batch as batch
    from creditrl.config.loader import demo_config_path
    from creditrl.experiments.demo import ARMS, _with
    from creditrl.train.rl import RLTrainer

    behaviour = _test_behaviour()
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(BEHAVIOUR.parents[2])
    monkeypatch.setattr(batch, "packed_reason", lambda *a: "policy.forward=hf")  # the HF pass, as the fixtures
    start = behaviour.generate.seed_cache(["demo_quick"])["demo_quick"]
    cfg = load_config(demo_config_path(True), _with([], ARMS["outcome + grpo"]))
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=str(start), overwrite=True)
    calls = _refuse_resolution(monkeypatch)
    trainer.run()
    assert calls == []
    fixture = tmp_path / "fixtures" / "demo_quick"  # this arm's fixture alone
    fixture.mkdir(parents=True)
    shutil.copy(BEHAVIOUR / "demo_quick" / "outcome_grpo.jsonl", fixture)
    monkeypatch.setattr(behaviour, "FIXTURES", fixture.parent)
    got = behaviour.generate.strip(tmp_path / "run" / "metrics.jsonl")
    assert behaviour._compare("demo_quick", {"outcome_grpo": got}) > 0


def test_a_stage_given_the_whole_config_says_what_it_takes() -> None:
    from creditrl.rewards.stage import Scorer
    from creditrl.values.stage import ValueStage

    cfg = load_config()
    with pytest.raises(TypeError, match=r"Scorer takes ScoreSettings\.of\(config\), got Config"):
        Scorer(cfg, None, None)
    with pytest.raises(TypeError, match=r"value section \(config\.value\), got Config"):
        ValueStage(cfg, None, None, None, None, None, precision="fp32", on_error="raise")
