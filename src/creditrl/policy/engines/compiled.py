"""A decode engine whose step is compiled once per shape bucket: on CUDA each step replays one
CUDA graph instead of launching every layer's kernels from Python, which is what bounds Hugging
Face's decode on a GPU (gpt-fast's recipe: a static KV cache and
``torch.compile(mode="reduce-overhead")``).

:class:`CompiledEngine` keeps the static engine's mathematics
(:class:`~creditrl.policy.engines.decoder.Decoder`) and its prompt prefill
(:func:`~creditrl.policy.engines.static.prefill`, eager, one forward per distinct prompt), and
decodes into one KV cache per bucket:

* **buckets**: rows rounded up to a power of two, cache columns (longest prompt + new tokens) to a
  power of two from ``MIN_COLUMNS``; each bucket owns a zeroed cache ``(layers, 2, rows, kv_heads,
  columns, head_dim)`` and its rotary tables, allocated once, so every step of every call in the
  bucket has the same shapes and addresses, and the step is compiled once per bucket
  (:attr:`CompiledEngine.compilations`). Padding rows and finished rows are decoded too (their
  draws discarded): the graph never changes shape.
* **the step**: token, position, the column written and each row's first real column are its only
  inputs; attention reads the whole cache under a mask (real prompt columns up to the column just
  written), a query group per kv head (no copy of the keys).
* **weights**: the engine owns the decoder's tensors (matrices in the autocast dtype of
  ``policy.precision``, the rest in the weights' dtype) at fixed addresses; every call first copies
  the live parameters into them in place, so an update is seen without recompiling.
* **sampling**: :func:`~creditrl.policy.engines.base.sample_step`, shared by every in-process
  engine: the same tokens as the HF engine for a seed, to float rounding.

On CUDA the step compiles with inductor in ``reduce-overhead`` mode (CUDA graphs); on the CPU with
inductor (no graphs), or, should inductor fail (no C++ compiler), runs eagerly; the log line of each
bucket's compilation says which (:attr:`CompiledEngine.backend`). On the CPU ``auto`` keeps the
faster :class:`~creditrl.policy.engines.static.StaticEngine`. :meth:`CompiledEngine.shared` gives
the one engine of a model per process (rollouts and evaluations share the caches and steps).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from creditrl.policy.device import PRECISIONS, module_device
from creditrl.policy.engines.base import InProcessEngine, SamplingParams, sample_step
from creditrl.policy.engines.decoder import Decoder, unsupported_reason
from creditrl.policy.engines.static import prefill

log = logging.getLogger("creditrl")

MIN_COLUMNS = 64  # the smallest cache bucket: short calls share one graph
BACKENDS = ("inductor", "eager")  # eager: dynamo captures the step, torch runs it (tests, debugging)
MATRICES = ("qkv", "o", "gate_up", "down")  # the decoder layer's products, held in the compute dtype
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(eos, pad, precision): engine}


def bucket(n: int, floor: int = 1) -> int:
    """``n`` rounded up to a power of two, at least ``floor``."""
    return max(floor, 1 << max(0, n - 1).bit_length())


def decode_step(
    dec: Decoder,
    cache: torch.Tensor,  # (layers, 2, B, kv, L, d)
    cos_t: torch.Tensor,  # (L, d)
    sin_t: torch.Tensor,
    tok: torch.Tensor,  # (B,) the token fed to each row
    pos: torch.Tensor,  # (B,) its position
    col: torch.Tensor,  # () the cache column it is written to
    first: torch.Tensor,  # (B,) each row's first real column
) -> torch.Tensor:
    """Logits (B, V) float32 of one decode step; writes the step's keys/values at column ``col``."""
    rows, length = cache.shape[2], cache.shape[4]
    cols = torch.arange(length, device=tok.device)
    mask = ((cols >= first[:, None]) & (cols <= col))[:, None, None]  # (B, 1, 1, L)
    group = dec.n_heads // dec.n_kv
    at = col.view(1)

    def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values = cache[i, 0], cache[i, 1]
        keys.index_copy_(2, at, k.to(keys.dtype))
        values.index_copy_(2, at, v.to(values.dtype))
        # the query heads of one kv head as that head's query rows: (B, kv, group, d), keys not copied
        q = q.reshape(rows, dec.n_kv, group, dec.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=dec.scale)
        return out.reshape(rows, dec.n_heads, 1, dec.head_dim)

    return dec.forward(tok[:, None], cos_t[pos][:, None], sin_t[pos][:, None], attend)


@dataclass
class _Bucket:
    cache: torch.Tensor
    cos_t: torch.Tensor
    sin_t: torch.Tensor
    step: object  # the compiled decode_step (or decode_step itself when eager)
    warm: bool = False  # compiled (its first call made)


