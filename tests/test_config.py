"""Config loading: defaults, YAML + --set overrides, strict keys and types, registry names, dump."""

import hashlib
import json
import typing
from pathlib import Path

import pytest

from creditrl.config import (
    SECTIONS as SCHEMA_SECTIONS,
)
from creditrl.config import (
    Config,
    ConfigError,
    CreditConfig,
    config_hash,
    load_config,
    parse_overrides,
)
from creditrl.tasks import TASKS, register_task
from creditrl.train.resolve import checked

SECTIONS = (
    "policy, task, sft, rollout, reward, shaping, hybrid, value, credit, loss, optim, train, prm, backend, search"
)


def built(overrides=None, path=None) -> Config:
    """Load, then check against the registries as building a run does."""
    return checked(load_config(path, overrides))


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- defaults


def test_defaults_load_and_validate():
    cfg = load_config()
    assert cfg == Config()
    checked(cfg)
    assert cfg.policy.model == "tiny"
    assert cfg.task.name == "arithmetic" and cfg.task.args == {"min_ops": 4, "max_ops": 6}
    assert (cfg.credit.estimator, cfg.credit.normaliser) == ("grpo", "none")
    assert (cfg.reward.source, cfg.reward.on_error) == ("outcome", "raise")
    assert (cfg.loss.aggregation, cfg.loss.kl_estimator, cfg.loss.clip_eps_high) == ("token-mean", "k3", None)
    assert list(SCHEMA_SECTIONS) == SECTIONS.split(", ")


def test_config_is_frozen_task_args_included():
    cfg = load_config()
    with pytest.raises(Exception, match="frozen"):
        cfg.train.iterations = 3
    with pytest.raises(Exception, match="frozen"):
        cfg.train = cfg.train
    with pytest.raises(TypeError):
        cfg.task.args["min_ops"] = 1
    assert Config().task.args["min_ops"] == 4
    again = cfg.updated({"train": {"iterations": 3}})  # a changed copy, validated
    assert (again.train.iterations, cfg.train.iterations) == (3, 100)
    with pytest.raises(ConfigError, match="train.iterations: must be >= 0, got -1"):
        cfg.updated({"train": {"iterations": -1}})


# ----------------------------------------------------------------------------- file + --set


def test_yaml_file_and_overrides(tmp_path):
    path = write(
        tmp_path,
        """
credit:
  estimator: rloo
  gamma: 0.99
optim:
  lr: 0.001
  weight_decay: 0.1
rollout:
  group_size: 4
""",
    )
    cfg = load_config(
        path,
        [
            "optim.lr=0.01",  # beats the file
            "credit.lam=0.95",  # merges into the file's section
            "loss.clip_eps_high=0.28",
            "loss.dual_clip=null",
            "train.progress=false",
            "rollout.temperature=1",  # an int where a float is expected becomes a float
            "task.args={min_ops: 2, max_ops: 3}",
            "policy.model=some/dir=with=equals",  # only the first '=' splits
        ],
    )
    assert cfg.credit == CreditConfig(estimator="rloo", normaliser="none", gamma=0.99, lam=0.95)
    assert cfg.optim.lr == 0.01 and cfg.optim.weight_decay == 0.1
    assert cfg.rollout.group_size == 4 and cfg.rollout.prompts_per_iter == 16
    assert cfg.loss.clip_eps_high == 0.28 and cfg.loss.dual_clip is None
    assert cfg.train.progress is False
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)
    assert cfg.task.args == {"min_ops": 2, "max_ops": 3}
    assert cfg.policy.model == "some/dir=with=equals"


def test_overrides_as_dict():
    cfg = load_config(overrides={"credit": {"estimator": "dr_grpo"}, "train": {"iterations": 3}})
    assert cfg.credit.estimator == "dr_grpo" and cfg.train.iterations == 3


def test_parse_overrides_nests_and_types_values():
    out = parse_overrides(["a.b.c=1", "a.b.d=0.5", "a.e=true", "f=[1, 2]", "g=text", "h=null", "i='007'"])
    assert out == {"a": {"b": {"c": 1, "d": 0.5}, "e": True}, "f": [1, 2], "g": "text", "h": None, "i": "007"}
    with pytest.raises(ConfigError, match="--set expects key=value, got 'credit.estimator'"):
        parse_overrides(["credit.estimator"])


