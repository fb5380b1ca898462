"""The implicit PRM (PRIME): its log-ratio against a token-by-token reference, the span sums, the
online update toward the outcome, and a resumed run that continues with the reward model it had."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.policy.model import build_tiny
from creditrl.prm.implicit import ImplicitPRM, _rows, token_log_ratios
from creditrl.rewards.stage import Scorer
from creditrl.tasks import make_task
from creditrl.train.rl import RLTrainer

TASK = make_task("arithmetic", min_ops=1, max_ops=2)


def _saved(tmp_path: Path, seed: int) -> str:
    model, tok = build_tiny(seed=seed)
    model.save_pretrained(tmp_path / f"m{seed}")
    tok.save_pretrained(tmp_path / f"m{seed}")
    return str(tmp_path / f"m{seed}")


def test_log_ratio_matches_a_token_by_token_reference() -> None:
    (model, tok), (reference, _) = build_tiny(seed=1), build_tiny(seed=2)
    problems = TASK.sample(3, split="train", seed=0)
    spans = [["3+4=7;", "#7"], ["1*2=2;#2"], [""]]  # the last response is empty
    rows = _rows(tok, problems, spans)
    ratios, mask = token_log_ratios(model, reference, rows, tok.pad_token_id)
    for i, (prompt, resp, _) in enumerate(rows):
        assert int(mask[i].sum()) == len(resp)
        for t, token in enumerate(resp):
            prefix = torch.tensor([prompt + resp[:t]])
            with torch.no_grad():
                want = (
                    torch.log_softmax(model(input_ids=prefix).logits[0, -1], -1)[token]
                    - torch.log_softmax(reference(input_ids=prefix).logits[0, -1], -1)[token]
                )
            assert float(ratios[i, t]) == pytest.approx(float(want), abs=1e-5), (i, t)
    assert float(ratios[2].abs().sum()) == 0.0


def test_rewards_are_beta_times_each_spans_summed_ratio_and_zero_at_the_start(tmp_path: Path) -> None:
    prm = ImplicitPRM(_saved(tmp_path, 0), beta=0.5, lr=1e-3, steps=1)
    problems = TASK.sample(2, split="train", seed=1)
    spans = [["3+4=7;", "#7"], ["", "1*2=2;#2"]]
    assert prm.rewards(problems, spans) == [[0.0, 0.0], [None, 0.0]]  # pi_rm = pi_ref before any update
    prm.model.load_state_dict(build_tiny(seed=5)[0].state_dict())
    rows = _rows(prm.tokenizer, problems, spans)
    ratios, _ = token_log_ratios(prm.model, prm.reference, rows, prm.tokenizer.pad_token_id)
    got = prm.rewards(problems, spans)
    assert got[0][0] == pytest.approx(0.5 * float(ratios[0, :6].sum()), abs=1e-5)
    assert got[0][1] == pytest.approx(0.5 * float(ratios[0, 6:8].sum()), abs=1e-5)
    assert got[1][0] is None and got[1][1] == pytest.approx(0.5 * float(ratios[1, :8].sum()), abs=1e-5)


def test_online_updates_move_the_implicit_outcome_toward_the_labels(tmp_path: Path) -> None:
    prm = ImplicitPRM(_saved(tmp_path, 0), beta=0.1, lr=3e-3, steps=1)
    problems = TASK.sample(8, split="train", seed=2)
    completions = [p.solution if i % 2 == 0 else p.solution + "9" for i, p in enumerate(problems)]
    outcome = torch.tensor([float(TASK.check_outcome(p, c)) for p, c in zip(problems, completions)])
    assert outcome.tolist() == [1.0, 0.0] * 4
    first = prm.observe(problems, completions, outcome)
    assert first["reward/implicit_loss"] == pytest.approx(0.6931, abs=1e-3)  # log 2: every score is 0
    for _ in range(20):
        last = prm.observe(problems, completions, outcome)
    assert last["reward/implicit_loss"] < 0.5 and last["reward/implicit_accuracy"] == 1.0
    scores = [sum(r) for r in prm.rewards(problems, [[c] for c in completions])]
    assert min(scores[0::2]) > 0 > max(scores[1::2])  # right responses up, wrong ones down


TINY = [
    "train.init=policy",
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
    "train.eval_size=4",
    "train.progress=false",
    "train.threads=1",
    "train.eval_every=2",
    "train.iterations=4",
    "train.checkpoint_every=2",
    "reward.source=outcome",
    "hybrid.dense_source=implicit_prm",
    "reward.implicit_lr=0.01",
    "credit.estimator=rloo",
]


def _rows_of(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_a_resumed_run_continues_with_the_reward_model_it_had(tmp_path: Path, monkeypatch) -> None:
    finished = tmp_path / "full"
    RLTrainer.from_config(load_config(overrides=TINY), finished).run()
    full = _rows_of(finished)
    assert {"reward/implicit_loss", "reward/implicit_accuracy"} <= set(full[1])

    def resumed_from_iteration_2(where: Path) -> list[dict]:
        shutil.copytree(finished, where, symlinks=True)
        (where / ".lock").unlink(missing_ok=True)
        shutil.rmtree(where / "checkpoints" / "iter_000004")
        (where / "checkpoints" / "latest").unlink()
        (where / "checkpoints" / "latest").symlink_to("iter_000002")
        trainer = RLTrainer.resume(where)
        assert trainer.start_iteration == 2
        trainer.run()
        return _rows_of(where)

    again = resumed_from_iteration_2(tmp_path / "resumed")
    for a, b in zip(full, again):
        for key in a:
            if not key.startswith("time/"):
                assert a[key] == pytest.approx(b[key], abs=1e-6), (a["iteration"], key)
    # without its reward model restored the resumed run scores otherwise: the checkpoint carries it
    monkeypatch.setattr(Scorer, "load_state_dict", lambda self, state: None)
    fresh = resumed_from_iteration_2(tmp_path / "fresh")
    assert fresh[3]["reward/implicit_loss"] != pytest.approx(full[3]["reward/implicit_loss"], abs=1e-6)


def test_implicit_prm_refuses_ray_scoring_workers_in_one_line() -> None:
    from creditrl.errors import ConfigError
    from creditrl.train.resolve import check

    cfg = load_config(overrides=[*TINY, "backend.name=ray", "backend.score_workers=2"])
    with pytest.raises(ConfigError, match="hybrid.dense_source: 'implicit_prm' learns during the run"):
        check(cfg, TASK)
