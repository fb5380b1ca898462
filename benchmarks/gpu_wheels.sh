#!/usr/bin/env bash
# Download into .whl/ the wheels that benchmarks/gpu_session.sh installs on a GPU machine that has torch
# with CUDA but no package index (creditrl's dependencies its image lacks, at constraints.txt's versions;
# the image's huggingface_hub, accelerate, pyarrow, numba and tokenizers serve as they are).
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]   # the GPU machine's Python, default 3.12
set -eu
py=${1:-3.12}
pkgs="transformers trl datasets dill multiprocess pydantic pydantic_core annotated-types typing-inspection
typing_extensions math-verify latex2sympy2_extended antlr4-python3-runtime"
mkdir -p .whl
for name in $pkgs; do
  pin=$(grep -i -E "^${name//[-_]/[-_]}==" constraints.txt) || { echo "constraints.txt has no pin for $name" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$pin"
done
du -sh .whl
