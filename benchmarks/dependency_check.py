"""Resolve the declared dependency ranges in a fresh venv: alone, and with the vllm extra.

    .venv/bin/python benchmarks/dependency_check.py [--python python3.11] [--results PAGE]

In a temporary ``python3.11 -m venv`` (pip upgraded, then ``torch==2.13.0`` installed first, as
``make install`` does: the local CPU wheel through this machine's pip configuration), runs
``pip install --dry-run --report REPORT.json .`` and the same for ``'.[vllm]'``: the ranges of
pyproject.toml alone, no constraints file (not constraints.txt, nor the machine-wide one of pip's
configuration). The package is resolved from a copy of pyproject.toml, README.md and src/, so the
build writes nothing into the working tree. ``--use-feature=fast-deps`` reads each wheel's metadata
by HTTP range requests instead of downloading it (vllm's CUDA set is several GB). Prints, for each
direct dependency, the range declared, the pin in constraints.txt and the version each resolve
picks (what the venv already has where pip keeps it); exits 1 if a resolve fails.
"""

import argparse
import ast
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from creditrl.experiments.report import printed_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # installed first, as the Makefile does (the local CPU wheel)
TARGETS = {"ranges alone": ".", "with the vllm extra": ".[vllm]"}
VLLM_SET = ("vllm", "torch", "transformers", "numba", "llvmlite", "numpy")  # the tested vLLM set's line


def declared(pyproject: Path = ROOT / "pyproject.toml") -> list[tuple[str, Requirement]]:
    """(where, requirement) for ``dependencies`` then each extra, in the file's order."""
    project = tomllib.loads(pyproject.read_text())["project"]
    rows = [("", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        rows += [(extra, Requirement(r)) for r in reqs]
    return rows


def pins(constraints: Path = ROOT / "constraints.txt") -> dict[str, str]:
    """{canonical name: version} of every ``name==version`` line of a pip constraints file."""
    out = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    return out


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True)


def _installed(python: Path) -> dict[str, str]:
    done = _pip(python, "list", "--format=json")
    done.check_returncode()
    return {canonicalize_name(p["name"]): p["version"] for p in json.loads(done.stdout)}


def _copy_package(dest: Path) -> Path:
    """pyproject.toml, README.md (and LICENSE where present) and src/, without caches or egg-info."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    return dest


def ranges_only_env(python: Path) -> dict[str, str]:
    """The environment for a resolve by the declared ranges alone: this machine's pip configuration
    (indexes, find-links; ``pip config list``) as ``PIP_*`` variables, less any ``constraint``, and no
    configuration file read (``PIP_CONFIG_FILE=/dev/null``: an empty ``PIP_CONSTRAINT`` would not
    override a file's)."""
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}
    listed = _pip(python, "config", "list")
    listed.check_returncode()
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        option = key.rpartition(".")[2]
        if key.startswith(":env:") or option == "constraint" or not value:
            continue
        env.setdefault("PIP_" + option.upper().replace("-", "_"), ast.literal_eval(value))
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def resolve(
    python: Path, package: Path, target: str, report: Path, env: dict[str, str]
) -> tuple[bool, dict[str, str], str]:
    """(succeeded, {name: version} the venv would hold afterwards, pip's last lines on failure)."""
    args = ["install", "--dry-run", "--quiet", "--use-feature=fast-deps", "--report", str(report), target]
    _log(f"resolving pip {' '.join(args[:-3])} --report {report.name} '{target}' ...")
    done = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=env, cwd=package)
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line and not line.startswith("WARNING")]
        tail = "\n".join(lines[-20:])
        return False, {}, tail
    after = _installed(python)
    for item in json.loads(report.read_text())["install"]:
        after[canonicalize_name(item["metadata"]["name"])] = item["metadata"]["version"]
    return True, after, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="python3.11", help="the interpreter the fresh venv is made from")
    ap.add_argument("--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)")
    args = ap.parse_args()
    with printed_results(args.results, "Dependencies: the declared ranges, resolved"):
        failed = _run(args)
    if failed:
        sys.exit(f"resolve failed: {', '.join(failed)}")


def _run(args: argparse.Namespace) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="creditrl-deps-") as tmp:
        tmp = Path(tmp)
        _log(f"{args.python} -m venv {tmp / 'venv'}")
        subprocess.run([args.python, "-m", "venv", str(tmp / "venv")], check=True)
        python = tmp / "venv" / "bin" / "python"
        _pip(python, "install", "--quiet", "--upgrade", "pip").check_returncode()
        _log(f"pip install {TORCH}")
        _pip(python, "install", "--quiet", TORCH).check_returncode()
        info = subprocess.run(
            [str(python), "-c", "import platform, pip; print(platform.python_version(), pip.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        base = _installed(python)
        package = _copy_package(tmp / "creditrl")
        env = ranges_only_env(python)
        results = {
            what: resolve(python, package, target, tmp / f"report{i}.json", env)
            for i, (what, target) in enumerate(TARGETS.items())
        }

    print(
        f"Architecture {platform.machine()} (`uname -m`), Python {info[0]} "
        f"(a fresh `{args.python} -m venv`), pip {info[1]}."
    )
    print()
    print(
        f"Each resolve is `pip install --dry-run --report REPORT.json TARGET` in that venv after "
        f"`pip install {TORCH}` (here torch {base.get('torch', '?')}), by pyproject.toml's ranges alone: "
        "no `-c constraints.txt` and none of pip's configured constraints (this machine's caps torch at "
        "the releases on its disk), with its indexes (PyPI, plus the local wheels of `pip config list`). "
        "A version is what the venv would hold afterwards: one pip keeps as installed shows as installed."
    )
    print()
    for what, target in TARGETS.items():
        ok, after, tail = results[what]
        if ok:
            changed = sum(1 for name, version in after.items() if base.get(name) != version)
            print(f"- `{target}` ({what}): resolved; {changed} packages to install or change.")
        else:
            print(f"- `{target}` ({what}): **failed**; pip's last lines:")
            print()
            print("```\n" + tail + "\n```")
    ok, vllm_set, _ = results["with the vllm extra"]
    if ok:
        tested = ", ".join(f"{name} {vllm_set.get(name, '-')}" for name in VLLM_SET)
        print(f"- The vLLM set: {tested}.")
    print()

    lock = pins()
    alone, with_vllm = results["ranges alone"][1], results["with the vllm extra"][1]
    print("| package | extra | range declared | lock pin | resolved, ranges alone | resolved, with the vllm extra |")
    print("|---|---|---|---|---|---|")
    for extra, req in declared():
        if extra not in ("", "vllm"):
            continue  # neither resolve installs the test/bench/trackers/ray extras
        name = canonicalize_name(req.name)
        spec = ",".join(sorted(map(str, req.specifier), key=lambda s: not s.startswith(">")))  # lower bound first
        print(
            f"| {req.name} | {extra or '-'} | `{spec}` | {lock.get(name, '-')} "
            f"| {alone.get(name, '-')} | {with_vllm.get(name, '-')} |"
        )
    return [what for what, (ok, _, _) in results.items() if not ok]


if __name__ == "__main__":
    main()