@pytest.mark.parametrize("text, value", [("1e-4", 1e-4), ("3E-5", 3e-5), ("2e3", 2000.0), ("1.0e-4", 1e-4)])
def test_set_accepts_scientific_notation(text, value):
    # parse_overrides' own docstring example; learning rates are written this way
    assert load_config(overrides=[f"optim.lr={text}"]).optim.lr == pytest.approx(value)


def test_yaml_file_accepts_scientific_notation(tmp_path):
    cfg = load_config(write(tmp_path, "optim:\n  lr: 3e-4\nsft:\n  lr: 1e-3\n"))
    assert (cfg.optim.lr, cfg.sft.lr) == (pytest.approx(3e-4), pytest.approx(1e-3))


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "credit: [unclosed\n", "bad.yaml"))
    with pytest.raises(ConfigError, match="expected a mapping of sections at the top level"):
        load_config(write(tmp_path, "- a\n- b\n", "list.yaml"))
    assert load_config(write(tmp_path, "", "empty.yaml")) == Config()


# ----------------------------------------------------------------------------- unknown keys, types


def test_unknown_section_lists_sections():
    with pytest.raises(ConfigError, match=f"unknown key 'critic' in the top level; valid keys: {SECTIONS}"):
        load_config(overrides=["critic.lr=1"])


def test_unknown_key_lists_the_section_keys():
    with pytest.raises(
        ConfigError, match="unknown key 'lambda' in section 'credit'; valid keys: estimator, normaliser, gamma, lam"
    ):
        load_config(overrides=["credit.lambda=0.9"])


def test_unknown_key_in_file(tmp_path):
    with pytest.raises(
        ConfigError,
        match="unknown key 'epochs' in section 'optim'; valid keys: name, lr, beta1, beta2, eps, momentum, "
        "warmup_iterations",
    ):
        load_config(write(tmp_path, "optim:\n  epochs: 2\n"))


@pytest.mark.parametrize(
    "override, message",
    [
        ("credit=3", "credit: expected a mapping of CreditConfig keys, got 3"),
        ("optim.ppo_epochs=1.5", "optim.ppo_epochs: expected an integer, got 1.5"),
        ("train.iterations=true", "train.iterations: expected an integer, got True"),
        ("optim.lr=fast", "optim.lr: expected a number, got 'fast'"),
        ("optim.lr=false", "optim.lr: expected a number, got False"),
        ("train.progress=1", "train.progress: expected true/false, got 1"),
        ("credit.estimator=3", "credit.estimator: expected a string, got 3"),
        ("task.args=[1]", r"task.args: expected a mapping, got \[1\]"),
        ("loss.clip_eps_high=abc", "loss.clip_eps_high: expected a number or null, got 'abc'"),
    ],
)
def test_wrong_types_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


# ----------------------------------------------------------------------------- registry names, ranges


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "credit.estimator=ppo",
            "credit.estimator: unknown value 'ppo'; valid: dr_grpo, gae, grpo, grpo_process, min_form, reinforce, "
            "reinforce_baseline, rloo",
        ),
        ("credit.normaliser=zscore", "credit.normaliser: unknown value 'zscore'; valid: batch, group, none"),
        (
            "reward.source=orm",
            "reward.source: unknown value 'orm'; valid: bleu, chrf, implicit_prm, oracle_steps, outcome, prm, rouge, "
            "step_format, unit_tests; did you mean 'prm'?",
        ),
        ("reward.on_error=ignore", "reward.on_error: unknown value 'ignore'; valid: raise, skip, zero"),
        (
            "loss.aggregation=sum",
            "loss.aggregation: unknown value 'sum'; valid: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean",
        ),
        ("loss.kl_estimator=k4", "loss.kl_estimator: unknown value 'k4'; valid: k1, k2, k3"),
        (
            "task.name=gsm8k",
            "task.name: unknown task 'gsm8k'; valid tasks: arithmetic, chain, code, math, paths, toy_summarise, "
            "toy_translate",
        ),
        (
            "reward.granularity=word",
            "reward.granularity: unknown value 'word'; valid: key_token, segment, sequence, step, token",
        ),
        ("value.source=td", "value.source: unknown value 'td'; valid: critic, dual_critic, mc, none, tree"),
        ("value.model=tied", "value.model: unknown value 'tied'; valid: separate, shared"),
        ("credit.resolution=word", "credit.resolution: unknown value 'word'; valid: auto, step, token"),
        ("hybrid.filter=best", "hybrid.filter: unknown value 'best'; valid: group_accuracy, none, top_q"),
        ("hybrid.schedule=cosine", "hybrid.schedule: unknown value 'cosine'; valid: constant, decay, linear, switch"),
        ("shaping.kl_estimator=k5", "shaping.kl_estimator: unknown value 'k5'; valid: k1, k2, k3"),
        ("optim.name=lion", "optim.name: unknown value 'lion'; valid: adamw, sgd"),
    ],
)
def test_unknown_names_list_valid_ones(override, message):
    with pytest.raises(ConfigError) as info:
        built([override])
    assert str(info.value) == message


