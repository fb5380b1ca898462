"""``benchmarks/bench.py``'s output: the tables of a ``bench.json`` and the reward-curve plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def plot_curve(curve: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name in ("creditrl", "trl"):
        if name not in curve:
            continue
        rewards = curve[name]
        xs = list(range(1, len(rewards) + 1))
        k = 5
        smooth = [statistics.mean(rewards[max(0, i - k + 1) : i + 1]) for i in range(len(rewards))]
        line = ax.plot(xs, smooth, label=f"{'TRL GRPOTrainer' if name == 'trl' else 'creditrl'} (5-iter mean)")[0]
        ax.plot(xs, rewards, alpha=0.25, color=line.get_color())
    ax.set_xlabel("iteration (16 prompts x 8 samples)")
    ax.set_ylabel("mean outcome reward")
    ax.set_title("GRPO from the same SFT policy: TRL vs creditrl")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


METHOD = (
    "creditrl and its peers run back to back in one process on the same model, batch and settings; decode calls "
    "and GRPO iteration rounds alternate between them, the first iteration of each round dropped as warm-up. Cells "
    "are min / median / max over the repeats; ratios are of medians."
)


def markdown_report(res: dict[str, Any]) -> str:
    """The page's tables, from a bench.json."""
    o = res["options"]
    lines = [
        METHOD,
        "",
        "| batch (prompts x samples) | max new tokens | threads | decode repeats | iteration rounds x iterations |",
        "|---|---|---|---|---|",
        f"| {o['prompts']} x {o['group']} | {o['max_new_tokens']} | {res['threads']} | {o['repeats']} | "
        f"{o['rounds']} x {o['iterations']} |",
        "",
        "| decode (tokens/s) | workload | HF generate | creditrl HFEngine | creditrl StaticEngine, tensor ops "
        "(`policy.kernels=torch`) | creditrl StaticEngine, every row decoded (`share_rows=False`) | "
        "creditrl StaticEngine | row-steps computed | kernels / tensor ops | shared / every row | static / HF "
        "generate |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, d in res["decode"].items():
        cell = lambda k: "{min:,.0f} / {median:,.0f} / {max:,.0f}".format(**d[k]["tokens_per_s"])  # noqa: E731
        lines.append(
            f"| | {workload} | {cell('hf_generate')} | {cell('creditrl_hf_engine')} | "
            f"{cell('creditrl_static_torch')} | {cell('creditrl_static_every_row')} | {cell('creditrl_static')} | "
            f"{100 * d['computed_share']['median']:.0f}% | {d['ratio_kernels_vs_tensor_ops']:.2f}x | "
            f"{d['ratio_shared_vs_every_row']:.2f}x | {d['ratio_static_vs_hf_generate']:.2f}x |"
        )
    it = res["iteration"]
    s = lambda d: "{min:.3f} / {median:.3f} / {max:.3f}".format(**d)  # noqa: E731
    lines += [
        "",
        "| GRPO iteration (s) | value |",
        "|---|---|",
        f"| creditrl full iteration | {s(it['creditrl']['iter_s'])} |",
        f"| creditrl rollout | {s(it['creditrl']['rollout_s'])} |",
        f"| creditrl update | {s(it['creditrl']['update_s'])} |",
        f"| share of rows the update skipped (advantage 0 everywhere) | {s(it['creditrl']['skipped_rows'])} |",
        "| creditrl full iteration, every row trained (`optim.skip_zero_advantage=false`) | "
        f"{s(it['creditrl_every_row']['iter_s'])} |",
        f"| creditrl update, every row trained | {s(it['creditrl_every_row']['update_s'])} |",
    ]
    if "trl" in it:
        lines += [
            f"| TRL GRPOTrainer full iteration | {s(it['trl']['iter_s'])} |",
            f"| TRL / creditrl | {it['ratio_trl_vs_creditrl']:.2f}x |",
            f"| TRL / creditrl training every row | {it['ratio_trl_vs_creditrl_every_row']:.2f}x |",
        ]
    lines += [
        "| update model GFLOP/s (6 N x the trained rows' prompt and response tokens, padding not counted) | "
        f"{it['creditrl']['update_gflops']['median']:.0f} "
        f"({100 * it['creditrl']['update_share_of_peak']:.0f}% of the {res['peak_gflops']['max']:.0f} GFLOP/s matmul "
        "peak) |",
        f"| peak RSS of the bench process | {res['peak_rss_mb']:.0f} MB |",
    ]
    if "curve" in res and "trl_summary" in res["curve"]:
        c = res["curve"]
        lines += [
            "",
            "| reward curve (mean outcome reward per iteration) | creditrl | TRL GRPOTrainer |",
            "|---|---|---|",
        ]
        for key, label in (
            ("mean", "mean over all iterations"),
            ("first_half", "first half"),
            ("second_half", "second half"),
        ):
            lines.append(f"| {label} | {c['creditrl_summary'][key]:.3f} | {c['trl_summary'][key]:.3f} |")
        lines.append(
            f"| standard error of the mean | {c['creditrl_summary']['se']:.3f} | {c['trl_summary']['se']:.3f} |"
        )
        if "correlation" in c:
            lines.append(f"| per-iteration correlation (same prompts) | {c['correlation']:.2f} | |")
    if "scaling" in res:
        lines += [
            "",
            "| axis | value | iteration s | rollout s | update s | mean response length |",
            "|---|---|---|---|---|---|",
        ]
        for e in res["scaling"]:
            lines.append(
                f"| {e['axis']} | {e['value']} | {e['iter_s']:.3f} | {e['rollout_s']:.3f} | "
                f"{e['update_s']:.3f} | {e['response_length']:.1f} |"
            )
    return "\n".join(lines)
