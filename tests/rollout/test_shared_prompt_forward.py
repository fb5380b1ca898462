"""The shared-prompt forward (each distinct prompt computed once) against the plain pass:
same logits, hidden states and parameter gradients, on Llama and on a Qwen2 with GQA and
attention bias."""

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from creditrl.policy.engines import Generation, HFEngine, SamplingParams
from creditrl.policy.model import TinyPreset, build_tiny
from creditrl.rollout.batch import (
    TrajectoryBatch,
    _distinct_prompts,
    _plain_response_forward,
    _plain_response_states,
    _prompt_groups,
    _shared_prompt_forward,
    batch_from_generation,
    response_forward,
    response_logits,
    response_states,
    token_logprobs,
)

PAD, BOS, EOS, VOCAB = 0, 1, 2, 99
ATOL = 1e-5  # outputs
RTOL_GRAD = 1e-5  # max |grad diff| / max |grad| per parameter


def _peak(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Unit-gain weights and random biases: peaked, context-dependent outputs (see conftest)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model.train()


def _llama():
    model, _ = build_tiny(3, TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    return _peak(model, 11)


def _qwen2():
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        model = Qwen2ForCausalLM(config)
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # attention bias
    return _peak(model, 13)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return {"llama": _llama, "qwen2": _qwen2}[request.param]()


def _generation(prompts: list[list[int]], lengths: list[list[int]], seed: int = 0) -> Generation:
    """``lengths[i]``: the response lengths of prompt i's samples (random tokens, eos-free)."""
    gen = torch.Generator().manual_seed(seed)
    index, pids, toks, lps = [], [], [], []
    for i, (p, ls) in enumerate(zip(prompts, lengths)):
        for n in ls:
            index.append(i)
            pids.append(list(p))
            toks.append(torch.randint(3, VOCAB, (n,), generator=gen).tolist())
            lps.append([-1.0] * n)
    return Generation(prompt_index=index, prompt_ids=pids, tokens=toks, logprobs=lps, finished=[False] * len(toks))


PROMPTS = [[BOS, 10, 11, 12], [BOS, 20], [BOS, 30, 31, 32, 33, 34, 35, 36], [BOS, 40, 41]]


def grouped_batch(shuffle: bool = True) -> TrajectoryBatch:
    """Four prompts of different lengths, 3-4 samples each, responses of length 0..9, rows shuffled
    (as a minibatch's are)."""
    lengths = [[9, 1, 5], [1, 1, 7, 3], [0, 6, 2], [4, 9, 1, 8]]
    gen = _generation(PROMPTS, lengths)
    b = batch_from_generation(gen, gen.prompt_index, pad_id=PAD)
    return b.select(torch.randperm(b.size, generator=torch.Generator().manual_seed(1))) if shuffle else b


def unique_batch() -> TrajectoryBatch:
    """No prompt repeats."""
    gen = _generation(PROMPTS, [[5], [1], [8], [3]], seed=2)
    return batch_from_generation(gen, gen.prompt_index, pad_id=PAD)


def short_batch() -> TrajectoryBatch:
    """Every response at most one token: T == 1, the cached pass is skipped."""
    gen = _generation(PROMPTS[:2], [[1, 1, 0], [1, 1]], seed=3)
    return batch_from_generation(gen, gen.prompt_index, pad_id=PAD)


def sampled_batch(model) -> TrajectoryBatch:
    """A batch from the engine: 3 prompts x 4 samples, budgets of 1, 4 and 7 tokens."""
    gen = HFEngine(model, eos_id=EOS, pad_id=PAD).generate(
        PROMPTS[:3], 4, SamplingParams(max_new_tokens=7), generator=torch.Generator().manual_seed(4), budgets=[7, 1, 4]
    )
    model.train()
    return batch_from_generation(gen, gen.prompt_index, pad_id=PAD)


def _grads(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(g0: dict, g1: dict) -> None:
    assert g0.keys() == g1.keys() and len(g0) > 0
    for name in g0:
        scale = g0[name].abs().max().clamp(min=1e-12)
        assert float((g0[name] - g1[name]).abs().max() / scale) <= RTOL_GRAD, name


def _policy_loss(batch: TrajectoryBatch, logits: torch.Tensor, states: torch.Tensor, seed: int) -> torch.Tensor:
    """Masked log-probs and hidden states times random weights (a PPO-like loss + a value-like head)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(batch.response_ids.shape, generator=gen)
    head = torch.randn(states.shape[-1], generator=gen)
    m = batch.response_mask.float()
    return (token_logprobs(logits, batch.response_ids) * w * m).sum() + ((states @ head) * w * m).sum()


def _check_forward(model, batch: TrajectoryBatch, groups) -> None:
    l0, h0 = _plain_response_forward(model, batch, hidden=True)
    g0 = _grads(model, _policy_loss(batch, l0, h0, seed=7))
    l1, h1 = _shared_prompt_forward(model, batch, groups, lm=True, hidden=True)
    assert l1.shape == l0.shape == (*batch.response_ids.shape, VOCAB)
    assert h1.shape == h0.shape
    torch.testing.assert_close(l1.float(), l0, rtol=0, atol=ATOL)
    torch.testing.assert_close(h1, h0, rtol=0, atol=ATOL)
    _assert_grads_close(g0, _grads(model, _policy_loss(batch, l1.float(), h1, seed=7)))


def _check_states(model, batch: TrajectoryBatch, groups) -> None:
    backbone = model.base_model
    s0 = _plain_response_states(backbone, batch)
    w = torch.randn(s0.shape, generator=torch.Generator().manual_seed(8)) * batch.response_mask[..., None]
    g0 = _grads(backbone, (s0 * w).sum())
    s1 = _shared_prompt_forward(backbone, batch, groups, lm=False, hidden=True)[1]
    assert s1.shape == s0.shape == (*batch.response_ids.shape, model.config.hidden_size)
    torch.testing.assert_close(s1, s0, rtol=0, atol=ATOL)
    _assert_grads_close(g0, _grads(backbone, (s1 * w).sum()))


# ----------------------------------------------------------------------------- grouping


def test_distinct_prompts_groups_rows_by_prompt():
    b = grouped_batch()
    first, inverse = _distinct_prompts(b)
    assert first.numel() == 4 and inverse.shape == (b.size,)
    # every row's prompt is its group's first row's prompt, and groups follow the prompt index
    assert torch.equal(b.prompt_ids[first][inverse], b.prompt_ids)
    assert torch.equal(b.prompt_mask[first][inverse], b.prompt_mask)
    assert torch.equal(inverse[first], torch.arange(4))
    assert len({(int(g), int(i)) for g, i in zip(b.group_ids, inverse)}) == 4


def test_dispatch_shares_only_repeated_prompts(model):
    assert _prompt_groups(grouped_batch(), model) is not None
    assert _prompt_groups(unique_batch(), model) is None
    assert _prompt_groups(grouped_batch().select(torch.tensor([0])), model) is None


# ----------------------------------------------------------------------------- equality with the plain pass


@pytest.mark.parametrize("make", [grouped_batch, unique_batch, short_batch], ids=["grouped", "unique", "T1"])
def test_shared_forward_matches_plain(model, make):
    b = make()
    _check_forward(model, b, _distinct_prompts(b))


def test_shared_forward_matches_plain_on_sampled_batch(model):
    b = sampled_batch(model)
    assert b.response_lengths.min() == 1 and b.response_lengths.max() > 1
    _check_forward(model, b, _distinct_prompts(b))


@pytest.mark.parametrize("make", [grouped_batch, unique_batch, short_batch], ids=["grouped", "unique", "T1"])
def test_shared_states_match_plain(model, make):
    b = make()
    _check_states(model, b, _distinct_prompts(b))


def test_public_entry_points_match_plain(model):
    for b in (grouped_batch(), unique_batch(), short_batch()):
        l0, h0 = _plain_response_forward(model, b, hidden=True)
        logits, states = response_forward(model, b, hidden=True)
        assert logits.dtype == torch.float32
        torch.testing.assert_close(logits, l0, rtol=0, atol=ATOL)
        torch.testing.assert_close(states, h0, rtol=0, atol=ATOL)
        assert response_forward(model, b)[1] is None
        valid = torch.arange(b.response_ids.shape[1])[None] < b.response_lengths[:, None]
        # the packed pass (without hidden states) computes the real positions only; padding holds 0
        torch.testing.assert_close(response_logits(model, b)[valid], l0[valid], rtol=0, atol=ATOL)
        torch.testing.assert_close(response_logits(model, b, packed=False), l0, rtol=0, atol=ATOL)
        torch.testing.assert_close(
            response_states(model.base_model, b), _plain_response_states(model.base_model, b), rtol=0, atol=ATOL
        )


def test_activation_checkpointing_falls_back_to_plain():
    model = _llama()
    model.activation_checkpointing_enable()
    b = grouped_batch()
    assert _prompt_groups(b, model) is None
    with torch.no_grad():  # no backward: the cache is kept, so sharing is allowed again
        assert _prompt_groups(b, model) is not None
    _check_forward_public(model, b)


def _check_forward_public(model, b: TrajectoryBatch) -> None:
    l0, _ = _plain_response_forward(model, b)
    g0 = _grads(model, (token_logprobs(l0, b.response_ids) * b.response_mask).sum())
    l1 = response_logits(model, b)
    torch.testing.assert_close(l1, l0, rtol=0, atol=ATOL)
    _assert_grads_close(g0, _grads(model, (token_logprobs(l1, b.response_ids) * b.response_mask).sum()))