def test_task_args_errors_name_the_key():
    with pytest.raises(ConfigError, match="task.args: .*unexpected keyword argument 'bogus'"):
        built(["task.args={bogus: 1}"])
    with pytest.raises(ConfigError, match="task.args: max_ops must be >= min_ops"):
        built(["task.args={min_ops: 5, max_ops: 2}"])
    with pytest.raises(ConfigError, match="sft.task_args: min_ops must be >= 1, got 0"):
        built(["sft.task_args={min_ops: 0}"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=0", "optim.lr: must be > 0, got 0.0"),
        ("rollout.group_size=0", "rollout.group_size: must be > 0, got 0"),
        ("train.iterations=-1", "train.iterations: must be >= 0, got -1"),
        ("rollout.temperature=-0.5", "rollout.temperature: must be >= 0, got -0.5"),
        ("rollout.top_p=1.5", r"rollout.top_p: must lie in \(0, 1\], got 1.5"),
        ("loss.clip_eps=1", r"loss.clip_eps: must lie in \(0, 1\), got 1.0"),
        ("optim.minibatches=1000", "optim.minibatches: more minibatches than responses per iteration"),
        ("credit.lam=1.5", r"credit.lam: must lie in \[0, 1\], got 1.5"),
        ("credit.lam_end=-0.1", r"credit.lam_end: must lie in \[0, 1\], got -0.1"),
        ("hybrid.filter_q=0", r"hybrid.filter_q: must lie in \(0, 1\], got 0.0"),
        ("value.mc_samples=0", "value.mc_samples: must be > 0, got 0"),
        ("shaping.overlong_cache=64", r"shaping.overlong_cache: must be < rollout.max_new_tokens \(64\), got 64"),
        ("reward.segment_tokens=0", "reward.segment_tokens: must be > 0, got 0"),
        ("optim.beta2=1", r"optim.beta2: must lie in \[0, 1\), got 1.0"),
        ("optim.momentum=-0.1", r"optim.momentum: must lie in \[0, 1\), got -0.1"),
        ("optim.eps=0", "optim.eps: must be > 0, got 0.0"),
        ("policy.kernels=cuda", "policy.kernels: unknown value 'cuda'; valid: auto, numba, torch"),
    ],
)
def test_ranges(override, message):
    with pytest.raises(ConfigError, match=message):
        built([override])
    assert built(["train.iterations=0", "rollout.temperature=0"]).train.iterations == 0


def test_min_form_refuses_a_discount():
    with pytest.raises(
        ConfigError, match=r"credit.gamma: min_form credit .* does not discount; set credit.gamma=1.0 \(got 0.9\)"
    ):
        built(["credit.estimator=min_form", "credit.gamma=0.9"])
    assert built(["credit.estimator=min_form"]).credit.estimator == "min_form"


@pytest.fixture
def stepless_task():
    name = "test_config_stepless"

    @register_task(name)
    class Stepless:
        step_separator = None

        def __init__(self, **kwargs):
            pass

    yield name
    del TASKS[name]


def test_step_source_needs_a_task_with_steps(stepless_task):
    assert built(["reward.source=oracle_steps"]).reward.source == "oracle_steps"
    stepless = [f"task.name={stepless_task}", "task.args={}", "sft.task_args={}"]
    with pytest.raises(
        ConfigError, match=f"reward.granularity: 'step' needs a step separator, but task '{stepless_task}' has none"
    ):
        built(stepless + ["reward.source=oracle_steps"])
    # a separator given in the config makes steps (the source's default granularity) available
    assert built(stepless + ["reward.source=oracle_steps", "reward.step_separator=';'"]).reward.step_separator == ";"
    # segments need no separator
    built(stepless + ["reward.source=oracle_steps", "reward.granularity=segment"])


