"""The packed response forward against the HF pass: logits and gradients, short and long."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from creditrl.policy.model import build_tiny, sharpen
from creditrl.rollout import batch as B
from creditrl.rollout.packed import MASKED_UP_TO, _layout, packed_reason, packed_response_logits

SMALL = dict(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=2048,
)


def _models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "tiny": sharpen(build_tiny(0)[0], 3),
        "llama_gqa": LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=2)),
        "qwen2_bias": Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=2)),
        "qwen3_qk_norm": Qwen3ForCausalLM(Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8)),
    }


def _batch(vocab: int, lengths: list[int], prompt_len: int = 6, seed: int = 0) -> B.TrajectoryBatch:
    """Rows in groups of two sharing a prompt; the first prompt left-padded by 2."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    prompts = torch.randint(4, vocab, (b // 2 + b % 2, prompt_len), generator=g).repeat_interleave(2, 0)[:b]
    pmask = torch.ones(b, prompt_len, dtype=torch.long)
    pmask[:2, :2] = 0
    prompts[:2, :2] = 0
    lens = torch.tensor(lengths)
    valid = torch.arange(t)[None] < lens[:, None]
    resp = torch.randint(4, vocab, (b, t), generator=g).masked_fill(~valid, 0)
    resp[0, min(1, t - 1)] = 0  # an untrained policy may sample the pad id: nn.Embedding's padding_idx gets no gradient
    return B.TrajectoryBatch(
        prompt_ids=prompts,
        prompt_mask=pmask,
        response_ids=resp,
        response_lengths=lens,
        response_mask=valid,
        old_logprobs=torch.zeros(b, t),
        group_ids=torch.arange(b) // 2,
        finished=torch.ones(b, dtype=torch.bool),
    )


def _packed(model: torch.nn.Module, batch: B.TrajectoryBatch) -> torch.Tensor:
    first, inverse = B._distinct_prompts(batch)
    args = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_lengths)
    return packed_response_logits(model, *args, first, inverse)


@pytest.mark.parametrize("name", ["tiny", "llama_gqa", "qwen2_bias", "qwen3_qk_norm"])
@pytest.mark.parametrize("lengths", [[9, 3, 1, 7, 9, 5], [600, 211, 1, 598]])
def test_packed_logits_and_gradients_match_the_hf_pass(name: str, lengths: list[int]) -> None:
    model = _models()[name]
    vocab = model.config.vocab_size
    batch = _batch(vocab, lengths)
    assert packed_reason(model, 700) is None
    mask = batch.response_mask
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    grads = {}
    for path, forward in (
        ("hf", lambda: B._plain_response_forward(model, batch)[0]),
        ("packed", lambda: _packed(model, batch)),
    ):
        model.zero_grad()
        logits = forward()
        (B.token_logprobs(logits, batch.response_ids) * weights).sum().backward()
        grads[path] = (logits.detach(), [p.grad.clone() for p in model.parameters()])
    (hf, g_hf), (packed, g_packed) = grads["hf"], grads["packed"]
    assert torch.allclose(packed[mask], hf[mask], atol=2e-5 * max(1.0, float(hf[mask].abs().max())), rtol=1e-5)
    assert float(packed[~mask].abs().max()) == 0.0  # padding positions hold zeros
    for a, b in zip(g_hf, g_packed):
        assert torch.allclose(b, a, atol=1e-5 * max(1e-3, float(a.abs().max())), rtol=1e-4)


