"""pyproject.toml declares ranges; constraints.txt pins the tested set inside them; the Makefile installs with it."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TORCH = "2.13.0"  # the local CPU wheel the Makefile installs first


def _declared() -> list[tuple[str, Requirement]]:
    rows = [("dependencies", Requirement(r)) for r in PROJECT["dependencies"]]
    for extra, reqs in PROJECT["optional-dependencies"].items():
        rows += [(f"extra {extra}", Requirement(r)) for r in reqs]
    return rows


def _pins() -> dict[str, Requirement]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req
    return pins


DECLARED = _declared()
PINS = _pins()
IDS = [f"{where}:{req.name}" for where, req in DECLARED]


@pytest.mark.parametrize(("where", "req"), DECLARED, ids=IDS)
def test_declared_as_a_range(where: str, req: Requirement) -> None:
    exact = [str(s) for s in req.specifier if s.operator in ("==", "===")]
    assert not exact, f"{req.name} ({where}) is pinned with {exact}: declare a range, pin it in constraints.txt"
    assert any(s.operator in (">=", ">", "~=") for s in req.specifier), f"{req.name} ({where}) has no lower bound"


@pytest.mark.parametrize(("where", "req"), DECLARED, ids=IDS)
def test_pin_inside_the_declared_range(where: str, req: Requirement) -> None:
    name = canonicalize_name(req.name)
    if name not in PINS:
        assert where == "extra vllm", f"{req.name} ({where}) has no pin in constraints.txt"
        return
    pin = PINS[name]
    (spec,) = pin.specifier
    assert spec.operator == "==", f"{req.name}: constraints.txt has {pin}, not an exact pin"
    assert req.specifier.contains(Version(spec.version), prereleases=True), (
        f"{req.name}: constraints.txt pins {spec.version}, outside {req.specifier} ({where})"
    )


def test_constraints_pin_every_line_exactly() -> None:
    for name, pin in PINS.items():
        assert [s.operator for s in pin.specifier] == ["=="], f"{name}: {pin} is not name==version"
    assert "creditrl" not in PINS, "creditrl: the package itself is not a constraint"
    assert not re.search(r"^\s*-e\b", (ROOT / "constraints.txt").read_text(), re.M), "an editable line in constraints"


def test_constraints_pin_torch() -> None:
    assert "torch" in PINS, "torch: no pin in constraints.txt"
    assert str(PINS["torch"].specifier) == f"=={TORCH}", f"torch: constraints.txt has {PINS['torch']}, not {TORCH}"


def test_makefile_installs_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert stamp, "Makefile: no $(STAMP) install recipe"
    assert "constraints.txt" in stamp.group(1).split(), "Makefile: the install stamp does not depend on constraints.txt"
    recipe = stamp.group(2).splitlines()
    torch = [line for line in recipe if re.search(r"pip install .*\btorch==", line)]
    assert torch and f"torch=={TORCH}" in torch[0], f"torch: the Makefile does not install torch=={TORCH} first"
    package = [line for line in recipe if re.search(r"pip install .*-e ", line)]
    assert package, "creditrl: no editable install line in the Makefile's install recipe"
    assert "-c constraints.txt" in package[0], f"creditrl: {package[0].strip()!r} does not use -c constraints.txt"
    assert recipe.index(torch[0]) < recipe.index(package[0]), "torch: installed after the package, not first"
