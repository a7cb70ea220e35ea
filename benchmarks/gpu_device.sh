#!/usr/bin/env bash
# #43's accelerator check, prepared for a GPU machine lent to a session (the workplace's device
# tool runs one command there, in a copy of this checkout, with what `carry` names):
#
#   bash benchmarks/gpu_device.sh fetch   # here: the wheels the device's Python lacks, in .whl/
#   bash benchmarks/gpu_device.sh run     # there (carry [".whl"]): the check; its output in $OUT
#
# The device image's python3 (3.12) holds torch with CUDA, pandas, pyarrow and nvidia-ml-py,
# but not pydantic, which the config and the trainer's config model need, and other versions
# of the trainer's stack than requirements.lock pins: those come as wheels of the lock's
# versions, installed apart (--target) and first on PYTHONPATH, so the trainer there is the
# trainer here. Nothing is downloaded there (it reaches nothing outside). `run` prints the
# board (nvidia-smi), then `benchmarks/gpu_local.py --repeat 3`: the trainer with the
# gpu_local model on the CPU and on the GPU, tokens/s and their ratio, and the training
# steps' energy, energy per token, power and utilisation from NVML. A few minutes there; its
# figures go in docs/performance.md.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=(pydantic pydantic_core pydantic-settings python-dotenv annotated-types
        typing-inspection typing_extensions transformers peft tokenizers huggingface_hub
        accelerate safetensors)

pinned() {  # $1: a package name -> its line in requirements.lock (name==version)
  local want line
  want=$(echo "$1" | tr '_' '-' | tr '[:upper:]' '[:lower:]')
  while IFS= read -r line; do
    if [ "$(echo "${line%%==*}" | tr '_' '-' | tr '[:upper:]' '[:lower:]')" = "$want" ]; then
      echo "$line"
      return 0
    fi
  done < "$ROOT/requirements.lock"
  echo "gpu_device.sh: $1 is not pinned in requirements.lock" >&2
  return 1
}

case "${1:-}" in
  fetch)
    cd "$ROOT"
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    mkdir -p .whl
    specs=()
    for name in "${WHEELS[@]}"; do specs+=("$(pinned "$name")"); done
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "${specs[@]}"
    du -sh .whl
    ;;
  run)
    cd "$ROOT"
    out=${OUT:-$ROOT/.gpu-check}
    mkdir -p "$out"
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$ROOT" PYTHONUNBUFFERED=1
    nvidia-smi | tee "$out/nvidia-smi.txt"
    python3 benchmarks/gpu_local.py --repeat 3 2>&1 | tee "$out/gpu_local.txt"
    ;;
  *)
    sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
