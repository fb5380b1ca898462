"""Reward functions by import path with TRL's signature: one, several with weights, and a dense
per-step one, each training through `creditrl train`."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.rewards import function_source
from creditrl.tasks import make_task
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN = [
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "train.init=policy",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "train.eval_size=4",
    "train.progress=false",
    "train.threads=1",
    "train.iterations=3",
    "train.checkpoint_every=3",
]


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("trl_rewards", None)


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]


def test_a_trl_signature_function_scores_like_its_own_call() -> None:
    import trl_rewards

    task = make_task("arithmetic", min_ops=1, max_ops=1)
    (p,) = task.sample(1, split="train", seed=0)
    source = function_source("trl_rewards:exact_answer")
    assert source.default_granularity == "sequence" and source.name == "trl_rewards:exact_answer"
    for completion, want in ((p.solution, 1.0), ("1+1=3;#3", 0.0)):
        assert source.fn(task, p, completion, [completion]) == [want]
        assert trl_rewards.exact_answer([p.prompt], [completion], answer=[p.answer]) == [want]
    dense = function_source("trl_rewards:well_formed_steps")
    assert dense.default_granularity == "step"
    assert dense.fn(task, p, "1+2=3;x;", ["1+2=3;", "x;"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "over, by_source",
    [
        (["reward.source=trl_rewards:exact_answer"], []),
        (
            [
                "reward.source=trl_rewards:exact_answer",
                "reward.sources=[trl_rewards:concise]",
                "reward.weights=[1.0, 0.5]",
            ],
            ["trl_rewards:exact_answer", "trl_rewards:concise"],
        ),
        (["reward.source=trl_rewards:well_formed_steps", "credit.estimator=grpo_process"], []),
    ],
    ids=["one", "two-weighted", "dense-steps"],
)
def test_reward_functions_train_for_three_iterations(tmp_path: Path, over: list[str], by_source: list[str]) -> None:
    cfg = load_config(overrides=RUN + over)
    RLTrainer.from_config(cfg, tmp_path / "run").run()
    got = rows(tmp_path / "run")
    assert len(got) == 3
    name = cfg.reward.source
    assert all(r[f"reward/errors/{name}"] == 0 and r[f"reward/timeouts/{name}"] == 0 for r in got)
    if by_source:
        for r in got:
            parts = [r[f"reward/by_source/{n}"] for n in by_source]
            assert r["reward/mean"] == pytest.approx(parts[0] + 0.5 * parts[1], abs=1e-5)
            assert parts[1] > 0  # concise pays something for any completion under 64 characters
    if name.endswith("steps"):  # placed per step (a random policy writes one step: one reward per response)
        assert checked(cfg).reward.granularity == "step"
        assert all(r["reward/placed_per_response"] >= 1 for r in got)


# Reward functions written for TRL's conversational format, used unchanged (named by file path).
CHAT_REWARDS = textwrap.dedent(
    """
    import json, os

    def brevity_if_asked(prompts, completions, completion_ids, **kwargs):
        with open(os.environ["REWARD_CALLS"], "a") as f:
            f.write(json.dumps({"n": len(completions), "train": completion_ids[0] is not None}) + "\\n")
        scores = []
        for prompt, completion in zip(prompts, completions):
            system = prompt[0]["content"] if prompt[0]["role"] == "system" else ""
            text = completion[0]["content"]
            if "brief" not in system or len(text) % 2:
                scores.append(None)  # does not apply
            else:
                scores.append(1.0 - len(text) / 32)
        return scores

    def half(prompts, completions, **kwargs):
        return [0.5 for _ in completions]
    """
)


def test_a_trl_conversational_function_runs_unchanged_once_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from creditrl.rewards.stage import Scorer

    rewards_file = tmp_path / "chat_rewards.py"
    rewards_file.write_text(CHAT_REWARDS)
    monkeypatch.setenv("REWARD_CALLS", str(tmp_path / "calls.jsonl"))
    seen = []
    score = Scorer.__call__

    def spy(self, batch, **kwargs):
        seen.append((batch.extras["completions"], score(self, batch, **kwargs)))
        return seen[-1][1]

    monkeypatch.setattr(Scorer, "__call__", spy)
    name = f"{rewards_file}:brevity_if_asked"
    over = [
        "task.args={min_ops: 1, max_ops: 2, operand_max: 3, system_prompt: Be brief.}",
        f"reward.source={name}",
        f"reward.sources=[{rewards_file}:half]",
        "reward.weights=[1.0, 2.0]",
    ]
    RLTrainer.from_config(load_config(overrides=RUN + over), tmp_path / "run").run()
    got = rows(tmp_path / "run")
    calls = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluations = sum("eval/accuracy" in r for r in metrics)
    train_calls = [c["n"] for c in calls if c["train"]]
    assert len(train_calls) == 3 and len(calls) == 3 + evaluations  # one call per batch
    nones = 0
    for (completions, scored), n, row in zip(seen, train_calls, got):
        tokens = scored.reward_mask.any(-1)  # the responses with tokens: each got a score from `half`
        assert n == int(tokens.sum()) == 16
        for i, text in enumerate(completions):
            applies = len(text) % 2 == 0
            want = (1.0 - len(text) / 32 if applies else 0.0) + 2.0 * 0.5  # a None term is left out
            assert float(scored.rewards[i].sum()) == pytest.approx(want, abs=1e-6)
        iteration_nones = sum(len(t) % 2 for t in completions)
        assert row[f"reward/none/{name}"] == iteration_nones and row[f"reward/none/{rewards_file}:half"] == 0
        nones += iteration_nones
    assert nones > 0  # the random policy wrote completions of odd length: None was exercised


def test_bad_function_sources_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"^reward.source: cannot import module 'no_such_module'"):
        checked(load_config(overrides=RUN + ["reward.source=no_such_module:f"]))
    with pytest.raises(ConfigError, match=r"reward.weights: 3 weights for 2 sources"):
        load_config(overrides=RUN + ["reward.sources=[outcome]", "reward.weights=[1, 2, 3]"])


def test_a_dense_function_places_one_reward_per_step(scored_by) -> None:
    from creditrl.policy.model import build_tiny
    from creditrl.rewards.stage import Scorer, ScoreSettings

    _, tok = build_tiny(0)
    cfg = checked(load_config(overrides=RUN + ["reward.source=trl_rewards:well_formed_steps"]))
    task = make_task(cfg.task.name, **cfg.task.args)
    (p,) = task.sample(1, split="train", seed=0)
    completion = "1+2=3;oops;#3"  # a well-formed step, a malformed one, the answer
    scored = scored_by(None, [p], [completion], scorer=Scorer(ScoreSettings.of(cfg), task, tok), tokenizer=tok)
    placed = scored.rewards[0][scored.reward_mask[0]].tolist()
    assert placed == [1.0, 0.0, 0.0]  # "1+2=3;" and "oops;" and the final "#3" span


# ----------------------------------------------------------------------------- reward models by path

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 sequence-classification model (one label) saved with its own tokenizer,
    which has a chat template (the policy's has none)."""
    import torch
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from creditrl.policy.model import build_tiny

    _, tok = build_tiny(0)
    tok.chat_template = TEMPLATE
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        num_labels=1,
        **ids,
    )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # scores well apart from 0
    out = tmp_path_factory.mktemp("rm") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def direct_scores(path: Path, texts: list[str]) -> list[float]:
    """The saved model's first logit on each text alone: one unpadded forward pass per text."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return [float(model(**tok(t, add_special_tokens=False, return_tensors="pt")).logits[0, 0]) for t in texts]


def test_a_reward_model_scores_each_completion_as_a_direct_forward_pass(reward_model_dir: Path) -> None:
    from creditrl.rewards import make_source, score_batch
    from creditrl.rewards.reward_model import RM_BATCH_ROWS

    task = make_task("arithmetic", min_ops=1, max_ops=2, system_prompt="Be brief.")
    problems = task.sample(RM_BATCH_ROWS + 4, split="train", seed=0)  # two forward passes, the rows padded
    completions = [p.solution[: 3 + i % 7] for i, p in enumerate(problems)]
    source = make_source(f"rm:{reward_model_dir}", {"device": "cpu"})
    assert source.default_granularity == "sequence" and source.batch_fn is not None
    res = score_batch(source, task, problems, completions, [[c] for c in completions])
    texts = [
        f"<system>Be brief.|<user>{p.prompt}|<assistant>{c}|" for p, c in zip(problems, completions)
    ]  # the reward model's own chat template, the system turn included
    want = direct_scores(reward_model_dir, texts)
    assert [s[0] for s in res.scores] == pytest.approx(want, abs=1e-5)
    assert max(want) - min(want) > 1e-3  # the scores differ: the texts reached the model
    plain = make_task("arithmetic", min_ops=1, max_ops=2).sample(2, split="train", seed=0)  # standard data
    res = score_batch(source, task, plain, ["1+1=2", "#3"], [["1+1=2"], ["#3"]])
    want = direct_scores(reward_model_dir, [plain[0].prompt + "1+1=2", plain[1].prompt + "#3"])
    assert [s[0] for s in res.scores] == pytest.approx(want, abs=1e-5)


def test_a_reward_model_path_that_is_not_one_is_a_one_line_error(tmp_path: Path) -> None:
    from creditrl.policy.model import build_tiny

    with pytest.raises(ConfigError, match=r"^reward.source: reward source 'rm:/no/such/dir': '/no/such/dir' is not a"):
        checked(load_config(overrides=RUN + ["reward.source=rm:/no/such/dir"]))
    with pytest.raises(ConfigError, match=rf"^reward.source: '{tmp_path}' is a directory; name a reward model by path"):
        checked(load_config(overrides=RUN + [f"reward.source={tmp_path}"]))  # as TRL, OpenRLHF and verl take it
    model, tok = build_tiny(0)
    model.save_pretrained(tmp_path / "lm")
    with pytest.raises(ConfigError, match=r"expected a sequence-classification model \(a reward model\), got Llama"):
        checked(load_config(overrides=RUN + [f"reward.sources=[rm:{tmp_path / 'lm'}]", "reward.weights=[1, 1]"]))


def test_three_iterations_with_a_reward_model_beside_a_function(
    reward_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trl_rewards

    from creditrl.rewards.stage import Scorer

    seen = []
    score = Scorer.__call__

    def spy(self, batch, **kwargs):
        seen.append((batch.extras["problems"], batch.extras["completions"], score(self, batch, **kwargs)))
        return seen[-1][2]

    monkeypatch.setattr(Scorer, "__call__", spy)
    rm = f"rm:{reward_model_dir}"
    over = [
        "task.args={min_ops: 1, max_ops: 2, operand_max: 3, system_prompt: Be brief.}",
        f"reward.source={rm}",
        "reward.sources=[trl_rewards:concise]",
        "reward.weights=[2.0, 0.5]",
    ]
    RLTrainer.from_config(load_config(overrides=RUN + over), tmp_path / "run").run()
    got = rows(tmp_path / "run")
    assert len(got) == 3 and all(r[f"reward/errors/{rm}"] == 0 for r in got)
    assert len(seen) == 3
    for problems, completions, scored in seen:
        live = [i for i, c in enumerate(completions) if scored.reward_mask[i].any()]
        texts = [f"<system>Be brief.|<user>{problems[i].prompt}|<assistant>{completions[i]}|" for i in live]
        # conversational data: TRL passes each completion as [assistant message], whose len is 1
        concise = trl_rewards.concise(None, [[{"role": "assistant", "content": completions[i]}] for i in live])
        want = [2.0 * s + 0.5 * c for s, c in zip(direct_scores(reward_model_dir, texts), concise)]
        assert scored.rewards[live].sum(-1).tolist() == pytest.approx(want, abs=1e-4)


# ----------------------------------------------------------------------------- step separators, solutions

STEP_REWARDS = textwrap.dedent(
    """
    from creditrl.rewards import reward_function

    SEEN = {}

    @reward_function(granularity="step")
    def step_lengths(prompts, completions, spans, solution, **kwargs):
        SEEN["solution"] = solution
        return [[float(len(s)) for s in row] for row in spans]
    """
)


@pytest.fixture
def step_rewards(tmp_path: Path) -> str:
    (tmp_path / "step_rewards.py").write_text(STEP_REWARDS)
    yield f"{tmp_path / 'step_rewards.py'}:step_lengths"
    sys.modules.pop("step_rewards", None)


def test_reward_step_separator_gives_any_task_its_steps(step_rewards: str, scored_by) -> None:
    from creditrl.policy.model import build_tiny
    from creditrl.rewards.stage import Scorer, ScoreSettings
    from creditrl.train.resolve import run_task

    math = ["task.name=math", "task.args={}", f"reward.source={step_rewards}"]
    with pytest.raises(ConfigError, match=r"^reward.granularity: 'step' needs a step separator, but task 'math'"):
        checked(load_config(overrides=RUN + math))
    cfg = checked(load_config(overrides=RUN + math + ["reward.step_separator=;"]))
    task = run_task(cfg)
    assert cfg.reward.granularity == "step" and task.step_separator == ";" == cfg.task.args["step_separator"]
    _, tok = build_tiny(0)
    (p,) = task.sample(1, split="train", seed=0)
    good, wrong = f"a;bb;\\boxed{{{p.answer}}}", "a;\\boxed{99}"
    scored = scored_by(None, [p, p], [good, wrong], scorer=Scorer(ScoreSettings.of(cfg), task, tok), tokenizer=tok)
    assert scored.rewards[0][scored.reward_mask[0]].tolist() == [2.0, 3.0, float(len(good) - 5)]
    assert scored.rewards[1][scored.reward_mask[1]].tolist() == [2.0, float(len(wrong) - 2)]
    assert scored.step_correct.tolist() == [1.0, 0.0]  # math's step checker: every step takes the outcome
    with pytest.raises(ConfigError, match=r"^task.args: step_separator '\.' differs from reward.step_separator ';'"):
        checked(load_config(overrides=RUN + math + ["task.args={step_separator: .}", "reward.step_separator=;"]))
    arithmetic = run_task(checked(load_config(overrides=RUN + ["reward.step_separator=/"])))
    assert arithmetic.step_separator == "/"  # the task's own ';' replaced


def test_the_users_solution_column_reaches_reward_functions_as_it_is(step_rewards: str, tmp_path: Path) -> None:
    from creditrl.rewards import function_source, score_batch

    data = tmp_path / "data.jsonl"
    row = {"question": "What is 1+1?", "answer": "2", "solution": "One and one make two; \\boxed{2}"}
    data.write_text(json.dumps(row) + "\n")
    task = make_task("math", train_file=str(data), heldout_file=str(data), step_separator=";")
    (p,) = task.sample(1, split="train", seed=0)
    source = function_source(step_rewards)  # imports the file under its own name, step_rewards
    score_batch(source, task, [p], ["x;y"], [["x;", "y"]], granularity="step")
    assert sys.modules["step_rewards"].SEEN["solution"] == [row["solution"]]


def test_the_evaluation_reward_leaves_none_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from creditrl.policy.model import build_tiny
    from creditrl.rewards.stage import Scorer, ScoreSettings

    (tmp_path / "eval_rewards.py").write_text(
        "def some(prompts, completions, **kwargs):\n    return [1.0, None, 0.5][: len(completions)]\n"
    )
    cfg = checked(load_config(overrides=RUN + [f"reward.source={tmp_path / 'eval_rewards.py'}:some"]))
    task = make_task(cfg.task.name, **cfg.task.args)
    scorer = Scorer(ScoreSettings.of(cfg), task, build_tiny(0)[1])
    try:
        problems = task.sample(3, split="heldout", seed=0)
        assert scorer.eval_reward(problems, ["a", "b", "c"]) == pytest.approx(0.75)  # (1.0 + 0.5) / 2
    finally:
        scorer.close()


def test_creditrl_train_finds_a_module_beside_its_config(tmp_path: Path) -> None:
    import os
    import subprocess

    folder, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "my_rewards.py").write_text("def short(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    (folder / "config.yaml").write_text("reward:\n  source: my_rewards:short\n")
    sets = [a for s in RUN + ["train.iterations=1", "train.checkpoint_every=1"] for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}

    def train(config: Path, run: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "creditrl.cli", "train", str(config), *sets, "--run-dir", run]
        return subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)

    done = train(folder / "config.yaml", "run")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["reward/mean"] for r in rows(elsewhere / "run")] == [1.0]
    (elsewhere / "lost.yaml").write_text("reward:\n  source: not_beside_me:short\n")
    failed = train(elsewhere / "lost.yaml", "run2")
    lines = [x for x in failed.stderr.splitlines() if x.strip()]
    assert failed.returncode == 2 and len(lines) == 1 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    assert lines[0].startswith("creditrl: error: reward.source: cannot import module 'not_beside_me'")
    assert lines[0].endswith("name a file as path/to/not_beside_me.py:short")