@pytest.mark.parametrize("lengths", [[9, 3, 1, 7, 9, 5], [600, 211, 1, 598]])
def test_layout_groups_rows_by_prompt_length_and_takes_each_attention_where_cheaper(lengths: list[int]) -> None:
    batch = _batch(40, lengths)
    first, inverse = B._distinct_prompts(batch)
    t = batch.response_ids.shape[1]
    lay = _layout(batch.prompt_mask, batch.response_lengths, first, t)
    assert [(g.n, g.idx.tolist()) for g in lay.groups] == [(4, [0, 1]), (6, list(range(2, len(lengths))))]
    short = t - 1 <= MASKED_UP_TO
    assert all((g.allowed is not None) == short for g in lay.groups)  # the test above covers both passes
    if short:  # query i sees the n prompt keys and response keys 0..i
        assert lay.groups[0].allowed.tolist()[2] == [True] * 7 + [False] * 5
    # every packed input comes back from its own row and column of the groups' outputs
    width = t - 1
    slots = torch.cat([g.idx for g in lay.groups])
    assert torch.equal(slots[lay.unpack // width], lay.rows) and torch.equal(lay.unpack % width, lay.cols)
    for g in lay.groups:  # the gather reads each row's packed inputs in order
        live = torch.arange(width)[None] < (batch.response_lengths[g.idx, None] - 1)
        assert torch.equal(lay.rows[g.gather[live]], g.idx[:, None].expand(-1, width)[live])
        assert torch.equal(lay.cols[g.gather[live]], torch.arange(width)[None].expand(len(g.idx), -1)[live])


def test_packed_gradients_are_the_same_bits_on_every_repeat() -> None:
    # many rows past their end and many rows per prompt: the gradients that gather from shared or
    # padded places must not depend on how threads interleave their sums
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # restored below: later tests' rounding depends on the thread count
    try:
        model = _models()["llama_gqa"]
        lengths = [int(n) for n in torch.randint(1, 60, (96,), generator=torch.Generator().manual_seed(2))]
        batch = _batch(model.config.vocab_size, lengths)
        mask = batch.response_mask
        weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
        grads = []
        for _ in range(8):
            model.zero_grad()
            (B.token_logprobs(_packed(model, batch), batch.response_ids) * weights).sum().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


def test_packed_logits_when_every_response_is_one_token() -> None:
    model = _models()["tiny"].eval()
    batch = _batch(model.config.vocab_size, [1, 1, 1])
    with torch.no_grad():
        packed, hf = _packed(model, batch), B._plain_response_forward(model, batch)[0]
    assert torch.allclose(packed, hf, atol=1e-5)


def test_response_forward_takes_the_packed_pass_where_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _models()["tiny"].eval()
    batch = _batch(model.config.vocab_size, [5, 4, 3, 2])
    calls = []
    real = B.packed_response_logits
    monkeypatch.setattr(B, "packed_response_logits", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        packed = B.response_forward(model, batch)[0]
        states = B.response_forward(model, batch, hidden=True)  # hidden states: the HF pass
    assert calls == [1]
    assert torch.allclose(packed[batch.response_mask], states[0][batch.response_mask], atol=1e-5)


def test_packed_reason_names_what_it_cannot_run() -> None:
    model = _models()["tiny"]
    assert "not a plain Hugging Face model" in packed_reason(torch.nn.Sequential(model), 10)
    assert packed_reason(model.to(torch.bfloat16), 10) == "the weights are not float32"
    model = model.float()
    model.gradient_checkpointing_enable()
    assert packed_reason(model, 10) == "gradient checkpointing is on"
    mistral = LlamaConfig(**SMALL)
    mistral.model_type = "mistral"
    mistral.sliding_window = 16
    assert "sliding window (16)" in packed_reason(LlamaForCausalLM(mistral), 40)


def test_the_rolled_rotary_is_hf_rotate_half_bit_for_bit_with_its_gradient() -> None:
    from transformers.models.llama.modeling_llama import rotate_half

    from creditrl.policy.engines.decoder import rotary, signed_sin

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 3, 16, generator=g, requires_grad=True)
    cos, sin = torch.randn(5, 4, 1, 16, generator=g), torch.randn(5, 4, 1, 16, generator=g)
    grad = torch.randn(5, 4, 3, 16, generator=g)
    ours = rotary(x, cos, signed_sin(sin))
    (dx_ours,) = torch.autograd.grad(ours, x, grad)
    hf = x * cos + rotate_half(x) * sin
    (dx_hf,) = torch.autograd.grad(hf, x, grad)
    assert torch.equal(ours, hf) and torch.equal(dx_ours, dx_hf)
