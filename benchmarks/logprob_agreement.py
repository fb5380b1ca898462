"""How far the static engine's sampling log-probs are from a full HF forward pass, on the demo's
SFT policy (the unit tests check < 1e-5 on small test models; this measures a trained one).

    .venv/bin/python benchmarks/logprob_agreement.py [--prompts 16] [--group 8] [--tokens 48]

For each decode path (``policy.kernels``: torch = tensor ops, numba = compiled kernels) it samples
prompts x group responses at temperature 1 and prints the largest |engine log-prob - full-forward
log-prob| over all sampled tokens, with the log-prob where it occurs; then, per path, how the
engine's output changes when identical rows are not shared (``share_rows=False``: every row
decoded): rows with different tokens and the largest log-prob difference.
"""

import argparse

import torch

from bench import bench_policy_and_prompts
from creditrl.policy.engines import SamplingParams, StaticEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    model, tok, prompts = bench_policy_and_prompts(args.prompts)  # the SFT policy benchmarks/bench.py uses
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)
    for kernels in ("torch", "numba"):
        engine = StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kernels=kernels)
        gen = engine.generate(prompts, args.group, params, generator=torch.Generator().manual_seed(0))
        worst, at, count = 0.0, 0.0, 0
        with torch.no_grad():
            for row, (toks, lps) in enumerate(zip(gen.tokens, gen.logprobs)):
                prompt = prompts[row // args.group]
                logits = model(torch.tensor([prompt + toks])).logits[0].float()
                ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) - 1 + len(toks)]
                ref = ref.gather(-1, torch.tensor(toks)[:, None])[:, 0]
                diff = (ref - torch.tensor(lps)).abs()
                count += len(toks)
                if float(diff.max()) > worst:
                    worst, at = float(diff.max()), float(ref[diff.argmax()])
        print(
            f"policy.kernels={kernels}: max |engine - full forward| = {worst:.2e} over {count} tokens "
            f"(at a log-prob of {at:.2f}); {engine.last_rows[0]:,} of {engine.last_rows[1]:,} row-steps computed"
        )
        every = StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kernels=kernels, share_rows=False)
        alone = every.generate(prompts, args.group, params, generator=torch.Generator().manual_seed(0))
        differ = sum(a != b for a, b in zip(gen.tokens, alone.tokens))
        gap = max(max((abs(x - y) for x, y in zip(a, b)), default=0.0) for a, b in zip(gen.logprobs, alone.logprobs))
        print(
            f"policy.kernels={kernels}: share_rows=False: {differ} of {len(gen.tokens)} rows with other tokens, "
            f"max |log-prob difference| {gap:.2e}"
        )


if __name__ == "__main__":
    main()
