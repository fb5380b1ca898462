"""Tiny models for the search tests: a policy whose steps end often, and an untrained PRM."""

from __future__ import annotations

import pytest
import torch

from creditrl.prm.model import ProcessRewardModel
from creditrl.tasks import make_task


@pytest.fixture(scope="session")
def step_policy(peaked_tiny):
    """A peaked tiny policy with its logits of ';' raised by 3 and of eos by 2 (an lm_head bias,
    which both engines read): samples end steps every few tokens and often finish, so a search
    has several steps and terminals to work with; greedy decoding writes several steps."""
    model, tok = peaked_tiny(0, 1)
    with torch.no_grad():
        model.model.norm.weight.fill_(1.5)
    bias = torch.zeros(len(tok))
    bias[tok.convert_tokens_to_ids(";")] = 3.0
    bias[tok.eos_token_id] = 2.0
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    return model.eval(), tok


@pytest.fixture(scope="session")
def tiny_prm(peaked_tiny):
    """An untrained PRM (scores near 0.5, but different per prefix) and its tokenizer."""
    model, tok = peaked_tiny(3, 4)
    return ProcessRewardModel.from_model(model, seed=1).eval(), tok


@pytest.fixture(scope="session")
def task():
    return make_task("arithmetic", min_ops=2, max_ops=3)


@pytest.fixture(scope="session")
def problems(task):
    return task.sample(3, split="heldout", seed=0)