class CompiledEngine(InProcessEngine):
    """Batched sampling with a decode step compiled once per shape bucket (see the module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_id: int,
        pad_id: int,
        precision: str = "fp32",
        backend: str = "inductor",
    ) -> None:
        reason = unsupported_reason(model, cpu_only=False)
        if reason is not None:
            raise ValueError(f"CompiledEngine cannot run this model: {reason}")
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got '{backend}'")
        super().__init__(model, eos_id=eos_id, pad_id=pad_id, precision=precision)
        self.backend = backend  # becomes "eager (inductor failed: ...)" when inductor cannot compile
        self.dec: Decoder | None = None
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self.compilations = 0  # decode steps compiled: one per bucket used

    @classmethod
    def shared(cls, model: PreTrainedModel, *, eos_id: int, pad_id: int, precision: str = "fp32") -> CompiledEngine:
        """The one engine of ``model`` with these settings in this process: rollouts and every
        evaluation share its weight copies, caches and compiled steps (an evaluation builds its
        engine afresh each time)."""
        engines = _SHARED.setdefault(model, {})
        key = (eos_id, pad_id, precision)
        if key not in engines:
            engines[key] = cls(model, eos_id=eos_id, pad_id=pad_id, precision=precision)
        return engines[key]

    def sync(self) -> None:
        """Copy the model's live parameters into the engine's decoder tensors, in place (the compiled
        steps read them at fixed addresses): called at every ``generate``."""
        if self.dec is None:
            fresh = Decoder(self.model, cpu_only=False)
            self.dec = _owned(fresh, PRECISIONS[self.precision] or fresh.embed.dtype)
            return
        for mine, parts in zip(_tensors(self.dec), _live_parts(self.model), strict=True):
            row = 0  # a fused tensor's parts are stacked along dim 0: no concatenated temporary
            for part, rows in parts:
                if part is not None:  # a missing bias stays the zeros it was fused with
                    mine[row : row + rows].copy_(part)
                row += rows

    def _bucket(self, rows: int, columns: int) -> _Bucket:
        key = (bucket(rows), bucket(columns, MIN_COLUMNS))
        if key not in self.buckets:
            dec = self.dec
            dtype = dec.layers[0].qkv.dtype
            shape = (len(dec.layers), 2, key[0], dec.n_kv, key[1], dec.head_dim)
            # zeros: masked columns weigh 0 in the softmax, and 0 * (never-written memory) could be NaN
            cache = torch.zeros(shape, dtype=dtype, device=dec.embed.device)
            cos_t, sin_t = dec.rope_table(key[1])
            for t in (cache, cos_t, sin_t):
                torch._dynamo.mark_static_address(t)
            self.buckets[key] = _Bucket(cache, cos_t, sin_t, self._compile())
        return self.buckets[key]

    def _compile(self):
        if self.backend.startswith("eager (inductor failed"):
            return decode_step
        if self.backend != "inductor":
            return torch.compile(decode_step, backend=self.backend, dynamic=False, fullgraph=True)
        mode = "reduce-overhead" if self.dec.embed.device.type == "cuda" else None
        return torch.compile(decode_step, mode=mode, dynamic=False, fullgraph=True)

    def _run(self, b: _Bucket, *inputs: torch.Tensor) -> torch.Tensor:
        if b.warm:
            if self.dec.embed.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are consumed
            return b.step(self.dec, b.cache, b.cos_t, b.sin_t, *inputs)
        start = time.perf_counter()
        try:  # every bucket is a recompilation of decode_step: past dynamo's default limit of 8 too
            with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=512):
                out = b.step(self.dec, b.cache, b.cos_t, b.sin_t, *inputs)
        except Exception as err:  # inductor could not build the step (e.g. no C++ compiler): run eagerly
            if self.backend != "inductor" or b.step is decode_step:
                raise
            self.backend = f"eager (inductor failed: {type(err).__name__}: {str(err).splitlines()[0][:200]})"
            for other in self.buckets.values():
                other.step = decode_step
            out = decode_step(self.dec, b.cache, b.cos_t, b.sin_t, *inputs)
        b.warm = True
        self.compilations += 1
        rows, columns = b.cache.shape[2], b.cache.shape[4]
        how = self.backend
        if how == "inductor":
            how += ", CUDA graphs" if self.dec.embed.device.type == "cuda" else ", no CUDA graphs on the CPU"
        log.info("compiled engine: decode step for %d rows x %d columns in %.1f s (%s)", rows, columns,
                 time.perf_counter() - start, how)  # fmt: skip
        return out

    def _decode(
        self,
        requests: list[list[int]],
        limit: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        draw_rows: tuple[int, int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.sync()
        dec = self.dec
        device = module_device(self.model)
        n_req, steps = len(requests), int(limit.max())
        uniq: dict[tuple[int, ...], int] = {}
        prompt_of = torch.tensor([uniq.setdefault(tuple(p), len(uniq)) for p in requests], device=device)
        width = max(len(p) for p in uniq)
        longest = max(len(p) for p in requests) + steps - 1  # the last sampled token is never fed back
        if dec.window is not None and longest > dec.window:
            raise ValueError(f"sequence length {longest} exceeds Mistral sliding_window={dec.window}; use engine 'hf'")
        b = self._bucket(n_req, width + steps - 1)
        plogits, prefix, attn, pos = prefill(dec, [list(p) for p in uniq], self.pad_id, b.cos_t, b.sin_t)
        b.cache[:, :, :n_req, :, :width] = prefix[:, :, prompt_of]
        rows = b.cache.shape[2]
        first = torch.zeros(rows, dtype=torch.long, device=device)  # padding rows: finite zeros, unread
        first[:n_req] = (width - attn.sum(-1))[prompt_of]
        next_pos = torch.zeros(rows, dtype=torch.long, device=device)
        next_pos[:n_req] = pos[prompt_of, -1] + 1
        fed = torch.full((rows,), self.pad_id, dtype=torch.long, device=device)
        logits = plogits[prompt_of].float()

        state = (torch.zeros(n_req, dtype=torch.bool, device=device),) * 2  # (finished, done)
        on_device = limit.to(device)
        columns = torch.arange(width, width + steps, device=device)  # step j's token goes to column width + j
        sample = functools.partial(sample_step, pad_id=self.pad_id, eos_id=self.eos_id, draw_rows=draw_rows)
        tokens, logps = [], []
        for step in range(steps):
            tok, logp, state = sample(logits, params, generator, state, on_device, step)
            tokens.append(tok)
            logps.append(logp)
            if bool(state[1].all()):
                break
            fed[:n_req] = tok
            out = self._run(b, fed, next_pos, columns[step], first)
            logits = out[:n_req].clone()  # a CUDA graph's output is overwritten by its next replay
            next_pos += 1
        return torch.stack(tokens, 1).cpu(), torch.stack(logps, 1).cpu()


def _tensors(dec: Decoder) -> list[torch.Tensor]:
    """The decoder's weight tensors in a fixed order (the rotary module's are not weights)."""
    out = [dec.embed, dec.norm, dec.lm_head, dec.lm_head_bias]
    for ly in dec.layers:
        for f in dataclasses.fields(ly):
            value = getattr(ly, f.name)
            out.append(value[0] if isinstance(value, tuple) and f.name != "packed" else value)
    return [t for t in out if isinstance(t, torch.Tensor)]


def _live_parts(model: PreTrainedModel):
    """For each tensor of :func:`_tensors`, in its order: the model's live tensors it is made of, stacked
    along dim 0, each with its row count (``None`` for a missing bias, fused as zeros)."""

    def whole(t: torch.Tensor) -> tuple[tuple[torch.Tensor, int], ...]:
        return ((t, t.shape[0]),)

    def biases(*linears: torch.nn.Linear) -> list:
        if all(lin.bias is None for lin in linears):
            return []
        return [tuple((lin.bias, lin.out_features) for lin in linears)]

    def weights(*linears: torch.nn.Linear) -> tuple:
        return tuple((lin.weight, lin.out_features) for lin in linears)

    base = model.model
    yield from (whole(base.embed_tokens.weight), whole(base.norm.weight), whole(model.lm_head.weight))
    yield from biases(model.lm_head)
    for layer in base.layers:
        at, mlp = layer.self_attn, layer.mlp
        yield whole(layer.input_layernorm.weight)
        yield weights(at.q_proj, at.k_proj, at.v_proj)
        yield from biases(at.q_proj, at.k_proj, at.v_proj)
        norms = (getattr(at, "q_norm", None), getattr(at, "k_norm", None))  # Qwen3
        yield from (whole(norm.weight) for norm in norms if norm is not None)
        yield weights(at.o_proj)
        yield from biases(at.o_proj)
        yield whole(layer.post_attention_layernorm.weight)
        yield weights(mlp.gate_proj, mlp.up_proj)
        yield from biases(mlp.gate_proj, mlp.up_proj)
        yield weights(mlp.down_proj)
        yield from biases(mlp.down_proj)


def _owned(dec: Decoder, compute: torch.dtype) -> Decoder:
    """``dec`` on copies of its tensors that the engine owns, at static addresses for the compiled
    steps: the products' matrices (and the output head) in ``compute``, the rest as they are."""

    def own(t: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.detach().to(dtype or t.dtype, copy=True)
        torch._dynamo.mark_static_address(t)
        return t

    dec.embed, dec.norm, dec.lm_head_bias = own(dec.embed), own(dec.norm), own(dec.lm_head_bias)
    dec.lm_head = own(dec.lm_head, compute)
    for i, ly in enumerate(dec.layers):
        changes = {}
        for f in dataclasses.fields(ly):
            value = getattr(ly, f.name)
            if isinstance(value, torch.Tensor):
                changes[f.name] = own(value, compute if f.name in MATRICES else None)
            elif isinstance(value, tuple) and f.name != "packed":
                changes[f.name] = (own(value[0]), value[1])
        dec.layers[i] = dataclasses.replace(ly, **changes)
    return dec
