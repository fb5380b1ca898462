"""The data-parallel learner: ``torchrun --nproc_per_node 2`` (gloo, CPU) gives the gradients of
one process over the whole batch, with global loss denominators, for every aggregation mode."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from creditrl import cli
from creditrl.config import ConfigError, load_config
from creditrl.distributed import ddp
from creditrl.losses import AGGREGATIONS, aggregation_count
from creditrl.rollout.batch import micro_batches
from creditrl.train.rl import RLTrainer

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
TOL = 1e-6


def _load_case():
    spec = importlib.util.spec_from_file_location("ddp_case", HERE / "ddp_case.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


case_mod = _load_case()


def _torchrun(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' results of ``ddp_case.py`` under torchrun, and the single-process reference."""
    out = tmp_path_factory.mktemp("ddp")
    proc = _torchrun([str(HERE / "ddp_case.py"), str(out)], cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return loaded, case_mod.reference()


def test_the_case_separates_per_rank_from_global_denominators():
    case = case_mod.make_case()
    parts = [case_mod.local_case(case, r) for r in range(2)]
    for name in AGGREGATIONS:
        counts = [aggregation_count(name, p["mask"]) for p in parts]
        assert sum(counts) == aggregation_count(name, case["mask"])
    assert [aggregation_count("token-mean", p["mask"]) for p in parts] == [23.0, 90.0]
    assert [aggregation_count("seq-mean-token-mean", p["mask"]) for p in parts] == [8.0, 9.0]
    assert [p["batch"].response_ids.shape[1] for p in parts] == [6, 14]  # each rank pads to its own longest
    # micro-batch accumulation splits every rank's rows, into different numbers of micro-batches
    counts = [len(micro_batches(p["batch"], torch.arange(p["batch"].size), case_mod.MICRO_POSITIONS)) for p in parts]
    assert counts == [2, 5]


@pytest.mark.parametrize("key", [case_mod.key(*v) for v in case_mod.variants()])
def test_ddp_gradients_match_single_process(ranks, key):
    (r0, r1), ref = ranks
    want = ref[key]["grads"]
    assert float(want.abs().max()) > 1e-2  # a real gradient
    assert torch.equal(r0[key]["grads"], r1[key]["grads"])  # DDP left the same gradient on both ranks
    assert float((r0[key]["grads"] - want).abs().max()) <= TOL
    for metric in ("loss/total", "loss/policy", "kl/ref", "policy/entropy", "grad/norm", "loss/value"):
        if metric in ref[key]["logs"]:
            assert r0[key]["logs"][metric] == pytest.approx(ref[key]["logs"][metric], abs=1e-5)


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_fsdp2_gradients_match_single_process(ranks, agg):
    (r0, _), ref = ranks
    for pos in (0, case_mod.MICRO_POSITIONS):
        key = case_mod.key(agg, pos, "separate")
        got = r0["fsdp|" + key]
        assert float((got["grads"] - ref[key]["grads"]).abs().max()) <= TOL
        for metric in ("loss/total", "loss/value", "grad/norm", "grad/value_norm"):
            assert got["logs"][metric] == pytest.approx(ref[key]["logs"][metric], abs=1e-5)


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_per_rank_denominators_do_not_match(ranks, agg):
    """The naive port (each rank normalises by its own count, DDP averages) is caught."""
    (r0, _), ref = ranks
    key = case_mod.key(agg, 0, "none")
    assert float((r0["naive|" + key]["grads"] - ref[key]["grads"]).abs().max()) > 1e-3


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_skipped_zero_advantage_rows_give_the_single_process_step(ranks, agg):
    """Rank 0's rows all have advantage 0: it runs one zero-weight pass so that the all-reduce
    (DDP) and the all-gathers (FSDP) still pair up, and the gradient is the whole batch's."""
    (r0, r1), ref = ranks
    want = ref["skip|" + agg]
    assert float(want["grads"].abs().max()) > 1e-2
    for name in ("skip|", "skip-fsdp|"):
        got = r0[name + agg]
        assert torch.equal(got["grads"], r1[name + agg]["grads"])
        assert float((got["grads"] - want["grads"]).abs().max()) <= TOL
        for metric in ("loss/total", "loss/policy", "policy/entropy", "grad/norm", "update/skipped_rows"):
            assert got["logs"][metric] == pytest.approx(want["logs"][metric], abs=1e-5), (name, metric)
    assert want["logs"]["update/skipped_rows"] == pytest.approx(12 / 18)


def test_global_batch_whitening_equals_single_process(ranks):
    (r0, r1), ref = ranks
    whole = torch.cat([r0["whiten"], r1["whiten"]])
    assert float((whole - ref["whiten"]).abs().max()) <= TOL
    _, mask = case_mod.whitening_case()
    valid = whole[mask]
    assert float(valid.mean()) == pytest.approx(0.0, abs=1e-5) and float(valid.std()) == pytest.approx(1.0, abs=1e-5)
    assert (
        float(r0["whiten"][mask[case_mod.rank_rows(0)]].mean()) < -0.5
    )  # rank 0 alone is not centred: the statistics are global
    stage = torch.cat([r0["whiten_stage"], r1["whiten_stage"]])  # credit.normaliser=batch through the stage
    assert float((stage - ref["whiten_stage"]).abs().max()) <= TOL


def test_metric_rows_are_reduced_over_ranks(ranks):
    (r0, r1), _ = ranks
    assert r0["metrics"] == r1["metrics"]
    x = torch.cat([case_mod.metric_values(0), case_mod.metric_values(1)])
    m = r0["metrics"]
    assert m["x/mean"] == pytest.approx(float(x.mean()), abs=1e-12)
    assert m["x/std"] == pytest.approx(float(x.std()), abs=1e-12)  # pooled sample std
    assert m["x/abs_max"] == pytest.approx(float(x.abs().max()))
    assert (m["resp/mean_len"], m["count"], m["time/iter_s"], m["k"], m["same"], m["label"]) == (
        10.5,
        14,
        2.0,
        3,
        0.5,
        "rank0",
    )


def test_single_process_helpers_are_identities():
    assert not dist.is_initialized()
    assert (ddp.world_size(), ddp.rank(), ddp.is_main()) == (1, 0, True)
    model = torch.nn.Linear(2, 2)
    assert ddp.wrap(model) is model and ddp.unwrap(model) is model
    assert ddp.share([1, 2, 3]) == [1, 2, 3]
    assert ddp.all_reduce_sum([2.0, 3.0]) == [2.0, 3.0] and ddp.all_reduce_max(4.0) == 4.0
    row = {"a/mean": 1.0, "a/std": 2.0}
    assert ddp.reduce_metrics(row, counts={"a": 3}) is row
    with pytest.raises(ValueError, match="unknown data-parallel strategy 'zero'"):
        ddp.wrap(model, strategy="zero")


TRAIN = [
    "train.init=policy",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "train.eval_size=8",
    "train.progress=false",
    "train.iterations=2",
    "train.eval_every=2",
    # the untrained tiny model never stops, so outcome rewards are all 0: a length penalty with
    # reward-to-go credit gives non-zero advantages (batch-whitened over both ranks)
    "shaping.length_coef=0.05",
    "credit.estimator=reinforce",
    "credit.normaliser=batch",
]


def test_torchrun_cli_train(tmp_path):
    run = tmp_path / "run"
    args = ["-m", "creditrl.cli", "train", "--run-dir", str(run)]
    for item in TRAIN:
        args += ["--set", item]
    proc = _torchrun(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("run dir:") == 1  # only rank 0 reports
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # one writer
    last = rows[-1]
    assert last["samples/total"] == 2 * 16 and rows[1]["samples/total"] == 16
    assert last["tokens/total"] == rows[1]["tokens/generated"] + last["tokens/generated"]
    assert rows[1]["tokens/generated"] <= 16 * 16 and rows[1]["tokens/generated"] > 8 * 16  # both ranks' tokens
    for r in rows[1:]:
        assert math.isfinite(r["reward/mean"]) and r["reward/mean"] < 0  # the length penalty
        assert math.isfinite(r["loss/total"]) and r["grad/norm"] > 0
        assert r["adv/mean"] == pytest.approx(0.0, abs=1e-5)  # whitened over both ranks' tokens
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in last
    ckpt = run / "checkpoints" / "iter_000002"
    assert (run / "checkpoints" / "latest").exists() and (ckpt / "trainer_state.json").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["totals"]["samples"] == 32


def test_prompts_per_iter_must_divide_by_world_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    cfg = load_config(overrides=TRAIN)
    with pytest.raises(ConfigError, match=r"rollout.prompts_per_iter=4 is not divisible by the 3 data-parallel ranks"):
        RLTrainer.from_config(cfg, tmp_path / "run")
    assert not dist.is_initialized()  # checked before joining the process group
    argv = ["train", "--run-dir", str(tmp_path / "cli")] + [x for item in TRAIN for x in ("--set", item)]
    assert cli.main(argv) == 2
    assert "creditrl: error: rollout.prompts_per_iter=4 is not divisible" in capsys.readouterr().err


def test_fsdp_learner_trains_like_ddp(tmp_path):
    """``backend.learner=fsdp``: the update trains a sharded copy and every rank gathers it into
    the model that generates and is saved -- two iterations end at the DDP run's weights."""
    from safetensors.torch import load_file

    weights = {}
    rows = {}
    for learner in ("ddp", "fsdp"):
        run = tmp_path / learner
        args = ["-m", "creditrl.cli", "train", "--run-dir", str(run)]
        for item in TRAIN + [f"backend.learner={learner}"]:
            args += ["--set", item]
        proc = _torchrun(args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        weights[learner] = load_file(run / "checkpoints" / "iter_000002" / "model.safetensors")
        rows[learner] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert weights["ddp"].keys() == weights["fsdp"].keys()
    diff = max(float((weights["ddp"][k] - weights["fsdp"][k]).abs().max()) for k in weights["ddp"])
    assert diff < 1e-5, diff  # the FSDP learner runs the plain forward, DDP the shared-prompt one: float rounding
    first = [rows[k][1] for k in ("ddp", "fsdp")]  # the first iteration samples from the same start
    assert first[0]["tokens/generated"] == first[1]["tokens/generated"]
    assert first[0]["reward/mean"] == pytest.approx(first[1]["reward/mean"], abs=1e-9)
    assert first[0]["loss/total"] == pytest.approx(first[1]["loss/total"], rel=1e-5, abs=1e-6)  # about 0 at ratio 1
    # the weights moved: the comparison is not between two untouched copies of the start
    from creditrl.policy.model import load_policy

    start, _ = load_policy("tiny", seed=0)
    moved = max(
        float((weights["ddp"][k] - v).abs().max()) for k, v in start.state_dict().items() if k in weights["ddp"]
    )
    assert moved > 1e-5, moved


def test_an_fsdp_run_is_not_resumed(tmp_path, monkeypatch):
    load_config(overrides=TRAIN + ["backend.learner=fsdp"]).dump(tmp_path / "config.yaml")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="resuming a backend.learner=fsdp run is not supported"):
        RLTrainer.resume(tmp_path)
    assert not dist.is_initialized()