# ----------------------------------------------------------------------------- combinations


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["credit.estimator=gae"],
            "credit.estimator: 'gae' needs values; set value.source to one of critic, dual_critic, mc",
        ),
        (
            ["value.source=critic"],
            "value.source: 'critic' gives values that estimator 'grpo' never reads; use credit.estimator=gae or "
            "value.source=none",
        ),
        (
            ["credit.estimator=gae", "value.source=mc", "credit.resolution=token"],
            "credit.resolution: 'mc' values exist only at step boundaries; use credit.resolution=step \\(or auto\\)",
        ),
        (
            ["reward.granularity=step"],
            "reward.granularity: reward source 'outcome' scores whole sequences only \\(granularities: sequence\\); "
            "it cannot be used at granularity 'step'",
        ),
        (
            ["hybrid.schedule=switch"],
            "hybrid.schedule/calibrate/dense_granularity: these weight a second reward source; set hybrid.dense_source",
        ),
        (["hybrid.calibrate=true"], "hybrid.schedule/calibrate/dense_granularity: these weight a second reward source"),
        (
            ["hybrid.filter_lo=0.9", "hybrid.filter_hi=0.1"],
            "hybrid.filter_lo/filter_hi: need 0 <= lo <= hi <= 1, got \\[0.9, 0.1\\]",
        ),
        (["value.warmup_iterations=3"], "value.warmup_iterations: only a learned critic has a warm-up"),
        (["reward.source=prm"], "reward.prm: source 'prm' needs it set"),
        (["reward.source=prm", "reward.prm=/nonexistent/prm"], "reward.prm: '/nonexistent/prm' is not a directory"),
        (
            ["reward.source=prm", "reward.prm=/tmp", "reward.granularity=token"],
            "reward.granularity: reward source 'prm' scores spans \\(granularities: step\\)",
        ),
        (
            ["credit.estimator=gae", "value.source=critic", "value.model=shared", "value.backbone=tiny"],
            "value.backbone: only a separate critic has a backbone of its own",
        ),
        (
            ["hybrid.dense_source=outcome", "hybrid.dense_granularity=token"],
            "hybrid.dense_granularity: reward source 'outcome' scores whole sequences only",
        ),
    ],
)
def test_combinations_that_make_no_sense_fail_with_the_reason(overrides, message):
    with pytest.raises(ConfigError, match=message):
        built(overrides)


def test_combinations_that_make_sense_load():
    for over in (
        ["credit.estimator=gae", "value.source=critic"],
        ["credit.estimator=gae", "value.source=dual_critic", "value.model=shared"],
        ["credit.estimator=gae", "value.source=mc", "credit.lam=0.0"],
        ["credit.estimator=grpo", "credit.resolution=step"],
        ["reward.source=oracle_steps", "reward.granularity=token", "credit.estimator=rloo"],
        ["reward.source=oracle_steps", "reward.granularity=key_token", "credit.estimator=grpo_process"],
        ["hybrid.dense_source=oracle_steps", "hybrid.schedule=switch", "hybrid.calibrate=true"],
        ["hybrid.filter=top_q", "hybrid.filter_q=0.25"],
        ["shaping.kl_coef=0.1", "shaping.length_coef=0.01", "shaping.length_budget=40", "shaping.overlong_cache=8"],
    ):
        built(over)
    assert built(["credit.estimator=gae", "value.source=mc"]).credit.resolution == "step"
    assert built(["credit.estimator=gae", "value.source=critic"]).credit.resolution == "token"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ----------------------------------------------------------------------------- dump, hash


def test_dump_and_load_round_trip(tmp_path):
    cfg = load_config(
        overrides=[
            "credit.estimator=grpo_process",
            "reward.source=oracle_steps",
            "loss.clip_eps_high=0.28",
            "loss.dual_clip=3.0",
            "optim.lr=0.00003",
            "train.progress=false",
            "task.args={min_ops: 2, max_ops: 5, operators: '+*'}",
        ]
    )
    path = tmp_path / "config.yaml"
    cfg.dump(path)
    again = load_config(path)
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    assert load_config(path).to_dict() == again.to_dict()
    Config().dump(path)
    assert load_config(path) == Config()


