"""The reference engine: batched sampling from any HF causal LM through its own KV cache."""

from __future__ import annotations

import functools

import torch

from creditrl.policy.device import module_device
from creditrl.policy.engines.base import InProcessEngine, SamplingParams, left_pad, positions_from_mask, sample_step


class HFEngine(InProcessEngine):
    """Batched sampling with the HF KV cache; a row that has produced eos leaves the batch (its
    cache rows are dropped), and decoding stops when every row has. The model may sit on any
    device."""

    def _decode(
        self,
        requests: list[list[int]],
        limit: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        draw_rows: tuple[int, int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = module_device(self.model)
        was_training = self.model.training
        self.model.eval()
        ids, attn = (x.to(device) for x in left_pad(requests, self.pad_id))
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=True)
        cache, logits = out.cache, out.logits[:, -1].float()
        next_pos = positions_from_mask(attn)[:, -1] + 1
        n_req = len(requests)
        state = (torch.zeros(n_req, dtype=torch.bool, device=device),) * 2  # (finished, done)
        active = torch.arange(n_req, device=device)  # rows still decoding; the cache holds only these
        on_device = limit.to(device)
        sample = functools.partial(sample_step, pad_id=self.pad_id, eos_id=self.eos_id, draw_rows=draw_rows)
        tokens, logps = [], []
        for step in range(int(limit.max())):
            tok, logp, state = sample(logits, params, generator, state, on_device, step)
            tokens.append(tok)
            logps.append(logp)
            done = state[1]
            if bool(done.all()):
                break
            still = ~done[active]
            if not bool(still.all()):
                # Early exit: drop finished rows from the cache and from every later forward pass.
                keep = still.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                active, attn, next_pos = active[keep], attn[keep], next_pos[keep]
            attn = torch.cat([attn, attn.new_ones((len(active), 1))], dim=1)
            out = self.model(
                input_ids=tok[active][:, None],
                attention_mask=attn,
                position_ids=next_pos[:, None],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            logits = logits.clone()
            logits[active] = out.logits[:, -1].float()
            next_pos = next_pos + 1
        self.model.train(was_training)
        return torch.stack(tokens, dim=1).cpu(), torch.stack(logps, dim=1).cpu()
