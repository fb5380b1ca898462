"""The compiled engine's GPU check on the CPU: benchmarks/gpu_compiled_decode.py's plumbing (a 1-layer
Qwen2-0.5B-shaped model, dynamo's eager backend), gpu_report.py's section on hand-made results, and
gpu_session.sh's syntax and check selection."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_of_takes_medians_and_the_peak():
    decode = _script("gpu_compiled_decode")
    s = decode.summary_of([2.0, 1.0, 4.0], [10.0, 30.0, 20.0], tokens=1600, steps=100)
    assert s == {"s_per_call": 2.0, "calls": 3, "tokens_per_s": 800.0, "ms_per_step": 20.0, "peak_gpu_mb": 30.0}
    assert decode.summary_of([1.0], [None], tokens=10, steps=10)["peak_gpu_mb"] is None


def test_dry_run_on_the_cpu_feeds_the_report(tmp_path, monkeypatch):
    decode = _script("gpu_compiled_decode")
    out = tmp_path / "gpu_compiled_decode.json"
    argv = ["gpu_compiled_decode.py", "--device", "cpu", "--layers", "1", "--backend", "eager", "--precision", "fp32"]
    argv += ["--lengths", "6", "--repeats", "1", "--prompts", "2", "--group", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert decode.main() == 0
    result = json.loads(out.read_text())
    assert result["passed"] and result["auto_engine"] == "static"  # on the CPU auto keeps the static engine
    (p,) = result["points"]
    assert (p["length"], p["rows"]) == (6, 4)
    c, h = p["compiled"], p["hf_generate"]
    assert c["backend"] == "eager" and c["buckets"] == [[4, 64]]  # 4 rows; prompt + 5 fed tokens < 64 columns
    assert c["tokens_per_s"] == pytest.approx(4 * 6 / c["s_per_call"])
    assert p["ratio_compiled_vs_hf"] == pytest.approx(c["tokens_per_s"] / h["tokens_per_s"])
    section = "\n".join(_script("gpu_report").compiled_section(result, None))
    row = f"| 6 | 4 | {c['tokens_per_s']:,.0f} / {h['tokens_per_s']:,.0f} | **{p['ratio_compiled_vs_hf']:.2f}x** |"
    assert row in section
    assert "with the static engine." in section


def _hand_made(runs: Path) -> tuple[dict, dict]:
    decode = {
        "precision": "bf16",
        "auto_engine": "compiled",
        "model": {"shape": {"num_hidden_layers": 24}, "parameters": 358_000_000},
        "points": [
            {
                "length": 1024,
                "rows": 16,
                "compiled": {
                    "s_per_call": 4.0,
                    "calls": 2,
                    "tokens_per_s": 4096.0,
                    "ms_per_step": 3.906,
                    "peak_gpu_mb": 2048.0,
                    "first_call_s": 61.23,
                    "backend": "inductor",
                },
                "hf_generate": {
                    "s_per_call": 22.0,
                    "calls": 2,
                    "tokens_per_s": 744.7,
                    "ms_per_step": 21.48,
                    "peak_gpu_mb": 3072.0,
                },
                "ratio_compiled_vs_hf": 5.5,
            },
            {"length": 256, "error": "RuntimeError: out of graphs"},
        ],
    }
    profile = {
        "cases": [
            {
                "precision": "bf16",
                "eos": "reachable",
                "cudnn_attention": False,
                "s_per_call": 0.123,
                "steps": 32,
                "ms_per_step": 3.84,
                "top_ops": [{"op": "aten::mm", "calls": 96, "self_ms": 1.25, "cpu_ms": 0.5}],
            }
        ]
    }
    (runs / "gpu_compiled_decode.json").write_text(json.dumps(decode))
    (runs / "gpu_decode_profile.json").write_text(json.dumps(profile))
    sizes = json.loads((runs / "gpu_realsize.json").read_text())
    (runs / "gpu_realsize.json").write_text(json.dumps({**sizes, "engine": "compiled"}))
    return decode, profile


def test_report_renders_hand_made_results(tmp_path):
    report = _script("gpu_report")
    runs = tmp_path / "gpu"
    shutil.copytree(ROOT / "docs" / "results" / "gpu", runs)
    before = report.render(runs)
    assert "## The compiled decode engine" not in before and "its HF engine on CUDA" in before
    assert "- **`policy.engine=compiled`** (what `auto` runs on CUDA): tested on the CPU only" in before
    _hand_made(runs)
    page = report.render(runs)
    assert "| 1024 | 16 | 4,096 / 745 | **5.50x** | 3.91 / 21.48 | 2.0 / 3.0 | 61.2 (inductor) | 2 / 2 |" in page
    assert "| 256 | - | error: RuntimeError: out of graphs | | | | | |" in page
    assert "| bf16 | reachable | off | 0.123 | 32 | 3.84 | `aten::mm` 1.2 (96) |" in page
    assert "358M-parameter Qwen2-0.5B body (24 layers), float32 weights under bf16 autocast" in page
    assert "its compiled engine (`policy.engine=compiled`, CUDA graphs) on CUDA" in page
    assert "tested on the CPU only" not in page  # it ran: no longer listed as unverified
    # the new sections sit between the TRL table and the reading
    heads = re.findall(r"^## (.*)$", page, re.M)
    assert heads.index("A real-size model against TRL") + 1 == heads.index("The compiled decode engine")
    assert heads.index("The tiny model's decode by precision") + 1 == heads.index("Reading")


def test_session_script_parses_and_selects_checks(tmp_path):
    script = ROOT / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    runs = re.findall(r"^run (\S+) (\d+) ", text, re.M)
    names = [n for n, _ in runs]
    assert names.index("gpu_compiled_decode") < names.index("gpu_realsize")  # its compilations are cached first
    default = re.search(r"^CHECKS=\$\{CHECKS:-([^}]*)\}", text, re.M).group(1).split()
    assert sorted(default) == sorted(names)
    issue = re.search(r'CHECKS="([^"]*)" OUT=', text).group(1).split()
    assert sum(int(s) for n, s in runs if n in issue) <= 10 * 60  # the issue's session: about 10 minutes
