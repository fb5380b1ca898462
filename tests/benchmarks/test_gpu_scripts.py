"""The GPU scripts' CPU-side parts: docs/results/gpu.md is what gpu_report.py renders from the kept run
files, and gpu_realsize.py's model has Qwen2-0.5B's layer shape with an eos no row can sample."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from creditrl.policy.model import load_policy

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_page_is_rendered_from_the_kept_run_files():
    report = _script("gpu_report")
    runs = ROOT / "docs" / "results" / "gpu"
    page = report.render(runs)
    assert page == (ROOT / "docs" / "results" / "gpu.md").read_text()  # regenerate: python benchmarks/gpu_report.py
    sizes = json.loads((runs / "gpu_realsize.json").read_text())
    long = next(p for p in sizes["points"] if p["length"] == 1024)
    ratio = long["trl"]["iter_s"]["median"] / long["creditrl"]["iter_s"]["median"]
    assert f"| 1024 | 16 | {long['creditrl']['iter_s']['median']:.2f} " in page
    assert f"**{ratio:.2f}x**" in page
    check = json.loads((runs / "gpu_train_check.json").read_text())
    assert check["passed"] and "32/32 sequences equal" in page
    assert "NVIDIA H200" in page.splitlines()[2]  # the machine, stated once at the top


def test_realsize_model_has_the_qwen2_layer_shape_and_an_unreachable_eos(tmp_path):
    realsize = _script("gpu_realsize")
    path = realsize.save_model(tmp_path / "m", layers=1, seed=0)
    model, tok = load_policy(str(path))
    c = model.config
    assert c.model_type == "qwen2"
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads) == (896, 4864, 14, 2)
    assert tok.eos_token_id == c.vocab_size  # outside the logits: every row decodes max_new_tokens
    layer = 2 * 896**2 + 2 * 896 * 128 + (896 + 2 * 128) + 3 * 896 * 4864 + 2 * 896  # attention (+bias), MLP, norms
    assert sum(p.numel() for p in model.parameters()) == layer + c.vocab_size * 896 + 896
