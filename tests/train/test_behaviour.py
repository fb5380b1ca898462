"""Same behaviour as before the redesign: each case of ``tests/fixtures/behaviour/cases.py`` run
now writes the metrics rows the code before it wrote (``generate.py`` made the fixtures).

The runs start from kept SFT starts (``tests/fixtures/behaviour/starts``, one per SFT recipe, put
into a fresh cache), not from an SFT trained in the test: the same recipe trains other weights on
another kind of CPU (the float kernels differ in rounding, and 200 optimizer steps carry that into
which tokens the start samples), while RL from the same weights samples the same tokens.

Counts, lengths, accuracies and every other integer or string must be equal. Floats must agree to
1e-4 relative or 1e-6 absolute: the spread of the same runs with every float library capped at
AVX2 and at the x86-64 baseline (``.ci/cpu-kind``, ``make test-cpu-kinds``) was at most 3e-6
relative for values over 1e-3 and 1.4e-8 absolute beyond 1e-4 relative (2026-12-05, these cases),
and no integer differed. The fixtures were written through the HF modules' response forward, so
these runs take it too (``policy.forward=hf``); the packed forward (the default) is held to the
same rows within the same tolerance (its products sum in another order).
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
# the held-out per-problem outcomes (a packed string), the rows' real prompt tokens, the share of groups
# with zero reward spread and the update's token positions, newer than the fixtures
ADDED_LATER = ("eval/correct", "tokens/prompt", "reward/zero_spread_groups", "update/positions")


def _rows(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_metrics_match_the_pre_redesign_fixtures(
    name: str, cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import creditrl.rollout.batch as batch

    monkeypatch.setattr(batch, "packed_reason", lambda *a: "policy.forward=hf")  # the HF pass, as the fixtures
    assert _compare(name, generate.run_case(name, tmp_path)) > 0


@pytest.mark.slow
def test_the_packed_forward_keeps_the_metrics_to_float_rounding(cache, tmp_path: Path) -> None:
    assert _compare("arith_10", generate.run_case("arith_10", tmp_path)) > 0


REL, ABS = 1e-4, 1e-6  # float tolerance: 30x the spread measured across CPU kinds (see above)


def _compare(name: str, got: dict[str, str]) -> int:
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
                if isinstance(value, float):
                    assert a[key] == pytest.approx(value, rel=REL, abs=ABS), (arm, b["iteration"], key)
                else:  # counts, iterations, strings: no rounding to allow for
                    assert a[key] == value, (arm, b["iteration"], key)
                compared += 1
    return compared
