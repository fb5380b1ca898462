"""Same behaviour as before the redesign: each case of ``tests/fixtures/behaviour/cases.py`` run
now writes the metrics rows the code before it wrote (``generate.py`` made the fixtures).

Every value but ``time/*`` must be equal, or within 1e-6 relative (the run-to-run float rounding
of the rollout log-probs), in a fresh cache (the SFT warm start is trained again). The fixtures
were written through the HF modules' response forward, so these runs take it too
(``policy.forward=hf``); the packed forward (the default) is held to the same rows within its
stated float rounding, 1e-4 relative or 1e-8 absolute (its products sum in another order).

The float kernels torch picks depend on the CPU, and so do the trained weights: where the CPU's
kind (``torch.backends.cpu.get_cpu_capability()``) has a folder of its own (``AVX2/``), a case's
fixtures there are used -- written by the same code before the redesign (``generate.py`` at
commit b1076d7, run from a git worktree) on a CPU of that kind; ``demo_quick``'s rows are the
same on both kinds.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "behaviour"
ROOT = FIXTURES.parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"behaviour_{name}", FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _load("cases").CASES
generate = _load("generate")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(tmp_path_factory.mktemp("cache")))
        mp.chdir(ROOT)
        generate.seed_cache(list(CASES))
        yield


# counts of failed user-function calls (reward and held-out checks), newer than the fixtures
COUNTS_ADDED_LATER = ("reward/errors/", "reward/timeouts/", "eval/errors", "eval/timeouts", "value/check_")
# the held-out per-problem outcomes (a packed string) and the rows' real prompt tokens, newer than the fixtures
ADDED_LATER = ("eval/correct", "tokens/prompt")


def _rows(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_metrics_match_the_pre_redesign_fixtures(
    name: str, cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import creditrl.rollout.batch as batch

    monkeypatch.setattr(batch, "packed_reason", lambda *a: "policy.forward=hf")  # the HF pass, as the fixtures
    assert _compare(name, generate.run_case(name, tmp_path), rel=1e-6, abs=1e-12) > 0


@pytest.mark.slow
def test_the_packed_forward_keeps_the_metrics_to_float_rounding(cache, tmp_path: Path) -> None:
    assert _compare("arith_10", generate.run_case("arith_10", tmp_path), rel=1e-4, abs=1e-8) > 0


def _compare(name: str, got: dict[str, str], *, rel: float, abs: float) -> int:
    """Assert every fixture value of ``name`` is matched in ``got``; returns how many were compared."""
    want = {p.stem: p.read_text() for p in sorted((FIXTURES / name).glob("*.jsonl"))}
    assert sorted(got) == sorted(want)
    compared = 0
    for arm, text in want.items():
        new, old = _rows(got[arm]), _rows(text)
        assert [r["iteration"] for r in new] == [r["iteration"] for r in old], arm
        for a, b in zip(new, old):
            # the per-function counts came later (COUNTS_ADDED_LATER): they must be 0
            later = {k for k in set(a) - set(b) if k.startswith(COUNTS_ADDED_LATER)}
            assert all(a[k] == 0 for k in later), (arm, b["iteration"], {k: a[k] for k in later})
            later |= {k for k in set(a) - set(b) if k in ADDED_LATER}
            assert sorted(set(a) - later) == sorted(b), (arm, b["iteration"], (set(a) - later) ^ set(b))
            for key, value in b.items():
                assert a[key] == pytest.approx(value, rel=rel, abs=abs), (arm, b["iteration"], key)
                compared += 1
    return compared
