"""The Ray backend: rollout workers that sample exactly what the in-process engine samples,
weight broadcast, replacement of dead workers, scoring workers, and a whole run against the
one-process run. Ray is started once for the module (2 CPUs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import ray
import torch

from creditrl.config import ConfigError, load_config
from creditrl.distributed.ray_backend import RayEngine, engine_kind, policy_weights
from creditrl.distributed.ray_score import ScorePool, pool_info
from creditrl.distributed.workers import import_ray, split_rows
from creditrl.policy.engines import SamplingParams, make_engine
from creditrl.policy.model import apply_lora, build_tiny, sharpen
from creditrl.rewards.sources import make_source, score_batch
from creditrl.rewards.stage import Scorer, ScoreSettings
from creditrl.tasks import make_task
from creditrl.tasks.bounded import UserFunctionError
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

# A worker's chunk is bit-identical to the in-process engine run on the same rows
# (test_the_difference_is_the_chunking_alone); against the whole batch its log-probs differ by
# float rounding, because MKL's sgemm uses another kernel for a product of 1-3 rows than for 4
# or more (row results are otherwise independent of the row count), and a chunk reaches few live
# rows at other steps than the batch. Measured on this CPU (2 chunks, 64 rows x 24 tokens, 10
# seeds, both engines): at most 1.9e-5, and no sampled token changed in 5516 draws.
LOGP_TOL = 5e-5


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def peaked_tiny(weight_seed: int, eos_gain: float = 3.0):
    """The default tiny preset (what the workers build from ``tiny``) with peaked, context-
    dependent next-token distributions and eos likely enough that some samples finish."""
    model, tok = build_tiny(0)
    sharpen(model, weight_seed)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= eos_gain  # tied: also the eos embedding
    return model, tok


@pytest.fixture(scope="module")
def tiny():
    return peaked_tiny(1)


class Engines:
    """One RayEngine (2 rollout workers of 1 CPU each) at a time: Ray has 2 CPUs."""

    def __init__(self, model, tok) -> None:
        self.model, self.tok, self.kind, self.engine = model, tok, None, None

    def __call__(self, kind: str) -> RayEngine:
        if kind != self.kind:
            self.close()
            cfg = load_config(None, ["backend.name=ray", "backend.rollout_workers=2", f"policy.engine={kind}"])
            self.engine = RayEngine(cfg, "tiny", self.model, eos_id=self.tok.eos_token_id, pad_id=self.tok.pad_token_id)
            self.engine.wait_ready(timeout_s=300)
            self.kind = kind
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine, self.kind = None, None


@pytest.fixture(scope="module")
def engines(tiny):
    holder = Engines(*tiny)
    yield holder
    holder.close()


def prompts_of(tok) -> list[list[int]]:
    texts = ["1+2=", "12*3+4=", "7-"]
    return [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def assert_same_generation(a, b) -> float:
    assert b.tokens == a.tokens
    assert b.finished == a.finished
    assert b.prompt_index == a.prompt_index
    assert b.prompt_ids == a.prompt_ids
    diff = max((abs(x - y) for ra, rb in zip(a.logprobs, b.logprobs) for x, y in zip(ra, rb, strict=True)), default=0.0)
    assert diff <= LOGP_TOL
    return diff


def test_split_rows_is_contiguous_and_balanced() -> None:
    assert split_rows(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_rows(1, 2) == [(0, 1)]  # no empty chunk is sent
    for total in range(1, 30):
        for parts in range(1, 6):
            chunks = split_rows(total, parts)
            assert [i for a, b in chunks for i in range(a, b)] == list(range(total))
            sizes = [b - a for a, b in chunks]
            assert max(sizes) - min(sizes) <= 1 and len(chunks) == min(total, parts)


@pytest.mark.parametrize("kind", ["hf", "static"])  # hf first: the later tests reuse the static workers
def test_ray_engine_samples_what_the_in_process_engine_samples(kind: str, tiny, engines) -> None:
    model, tok = tiny
    engine = engines(kind)
    engine.sync(model)
    local = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind=kind)
    assert engine.kind == kind == ("static" if type(local).__name__ == "StaticEngine" else "hf")
    prompts, dot = prompts_of(tok), tok.convert_tokens_to_ids(".")
    seen = {"eos": 0, "stop": 0, "budget": 0}
    for temperature in (0.0, 1.0):
        for stop_ids in ((), (dot,)):
            params = SamplingParams(max_new_tokens=20, temperature=temperature, stop_ids=stop_ids)
            for budgets in (None, [5, 20, 11]):
                g_local, g_ray = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
                a = local.generate(prompts, 3, params, generator=g_local, budgets=budgets)
                b = engine.generate(prompts, 3, params, generator=g_ray, budgets=budgets)
                assert_same_generation(a, b)
                assert torch.equal(g_ray.get_state(), g_local.get_state())  # the driver advanced like the engine
                limits = [min(20, budgets[i]) if budgets else 20 for i in a.prompt_index]
                seen["eos"] += sum(a.finished)
                seen["stop"] += sum(1 for t in a.tokens if t[-1] == dot and dot in stop_ids)
                seen["budget"] += sum(1 for t, lim in zip(a.tokens, limits) if len(t) == lim < 20)
    assert all(v > 0 for v in seen.values()), seen  # every way a sample ends was exercised


def test_the_difference_is_the_chunking_alone(tiny, engines) -> None:
    """A worker's log-probs are bit-identical to the in-process engine run on the same chunk
    (same draw rows); only the whole-batch forward differs, by float rounding."""
    model, tok = tiny
    engine = engines("static")
    engine.sync(model)
    local = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="static")
    params = SamplingParams(max_new_tokens=20, temperature=1.0)
    prompts, budgets = prompts_of(tok), [5, 20, 11]
    out = engine.generate(prompts, 3, params, generator=torch.Generator().manual_seed(4), budgets=budgets)
    whole = local.generate(prompts, 3, params, generator=torch.Generator().manual_seed(4), budgets=budgets)
    requests = [p for p in prompts for _ in range(3)]
    limits = [b for b in budgets for _ in range(3)]
    for a, b in split_rows(9, 2):
        chunk = local.generate(
            requests[a:b], 1, params, generator=torch.Generator().manual_seed(4), budgets=limits[a:b], draw_rows=(a, 9)
        )
        assert chunk.tokens == out.tokens[a:b] == whole.tokens[a:b]
        assert chunk.logprobs == out.logprobs[a:b]  # exactly
    diff = max(abs(x - y) for ra, rb in zip(whole.logprobs, out.logprobs) for x, y in zip(ra, rb))
    assert diff <= LOGP_TOL


def test_a_token_differs_only_where_a_draw_sits_on_a_cdf_boundary(tiny) -> None:
    """The one way the sampled tokens can differ: a uniform draw within float rounding of the
    boundary between two tokens' CDF intervals. With this seed, on this CPU, row 5 draws
    u = 0.6914733 at step 1, 4e-7 below the boundary 0.6914736 between tokens 24 and 25: the
    chunk (rows 3-5) samples 24, the whole batch 25. Every other row is identical."""
    model, tok = tiny
    local = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="static")
    params = SamplingParams(max_new_tokens=12)
    requests = [p for p in prompts_of(tok) for _ in range(2)]
    whole = local.generate(requests, 1, params, generator=torch.Generator().manual_seed(11))
    chunked = [
        t
        for a, b in split_rows(6, 2)
        for t in local.generate(
            requests[a:b], 1, params, generator=torch.Generator().manual_seed(11), draw_rows=(a, 6)
        ).tokens
    ]
    for row, (x, y) in enumerate(zip(whole.tokens, chunked)):
        if x == y:
            continue
        step = next(i for i, (p, q) in enumerate(zip(x, y)) if p != q)
        g = torch.Generator().manual_seed(11)
        u = [torch.rand(6, 1, generator=g, dtype=torch.float64)[row, 0].item() for _ in range(step + 1)][-1]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([requests[row] + x[:step]])).logits[0, -1].float()
        cdf = torch.softmax(logits, -1).double().cumsum(-1)
        boundary = cdf[min(x[step], y[step])].item()  # the upper end of the lower token's interval
        assert abs(u * cdf[-1].item() - boundary) < 1e-5, (row, step, u, boundary)


def test_without_a_generator_the_default_generator_advances_as_in_process(tiny, engines) -> None:
    model, tok = tiny
    engine = engines("static")
    engine.sync(model)
    local = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="static")
    params = SamplingParams(max_new_tokens=12)
    torch.manual_seed(12)
    a = local.generate(prompts_of(tok), 2, params)
    after_local = torch.get_rng_state()
    torch.manual_seed(12)
    b = engine.generate(prompts_of(tok), 2, params)
    assert_same_generation(a, b)
    assert torch.equal(torch.get_rng_state(), after_local)


def test_sync_broadcasts_new_weights_with_a_version(tiny, engines) -> None:
    model, tok = tiny
    other, _ = peaked_tiny(2)
    engine = engines("static")
    params = SamplingParams(max_new_tokens=16)
    version = engine.sync(other)
    assert [i["version"] for i in pool_info(engine.pool)] == [version, version]
    got = engine.generate(prompts_of(tok), 2, params, generator=torch.Generator().manual_seed(5))
    want = make_engine(other, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="static").generate(
        prompts_of(tok), 2, params, generator=torch.Generator().manual_seed(5)
    )
    old = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="static").generate(
        prompts_of(tok), 2, params, generator=torch.Generator().manual_seed(5)
    )
    assert_same_generation(want, got)
    assert got.tokens != old.tokens
    assert engine.sync(model) == version + 1
    engine.model = other  # a reloaded policy (resume): sent before the next generate
    engine.generate(prompts_of(tok), 1, params, generator=torch.Generator().manual_seed(5))
    assert engine.version == version + 2 and {i["version"] for i in pool_info(engine.pool)} == {version + 2}
    engine.sync(model)


def test_a_dead_worker_is_replaced_and_its_chunk_reissued(tiny, engines) -> None:
    model, tok = tiny
    engine = engines("static")
    engine.sync(model)
    engine.stats()
    params = SamplingParams(max_new_tokens=16)
    local = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="static")
    g_local = torch.Generator().manual_seed(6)
    want = local.generate(prompts_of(tok), 4, params, generator=g_local)
    pids = [i["pid"] for i in pool_info(engine.pool)]
    # dies inside its next generate call
    ray.get(engine.pool.actors[0].crash_on_call.remote(1))
    g = torch.Generator().manual_seed(6)
    assert_same_generation(want, engine.generate(prompts_of(tok), 4, params, generator=g))
    assert torch.equal(g.get_state(), g_local.get_state())  # the re-issued chunk did not draw twice
    infos = pool_info(engine.pool)
    assert infos[0]["pid"] != pids[0] and infos[1]["pid"] == pids[1]
    assert infos[0]["version"] == engine.version  # the replacement loaded the current weights
    # killed between calls
    ray.kill(engine.pool.actors[1])
    assert_same_generation(
        want, engine.generate(prompts_of(tok), 4, params, generator=torch.Generator().manual_seed(6))
    )
    assert engine.stats()["backend/restarts"] == 2
    assert engine.pool.slot_restarts == [1, 1]
    # no replacement left for worker 0: the error names it
    engine.pool.max_restarts = 1
    ray.get(engine.pool.actors[0].crash_on_call.remote(1))
    with pytest.raises(
        RuntimeError, match=r"rollout worker 0 died and backend.max_restarts=1 replacements are used up"
    ):
        engine.generate(prompts_of(tok), 4, params, generator=torch.Generator().manual_seed(6))


def test_lora_policy_is_sent_as_merged_weights() -> None:
    base, tok = peaked_tiny(3)
    lora = apply_lora(base, r=4, alpha=8, dropout=0.0, targets="q_proj,v_proj")
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    keys = set(lora.state_dict())
    weights = policy_weights(lora)
    assert set(lora.state_dict()) == keys  # the driver's LoRA model is untouched
    plain, _ = build_tiny(0)
    plain.load_state_dict(weights)
    ids = torch.tensor([prompts_of(tok)[1]])
    want, got = lora.eval()(input_ids=ids).logits, plain.eval()(input_ids=ids).logits
    assert (want - got).abs().max() < 1e-4
    assert (want - peaked_tiny(3)[0](input_ids=ids).logits).abs().max() > 1e-2  # the adapters matter
    assert engine_kind(lora, "auto") == "hf"  # a LoRA policy runs the HF engine in-process: the workers too


def test_missing_ray_gives_the_install_hint_and_the_default_backend_never_imports_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: import ray -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'creditrl\[ray\]'"):
        import_ray()
    small = [
        "train.init=policy",
        "train.progress=false",
        "train.eval_size=2",
        "train.iterations=1",
        "rollout.prompts_per_iter=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
    ]
    with pytest.raises(ConfigError, match=r"backend.name=ray needs the 'ray' package"):
        RLTrainer.from_config(load_config(None, small + ["backend.name=ray"]), tmp_path / "ray")
    history = RLTrainer.from_config(load_config(None, small), tmp_path / "local").run().history  # never imports ray
    assert history[-1]["samples/total"] == 4 and "backend/restarts" not in history[-1]


# ----------------------------------------------------------------------------- scoring workers


@pytest.fixture(scope="module")
def score_pool():
    cfg = checked(load_config(None, ["backend.name=ray", "backend.score_workers=2", "reward.source=oracle_steps"]))
    pool = ScorePool(ray, cfg)
    yield pool
    pool.pool.shutdown()


@pytest.mark.parametrize("source", ["outcome", "oracle_steps"])
def test_scoring_workers_score_like_the_driver(source: str, score_pool, scored_by) -> None:
    _, tok = build_tiny(0)
    cfg = checked(load_config(None, [f"reward.source={source}"]))
    task = make_task(cfg.task.name, **cfg.task.args)
    problems = task.sample(5, split="train", seed=2)
    completions = []
    for p in problems:  # right; a wrong first step and a wrong answer
        steps = p.solution.split(";")
        completions += [p.solution, ";".join([steps[0] + "1"] + steps[1:-1]) + f";#{int(p.answer) + 1}"]
    problems = [p for p in problems for _ in range(2)]
    here = scored_by(
        None, problems, completions, scorer=Scorer(ScoreSettings.of(cfg), task, tok), tokenizer=tok, group_size=2
    )
    remote_scorer = Scorer(ScoreSettings.of(cfg), task, tok)
    score_pool.attach(remote_scorer)
    calls = [i["calls"] for i in pool_info(score_pool.pool)]
    there = scored_by(None, problems, completions, scorer=remote_scorer, tokenizer=tok, group_size=2)
    assert [i["calls"] for i in pool_info(score_pool.pool)] == [c + 1 for c in calls]  # both workers scored
    for name in ("rewards", "reward_mask", "step_ends", "outcome", "step_correct", "keep"):
        assert torch.equal(getattr(here, name), getattr(there, name)), name
    assert (here.errors, here.filtered) == (there.errors, there.filtered)
    assert here.outcome.tolist() == [1.0, 0.0] * 5  # both verdicts occur
    if source == "oracle_steps":
        assert here.rewards.sum() > 0 and (here.reward_mask & (here.rewards == 0)).any()  # right and wrong steps


def test_scoring_workers_keep_the_error_policy_and_counts(score_pool) -> None:
    task = make_task("arithmetic")
    source = make_source("unit_tests")  # the arithmetic task has no unit tests: every scored row fails
    problems = task.sample(6, split="train", seed=3)
    completions = ["1"] * 6
    spans = [[], [], [], ["1"], [], ["1"]]  # rows without spans are not scored: the first failure is row 3
    for on_error in ("zero", "skip"):
        here = score_batch(source, task, problems, completions, spans, on_error=on_error)
        there = score_pool.score(source, task, problems, completions, spans, on_error=on_error)
        assert there == here
        assert here.errors == 2 and "failed on response 3" in here.first_error
    with pytest.raises(UserFunctionError) as local_err:
        score_batch(source, task, problems, completions, spans, on_error="raise")
    with pytest.raises(UserFunctionError) as remote_err:
        score_pool.score(source, task, problems, completions, spans, on_error="raise")
    assert str(remote_err.value) == str(local_err.value)
    assert "reward source 'unit_tests' failed on response 3" in str(local_err.value)


def test_a_dead_scoring_worker_is_replaced(score_pool) -> None:
    task = make_task("arithmetic")
    source = make_source("oracle_steps")
    problems = task.sample(4, split="train", seed=4)
    completions = [p.solution for p in problems]
    spans = [c.split(";") for c in completions]
    spans = [[s + ";" for s in row[:-1]] + row[-1:] for row in spans]
    want = score_batch(source, task, problems, completions, spans, granularity="step")
    score_pool.pool.pop_restarts()
    ray.get(score_pool.pool.actors[1].crash_on_call.remote(1))
    assert score_pool.score(source, task, problems, completions, spans, granularity="step") == want
    assert score_pool.pool.pop_restarts() == 1


# ----------------------------------------------------------------------------- whole runs

RUN = [
    "train.init=policy",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=24",
    "train.eval_size=8",
    "train.eval_every=5",
    "train.iterations=5",
    "train.progress=false",
    "train.threads=1",
    # The untrained tiny model never solves a problem, so with the outcome reward alone every
    # advantage is 0 and the weights never change. A length penalty gives a learning signal, and
    # MC values (VinePPO) send value continuations through the engine too.
    "shaping.length_coef=0.05",
    "shaping.length_budget=8",
    "value.source=mc",
    "value.mc_samples=2",
    "credit.estimator=gae",
]
RAY = ["backend.name=ray", "backend.rollout_workers=2", "backend.worker_threads=1"]
# Derived from the policy's float forward passes (log-probs, gradients): they see the workers'
# float rounding of the rollout log-probs (<= 1e-5 absolute, see LOGP_TOL) through the PPO ratio.
FORWARD_FLOATS = ("loss/", "grad/", "policy/entropy", "policy/approx_kl", "policy/clipfrac", "kl/")
RAY_ONLY = {"backend/restarts", "time/sync_s"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, engines) -> dict[str, list[dict]]:
    engines.close()  # free the CPUs the engine tests' workers reserve
    root = tmp_path_factory.mktemp("runs")
    out = {
        "local": RLTrainer.from_config(load_config(None, RUN), root / "local").run().history,
        "ray": RLTrainer.from_config(load_config(None, RUN + RAY), root / "ray").run().history,
    }
    # a disturbed run: rollout worker 0 dies in its 3rd generate call (iteration 2's rollout;
    # each iteration calls generate twice: rollout, MC continuations); scoring on a worker too
    trainer = RLTrainer.from_config(load_config(None, RUN + RAY + ["backend.score_workers=1"]), root / "killed")
    ray.get(trainer.parts.engine.pool.actors[0].crash_on_call.remote(3))
    assert trainer.parts.scorer.primary.score_fn == trainer.parts.engine.scoring.score  # rewards scored on the worker
    out["killed"] = trainer.run().history
    assert not trainer.parts.engine.pool.actors  # run() shut the workers down
    for name in out:  # the rows are what metrics.jsonl holds
        assert [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines()] == out[name]
    return out


def test_ray_run_matches_the_one_process_run(runs) -> None:
    local, far = runs["local"], runs["ray"]
    assert [r["iteration"] for r in far] == [r["iteration"] for r in local] == [0, 1, 2, 3, 4, 5]
    assert far[-1]["samples/total"] == 80
    assert far[1]["policy/updated"] == 1.0 and far[1]["grad/norm"] > 0  # the weights do move
    for a, b in zip(local, far):
        assert set(b) - set(a) == (RAY_ONLY if a["iteration"] else set())
        for key in a:
            if key.startswith("time/"):
                continue
            if key.startswith(FORWARD_FLOATS):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["iteration"], key)
            else:  # samples, tokens, rewards, accuracy, MC values, advantages, evaluation: exactly
                assert b[key] == a[key], (a["iteration"], key)


def test_killing_workers_mid_run_loses_no_samples(runs) -> None:
    calm, killed = runs["ray"], runs["killed"]
    assert [r.get("backend/restarts") for r in killed] == [None, 0, 1, 0, 0, 0]
    assert [r.get("backend/restarts") for r in calm] == [None, 0, 0, 0, 0, 0]
    for a, b in zip(calm, killed):
        assert (b["samples/total"], b["tokens/total"]) == (a["samples/total"], a["tokens/total"])
        for key in a:
            if not key.startswith("time/") and key != "backend/restarts":
                assert b[key] == a[key], (a["iteration"], key)  # the same workers' chunks: bit for bit
