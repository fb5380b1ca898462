#!/usr/bin/env bash
# One GPU session: the GPU checks a lent device can run, each bounded in time, results under $OUT.
# The device's image has torch with CUDA but not every creditrl dependency: the missing ones travel as
# wheels in .whl/ (made by benchmarks/gpu_wheels.sh: transformers, trl, datasets, pydantic, math-verify
# and their own needs at constraints.txt's versions) and go to /tmp/site, ahead of the image's packages.
#   bash benchmarks/gpu_wheels.sh; OUT=<dir> bash benchmarks/gpu_session.sh   (the second on the GPU machine)
# Then, here: python benchmarks/gpu_report.py --runs <the files it wrote> writes docs/results/gpu.md.
# CHECKS picks the checks (default: all). Issue 62's session, about 10 minutes of device time:
#   CHECKS="gpu_compiled_decode gpu_decode_profile gpu_realsize" OUT=<dir> bash benchmarks/gpu_session.sh
# gpu_compiled_decode runs first: its compilations fill inductor's on-disk cache, which gpu_realsize's
# creditrl side (policy.engine=auto: compiled on CUDA) then reads for the same buckets.
set -u
OUT=${OUT:-runs/gpu}
CHECKS=${CHECKS:-gpu_check gpu_compiled_decode gpu_decode_profile gpu_train_check gpu_realsize}
mkdir -p "$OUT"
{
  date -u +%FT%TZ
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 --version
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|numba|numpy|pyarrow|fsspec|accelerate|huggingface|vllm|trl|datasets) "
} > "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >> "$OUT/env.txt" 2>&1 || { echo "wheel install failed"; cat "$OUT/env.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 CREDITRL_CACHE=/tmp/creditrl-cache TOKENIZERS_PARALLELISM=false
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'trl', trl.__version__)" >> "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
run() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  case " $CHECKS " in *" $name "*) ;; *) return 0 ;; esac
  local began=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: rc $? in $((SECONDS - began)) s"
  tail -n 6 "$OUT/$name.log"
}
run gpu_check 60 python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.json"
run gpu_compiled_decode 250 python3 benchmarks/gpu_compiled_decode.py --lengths 1024 256 --out "$OUT/gpu_compiled_decode.json"
run gpu_decode_profile 80 python3 benchmarks/gpu_decode_profile.py --out "$OUT/gpu_decode_profile.json"
run gpu_train_check 170 python3 benchmarks/gpu_train_check.py --device cuda --out "$OUT/gpu_train_check.json"
run gpu_realsize 250 python3 benchmarks/gpu_realsize.py --lengths 1024 256 --iterations 2 2 --out "$OUT/gpu_realsize.json"
