"""The PRM command line (label -> train -> eval -> score), the ``prm`` reward source in RL, and
the quick PRM report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from creditrl.cli import main
from creditrl.config import load_config
from creditrl.prm.data import load_stepwise
from creditrl.prm.pipeline import to_steps
from creditrl.prm.source import load_prm, prm_reward_source, prm_step_scores
from creditrl.rewards.sources import make_source, score_batch
from creditrl.tasks import make_task
from creditrl.train.rl import RLTrainer

# A short SFT on 1-2-operation problems, then everything at toy sizes.
SMALL = [
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "sft.task_args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "sft.steps=150",
    "sft.batch_size=32",
    "sft.warmup_steps=10",
    "sft.lr=0.003",
    "rollout.max_new_tokens=20",
    "train.progress=false",
    "train.eval_size=4",
    "prm.problems=12",
    "prm.samples=2",
    "prm.steps=20",
    "prm.batch_size=8",
    "prm.mc_n=2",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("prm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(root / "cache"))
        sets = [x for kv in SMALL for x in ("--set", kv)]
        assert main(["prm", "label", "--out", str(root / "train.jsonl"), *sets]) == 0
        assert main(["prm", "label", "--out", str(root / "held.jsonl"), *sets, "--set", "prm.split=heldout"]) == 0
        assert main(["prm", "train", str(root / "train.jsonl"), "--out", str(root / "prm"), *sets]) == 0
        yield root


def test_label_writes_steps_that_rebuild_the_completion_with_true_verdicts(workdir: Path) -> None:
    task = make_task("arithmetic", min_ops=1, max_ops=2, operand_max=3)
    examples = load_stepwise(workdir / "train.jsonl")
    assert 0 < len(examples) <= 24
    for ex in examples:
        assert "".join(ex.completions) == ex.meta["completion"]
        assert ex.labels == ex.meta["oracle"]  # the default labeler is the oracle
        problem = task.make_problem(ex.prompt)
        assert ex.meta["outcome"] == float(task.check_outcome(problem, ex.meta["completion"]))


def test_mc_and_vote_labelers_report_their_cost(workdir: Path, capsys) -> None:
    sets = [x for kv in SMALL for x in ("--set", kv)]
    out = workdir / "mc.jsonl"
    assert (
        main(["prm", "label", "--out", str(out), *sets, "--set", "prm.labeler=vote", "--set", "prm.vote_threshold=1.0"])
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    assert info["labeler"] == "vote" and info["mc/continuations"] == 2 * info["mc/prefixes"]
    assert info["vote/dropped"] >= 0 and 0.0 <= info["coverage"] <= 1.0


def test_train_writes_a_loadable_prm_and_eval_prints_auroc(workdir: Path, capsys) -> None:
    metrics = json.loads((workdir / "prm" / "train_metrics.json").read_text())
    assert metrics["prm/steps"] == 20 and metrics["prm/examples_used"] > 0
    prm, tok = load_prm(str(workdir / "prm"))
    assert prm.members == 1
    assert main(["prm", "eval", str(workdir / "prm"), str(workdir / "held.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "step AUROC against the oracle labels:" in out and "auroc_length" in out
    assert "baseline, the reference policy's summed step log-prob alone" in out  # likelihood PRM (default)
    assert main(["prm", "score", str(workdir / "prm"), "--prompt", "1+2*3=", "--completion", "2*3=6;1+6=7;#7"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["2*3=6;", "1+6=7;", "#7"]
    assert all(0.0 < float(line.split()[0]) < 1.0 for line in lines)


def test_eval_refuses_a_file_without_true_labels(workdir: Path, tmp_path: Path, capsys) -> None:
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": "1+1=", "completions": ["1+1=2;", "#2"], "labels": [1, 1]}) + "\n")
    assert main(["prm", "eval", str(workdir / "prm"), str(bare)]) == 2
    assert "meta.oracle" in capsys.readouterr().err


def test_prm_source_scores_steps_in_one_batch_and_skips_empty_spans(workdir: Path) -> None:
    prm, tok = load_prm(str(workdir / "prm"))
    source = make_source("prm", {"prm": str(workdir / "prm")})
    assert source.granularities == {"step"} and source.batch_fn is not None
    task = make_task("arithmetic", min_ops=1, max_ops=2, operand_max=3)
    problems = [task.make_problem("1+2*3="), task.make_problem("2-1=")]
    spans = [["2*3=6;", "1+6=7;", "#7"], ["2-1=1;", "#1", ""]]
    res = score_batch(source, task, problems, ["".join(s) for s in spans], spans, granularity="step")
    direct = prm.score(tok, [("1+2*3=", spans[0]), ("2-1=", spans[1][:2])])
    assert res.scores[0] == pytest.approx(direct[0])
    assert res.scores[1][:2] == pytest.approx(direct[1]) and res.scores[1][2] is None  # an eos-only span
    assert prm_step_scores(prm, tok, ["1+2*3="], [spans[0]])[0] == pytest.approx(direct[0])
    # the per-response fallback gives the same numbers
    single = prm_reward_source(str(workdir / "prm")).fn(task, problems[0], "", spans[0])
    assert single == pytest.approx(direct[0])
    # reward.prm follows policy.device: the CPU here, and a clear error for a GPU torch cannot see
    placed = make_source("prm", {"prm": str(workdir / "prm"), "device": "auto"})
    assert placed.fn(task, problems[0], "", spans[0]) == pytest.approx(direct[0])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="policy.device: 'cuda' but torch sees no CUDA device"):
            make_source("prm", {"prm": str(workdir / "prm"), "device": "cuda"})


def test_rl_with_the_prm_as_step_reward(workdir: Path, tmp_path: Path) -> None:
    cfg = load_config(
        overrides=SMALL
        + [
            "reward.source=prm",
            f"reward.prm={workdir / 'prm'}",
            "credit.estimator=grpo_process",
            "rollout.prompts_per_iter=2",
            "rollout.group_size=3",
            "train.iterations=2",
            "train.eval_every=100",
            "train.init=policy",
            "policy.model=tiny",
        ]
    )
    rows = RLTrainer.from_config(cfg, tmp_path / "run").run().history
    placed = [r["reward/placed_per_response"] for r in rows[1:]]
    assert all(p >= 0 for p in placed)
    assert all(0.0 <= r["reward/mean"] for r in rows[1:])


def test_to_steps_keeps_separators_and_drops_empty_pieces() -> None:
    assert to_steps("3*2=6;7+6=13;#13", ";") == ["3*2=6;", "7+6=13;", "#13"]
    assert to_steps("3*2=6;;", ";") == ["3*2=6;", ";"]
    assert to_steps("", ";") == []


def test_prm_as_a_calibrated_dense_reward_logs_its_agreement(workdir: Path, tmp_path: Path) -> None:
    cfg = load_config(
        overrides=SMALL
        + [
            "reward.source=outcome",
            f"reward.prm={workdir / 'prm'}",
            "hybrid.dense_source=prm",
            "hybrid.calibrate=true",
            "credit.estimator=grpo_process",
            "rollout.prompts_per_iter=2",
            "rollout.group_size=3",
            "train.iterations=3",
            "train.eval_every=100",
        ]
    )
    sft = next((workdir / "cache" / "sft").iterdir())
    rows = RLTrainer.from_config(cfg, tmp_path / "run", init_path=str(sft)).run().history
    agreement = [r["hybrid/agreement"] for r in rows[1:]]
    assert all(0.0 <= a <= 1.0 for a in agreement)
    # the dense weight is the calibrator's: dense_weight * clamp((agreement - 0.5) / 0.5, 0, 1)
    for r in rows[1:]:
        assert r["hybrid/w_dense"] == pytest.approx(max(0.0, min(1.0, (r["hybrid/agreement"] - 0.5) / 0.5)))


def test_reward_prm_auto_trains_once_and_is_read_back(workdir: Path, tmp_path: Path, monkeypatch) -> None:
    """``reward.prm=auto``: the first run labels its start policy's samples, trains and caches a
    PRM (with its held-out AUROC); the second run with the same settings trains nothing."""
    import creditrl.prm.train as prm_train

    monkeypatch.setenv("CREDITRL_CACHE", str(workdir / "cache"))
    calls = []
    real = prm_train.train_prm_from_examples
    monkeypatch.setattr(prm_train, "train_prm_from_examples", lambda *a, **k: calls.append(1) or real(*a, **k))
    over = SMALL + [
        "reward.source=prm",
        "reward.prm=auto",
        "credit.estimator=grpo_process",
        "rollout.prompts_per_iter=2",
        "rollout.group_size=3",
        "train.iterations=1",
        "train.eval_every=100",
    ]
    first = RLTrainer.from_config(load_config(overrides=over), tmp_path / "a")
    prm_dir = Path(first.cfg.reward.prm)
    assert prm_dir.parent == workdir / "cache" / "prm" and len(calls) == 1
    info = json.loads((prm_dir / "prm_info.json").read_text())
    assert 0.0 <= info["prm/heldout_auroc"] <= 1.0 and info["examples"] > 0
    assert info["prm/label_s"] > 0 and info["prm/cost_s"] == pytest.approx(info["prm/label_s"] + info["prm/time_s"])
    history = first.run().history
    assert history[-1]["reward/placed_per_response"] > 0
    assert history[0]["time/prm_s"] == info["prm/cost_s"]  # the run is charged what its PRM cost
    # and records what its PRM learned from: its labels against the oracle's, its held-out AUROC
    assert history[0]["prm/label_agreement"] == info["agreement"] and 0.0 <= info["agreement"] <= 1.0
    assert history[0]["prm/label_coverage"] == info["coverage"]
    assert history[0]["prm/label_fpr"] == info["false_positive_rate"]
    assert history[0]["prm/heldout_auroc"] == info["prm/heldout_auroc"]
    # and its cost in units no machine changes: the tokens its labelling generated, the positions it trained
    assert history[0]["prm/generated_tokens"] == info["prm/generated_tokens"] >= info["prm/sample_tokens"] > 0
    assert history[0]["prm/trained_positions"] == info["prm/trained_positions"] > 0
    assert history[0]["prm/cpu_s"] == info["prm/cpu_s"] > 0  # and the CPU seconds labelling and training took
    assert not any(k.startswith("prm/") for row in history[1:] for k in row)  # once, in the start row
    assert load_config(tmp_path / "a" / "config.yaml").reward.prm == str(prm_dir)  # the run records the PRM it used
    second = RLTrainer.from_config(load_config(overrides=over), tmp_path / "b")
    assert second.cfg.reward.prm == str(prm_dir) and len(calls) == 1
    # another prm setting is another PRM
    third = RLTrainer.from_config(load_config(overrides=over + ["prm.steps=10"]), tmp_path / "c")
    assert third.cfg.reward.prm != str(prm_dir) and len(calls) == 2


def test_mc_labels_come_from_prm_completer_when_set(workdir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """``prm.completer``: the MC labeler continues prefixes with that checkpoint instead of the
    labelled policy. An untrained completer never reaches an answer, so every MC label before the
    answer step is 0, while the SFT policy completing its own prefixes labels some correct."""
    from creditrl.policy.model import load_policy

    monkeypatch.setenv("CREDITRL_CACHE", str(workdir / "cache"))  # the module's SFT policy
    untrained = tmp_path / "untrained"
    model, tok = load_policy("tiny", seed=3)
    model.save_pretrained(untrained)
    tok.save_pretrained(untrained)
    sets = [x for kv in SMALL + ["prm.labeler=mc"] for x in ("--set", kv)]
    labels = {}
    for name, extra in (("self", []), ("untrained", ["--set", f"prm.completer={untrained}"])):
        out = tmp_path / f"{name}.jsonl"
        assert main(["prm", "label", "--out", str(out), *sets, *extra]) == 0
        capsys.readouterr()
        # every step but the last: a prefix that holds the answer is judged as it stands, uncompleted
        labels[name] = [x for ex in load_stepwise(out) for x in ex.labels[:-1] if x is not None]
    assert len(labels["self"]) == len(labels["untrained"]) > 0  # the same samples, labelled twice
    assert 1.0 in labels["self"] and set(labels["untrained"]) == {0.0}


def test_prm_completer_errors_and_cache_key(tmp_path: Path) -> None:
    from creditrl.config import config_hash
    from creditrl.policy.model import load_policy
    from creditrl.prm.cache import CACHE_VERSION, load_completer, prm_key

    model, tok = load_policy("tiny")
    with pytest.raises(ValueError, match="prm.completer: not a checkpoint directory: .*nowhere"):
        load_completer(load_config(overrides=[f"prm.completer={tmp_path / 'nowhere'}"]), model, tok)
    assert load_completer(load_config(), model, tok) == (model, tok)  # empty: the policy itself
    cfg = load_config()
    old = cfg.prm.model_dump()
    del old["completer"]  # caches from before the key existed keep their keys
    del old["mc_rows_per_call"], old["mc_positions_per_call"]  # memory bounds, never in the key
    assert prm_key(cfg, "x") == config_hash(
        {
            "v": CACHE_VERSION,
            "init": "x",
            "task": cfg.task.model_dump(),
            "prm": old,
            "max_new_tokens": cfg.rollout.max_new_tokens,
        }
    )
    assert prm_key(load_config(overrides=["prm.completer=/some/dir"]), "x") != prm_key(cfg, "x")
    # a run resolves prm.completer="" to its start policy: the same PRM, the same key
    assert prm_key(load_config(overrides=["prm.completer=x"]), "x") == prm_key(cfg, "x")
    assert load_completer(load_config(overrides=["prm.completer=tiny", "train.init=tiny"]), model, tok) == (model, tok)
    assert prm_key(load_config(overrides=["prm.mc_rows_per_call=64"]), "x") == prm_key(cfg, "x")
    assert prm_key(load_config(overrides=["prm.mc_positions_per_call=4096"]), "x") == prm_key(cfg, "x")


def test_reward_prm_auto_without_an_auroc_records_why_and_trains_on(workdir: Path, tmp_path: Path, monkeypatch) -> None:
    """A start whose held-out steps are all wrong (or all right) has no AUROC: the cached PRM says
    why in prm_info.json instead of failing the run that needs it."""
    import creditrl.prm.pipeline as pipeline

    monkeypatch.setenv("CREDITRL_CACHE", str(workdir / "cache"))

    def one_class(*a, **k):
        raise ValueError("AUROC needs both classes among the labels; only negative (0) labels are present")

    monkeypatch.setattr(pipeline, "evaluate_prm", one_class)
    over = SMALL + ["reward.source=prm", "reward.prm=auto", "credit.estimator=grpo_process", "prm.steps=7"]
    trainer = RLTrainer.from_config(load_config(overrides=over + ["train.iterations=1"]), tmp_path / "run")
    info = json.loads((Path(trainer.cfg.reward.prm) / "prm_info.json").read_text())
    assert info["prm/heldout_auroc"] is None and "only negative (0) labels" in info["prm/heldout_note"]
    assert info["prm/cost_s"] > 0
