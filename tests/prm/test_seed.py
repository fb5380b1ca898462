"""One PRM per RL seed (``prm.seed=run``) and a PRM whose backbone trains (``prm.train_backbone``),
issue 59 item 2: the seed reaches the labelled samples, the head and the cache key, and the
default's key is the one it had before the option existed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.policy.model import TinyPreset, build_tiny, load_policy
from creditrl.prm.cache import label_policy_samples, prm_key
from creditrl.prm.data import StepwiseExample
from creditrl.prm.model import ProcessRewardModel
from creditrl.prm.train import train_prm, train_prm_from_examples
from creditrl.train.rl import RLTrainer

# keys computed on the code before prm.seed took `run` (commit f436bea), init "x": they must not move
DEFAULT_KEY = "7ab7b45974defaf2"
SEED_1_KEY = "b190de945eb659f0"
TRAIN_BACKBONE_KEY = "c6d85640346c3222"

SMALL = TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=32)
TOY = [
    "rollout.max_new_tokens=8",
    "train.progress=false",
    "train.eval_size=2",
    "prm.problems=4",
    "prm.samples=2",
    "prm.steps=2",
    "prm.batch_size=2",
]


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An untrained tiny policy saved as a checkpoint: the start a PRM is trained from."""
    path = tmp_path_factory.mktemp("start")
    model, tok = load_policy("tiny", seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def digit_examples(n: int, seed: int) -> list[StepwiseExample]:
    """1-3 steps of 2 random digits and ';'; a step is wrong iff it holds a '7'."""
    rng = random.Random(seed)
    steps = [[f"{rng.randint(10, 99)};" for _ in range(rng.randint(1, 3))] for _ in range(n)]
    return [StepwiseExample("q=", s, [0.0 if "7" in x else 1.0 for x in s]) for s in steps]


def test_existing_keys_are_unchanged_and_run_is_the_numbered_seed() -> None:
    assert prm_key(load_config(), "x") == DEFAULT_KEY
    assert prm_key(load_config(overrides=["train.seed=1"]), "x") == DEFAULT_KEY  # a fixed seed: shared
    assert prm_key(load_config(overrides=["prm.seed=1"]), "x") == SEED_1_KEY
    assert prm_key(load_config(overrides=["prm.train_backbone=true"]), "x") == TRAIN_BACKBONE_KEY
    # `run` at train.seed s is the PRM of prm.seed=s
    assert prm_key(load_config(overrides=["prm.seed=run"]), "x") == DEFAULT_KEY
    assert prm_key(load_config(overrides=["prm.seed=run", "train.seed=1"]), "x") == SEED_1_KEY
    assert load_config(overrides=["prm.seed=run", "train.seed=7"]).prm_seed == 7
    assert load_config(overrides=["prm.seed=3", "train.seed=7"]).prm_seed == 3


def test_prm_seed_rejects_other_words() -> None:
    for bad in ("runs", "1.5", "true"):
        with pytest.raises(ValueError, match=r"^prm.seed: expected an integer or 'run', got "):
            load_config(overrides=[f"prm.seed={bad}"])


@pytest.fixture(scope="module")
def stepping() -> tuple:
    """The tiny policy with its ';' logit raised by 3: untrained, it writes a step separator every
    few characters, so its solutions have several steps (and several labels)."""
    model, tok = load_policy("tiny", seed=0)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight = model.lm_head.weight
        head.bias.zero_()
        head.bias[tok.convert_tokens_to_ids(";")] = 3.0
    model.lm_head = head
    return model.eval(), tok


def _labelled(stepping: tuple, *over: str) -> list[tuple[str, list]]:
    with torch.no_grad():
        examples, _ = label_policy_samples(load_config(overrides=[*TOY, "rollout.max_new_tokens=16", *over]), *stepping)
    return [(ex.meta["completion"], ex.labels) for ex in examples]


@pytest.mark.parametrize("labeler", ["oracle", "outcome_heuristic"])
def test_run_seed_samples_and_labels_with_the_run_seed(stepping: tuple, labeler: str) -> None:
    run0, run1 = (_labelled(stepping, f"prm.labeler={labeler}", "prm.seed=run", f"train.seed={s}") for s in (0, 1))
    assert run1 == _labelled(stepping, f"prm.labeler={labeler}", "prm.seed=1")  # the numbered seed's draws
    assert run0 == _labelled(stepping, f"prm.labeler={labeler}", "train.seed=1")  # the default: seed 0, always
    assert len(run0) == len(run1) == 8
    assert sum(a[0] != b[0] for a, b in zip(run0, run1)) == 8  # other samples ...
    assert sum(a[1] != b[1] for a, b in zip(run0, run1)) >= 4  # ... and other labels
    assert sum(len(x[1]) > 1 for x in run0 + run1) >= 8  # (solutions of several steps)


def test_reward_prm_auto_gives_each_rl_seed_its_own_prm(start: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    over = [
        *TOY,
        f"train.init={start}",
        "reward.source=prm",
        "reward.prm=auto",
        "credit.estimator=grpo_process",
        "rollout.prompts_per_iter=2",
        "rollout.group_size=2",
        "train.iterations=1",
    ]

    def prm_of(*extra: str) -> Path:
        return Path(RLTrainer.from_config(load_config(overrides=[*over, *extra]), tmp_path / "run").cfg.reward.prm)

    seed0, seed1 = prm_of("prm.seed=run", "train.seed=0"), prm_of("prm.seed=run", "train.seed=1")
    assert seed0 != seed1 and seed0.parent == seed1.parent == tmp_path / "cache" / "prm"
    assert prm_of("train.seed=1") == prm_of("train.seed=0") == seed0  # the default: one PRM, seed 0's
    assert seed1.name == prm_key(load_config(overrides=[*over, "prm.seed=1"]), start)
    head0, head1 = (torch.load(p / "heads.pt") for p in (seed0, seed1))
    assert not torch.equal(head0["0.weight"], head1["0.weight"])  # its own head draw and training


def _backbone_change(train_backbone: bool) -> tuple[float, float]:
    """Largest absolute change of the backbone and of the frozen reference after 3 steps."""
    policy, tok = build_tiny(0, SMALL)
    prm = ProcessRewardModel.from_model(policy, likelihood=True)
    before = [p.detach().clone() for p in prm.backbones[0].parameters()]
    ref = [p.detach().clone() for p in prm.reference.parameters()]
    examples = digit_examples(16, 0)
    train_prm(prm, tok, examples, steps=3, batch_size=4, lr=1e-3, progress=False, train_backbone=train_backbone)
    moved = max(float((a - b.detach()).abs().max()) for a, b in zip(before, prm.backbones[0].parameters(), strict=True))
    ref_moved = max(float((a - b.detach()).abs().max()) for a, b in zip(ref, prm.reference.parameters()))
    return moved, ref_moved


def test_train_backbone_moves_the_backbone_and_never_the_reference() -> None:
    assert _backbone_change(False) == (0.0, 0.0)  # bit-identical: only the heads trained
    moved, ref_moved = _backbone_change(True)
    assert moved > 1e-5 and ref_moved == 0.0


@pytest.mark.parametrize("train_backbone", [False, True])
def test_prm_train_backbone_reaches_the_saved_prm(start: str, tmp_path: Path, train_backbone: bool) -> None:
    cfg = load_config(overrides=[*TOY, f"prm.train_backbone={str(train_backbone).lower()}", "prm.steps=3"])
    train_prm_from_examples(cfg, start, digit_examples(16, 1), tmp_path / "prm", False)
    saved = ProcessRewardModel.load(tmp_path / "prm").backbones[0].state_dict()
    policy = load_policy(start)[0].base_model.state_dict()
    same = all(torch.equal(saved[k], policy[k]) for k in saved)
    assert same != train_backbone