def test_config_hash_is_stable():
    a = {"x": 1, "y": [1, 2], "z": {"b": 2.5, "a": None}}
    b = {"z": {"a": None, "b": 2.5}, "y": [1, 2], "x": 1}  # same content, other key order
    h = config_hash(a)
    assert h == config_hash(b)
    assert len(h) == 16 and int(h, 16) >= 0
    assert h == hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()[:16]  # no process-local state
    assert config_hash({"x": 2, "y": [1, 2], "z": {"b": 2.5, "a": None}}) != h
    assert config_hash(Config().to_dict()) == config_hash(load_config().to_dict())
    assert config_hash(Config().to_dict()) != config_hash(load_config(overrides=["optim.lr=0.1"]).to_dict())


def test_task_args_override_merges_key_by_key() -> None:
    cfg = load_config(overrides=["task.args.min_ops=5"])
    assert cfg.task.args == {"min_ops": 5, "max_ops": 6}


def test_backend_section_defaults_and_errors() -> None:
    cfg = built(["backend.name=ray", "backend.rollout_workers=3"])
    assert (cfg.backend.name, cfg.backend.rollout_workers, cfg.backend.score_workers) == ("ray", 3, 0)
    with pytest.raises(ConfigError, match="backend.name: unknown value 'slurm'; valid: local, ray"):
        built(["backend.name=slurm"])
    with pytest.raises(ConfigError, match="backend.score_workers: must be >= 0, got -1"):
        built(["backend.score_workers=-1"])
    assert built([]).backend.learner == "ddp"
    with pytest.raises(ConfigError, match="backend.learner: unknown value 'zero'; valid: ddp, fsdp"):
        built(["backend.learner=zero"])


def test_policy_kernels_numba_runs_float32_only():
    assert built(["policy.kernels=numba"]).policy.kernels == "numba"
    assert built(["policy.kernels=torch", "policy.precision=bf16"]).policy.kernels == "torch"
    for override in ("policy.precision=bf16", "policy.dtype=bfloat16"):
        with pytest.raises(ConfigError, match="policy.kernels: 'numba' runs float32 only"):
            built(["policy.kernels=numba", override])


# ----------------------------------------------------------------------------- the `config` command, did you mean


def test_config_command_prints_the_checked_config(capsys):
    import yaml

    from creditrl.cli import main

    assert main(["config", "--set", "credit.estimator=gae", "--set", "value.source=mc"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["credit"]["resolution"] == "step" and printed["reward"]["granularity"] == "sequence"
    assert main(["config", "--set", "credit.estimater=gae"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'estimator'?" in err and "Traceback" not in err


def test_config_show_prints_yaml_that_train_takes_back_unchanged(capsys, tmp_path):
    from creditrl.cli import main
    from creditrl.train.resolve import checked

    packaged = Path(__file__).resolve().parents[1] / "src/creditrl/configs/arith.yaml"
    assert main(["config", "show", str(packaged), "--set", "credit.estimator=rloo"]) == 0
    shown = tmp_path / "shown.yaml"
    shown.write_text(capsys.readouterr().out)
    again = load_config(shown)  # what `creditrl train shown.yaml` loads
    assert again == checked(load_config(packaged, ["credit.estimator=rloo"])) and checked(again) == again
    assert again.train.init == "sft" and again.credit.estimator == "rloo"
    assert main(["config", "show", "a.yaml", "b.yaml"]) == 2
    assert "one config file, got a.yaml b.yaml" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("credit.estimator=grpo_proces", "grpo_process"),
        ("credit.normaliser=batches", "batch"),
        ("value.source=critc", "critic"),
        ("reward.granularity=tokens", "token"),
        ("optim.weight_decy=0.1", "weight_decay"),
        ("task.name=arithmetc", "arithmetic"),
    ],
)
def test_near_misses_get_a_did_you_mean(override, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'"):
        built([override])


def test_closed_choice_sets_have_one_definition():
    """The owners of closed choice sets read them from the schema (no copies to drift)."""
    from creditrl.config import types as schema
    from creditrl.policy.device import PRECISIONS
    from creditrl.policy.engines import KERNELS
    from creditrl.policy.model import DTYPES
    from creditrl.rewards.sources import ERROR_POLICIES
    from creditrl.tasks.base import SPLITS

    assert set(PRECISIONS) == set(typing.get_args(schema.Precision))
    assert KERNELS == typing.get_args(schema.Kernels) and DTYPES == typing.get_args(schema.Dtype)
    assert ERROR_POLICIES == typing.get_args(schema.OnError) and SPLITS == typing.get_args(schema.Split)
