"""One RL iteration by hand, stage by stage: rollout, score, credit (README, "Python API")."""

import torch

from creditrl.config import load_config
from creditrl.credit import estimate, estimate_at, normalise
from creditrl.policy import SamplingParams, load_policy, make_engine
from creditrl.tasks import make_task
from creditrl.train import stages
from creditrl.train.resolve import checked

# a config: loaded and validated, then checked against the registries with its defaults resolved
cfg = checked(load_config(overrides=["reward.source=oracle_steps", "reward.granularity=token"]))
model, tok = load_policy("tiny")  # or a local save_pretrained directory
task = make_task(cfg.task.name, **cfg.task.args)
engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)  # static or hf, by architecture
gen = torch.Generator().manual_seed(0)
batch = stages.rollout(engine, tok, task.sample(4, split="train", seed=0), 8, SamplingParams(max_new_tokens=64), gen)
scorer = stages.Scorer(stages.ScoreSettings.of(cfg), task, tok)  # the score stage's settings, read once
scored = scorer(batch, progress=0.0, generator=gen)  # rewards (B, T)
adv, ret = estimate("grpo_process", scored.rewards, scored.reward_mask, batch.response_mask, group_ids=batch.group_ids)
adv = normalise("batch", adv, batch.response_mask)
values = torch.zeros(batch.response_mask.shape)  # a critic's or MC values, V(s_t)
adv_gae, ret_gae = estimate_at(
    "step",
    "gae",
    scored.rewards,
    scored.reward_mask,
    batch.response_mask,
    step_ends=scored.step_ends,
    values=values,
    lam=0.0,
)  # VinePPO step advantages
