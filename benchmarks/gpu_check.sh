#!/usr/bin/env bash
# The GPU check of docs/performance.md ("On a GPU"), as one prepared script for a lent GPU machine.
#
# 1. Makes llama-cpp-python a CUDA build unless it already is one: a source build from the sdist
#    (pip's cache, or LLAMA_SDIST=/path/llama_cpp_python-<version>.tar.gz when the machine has no
#    registry), for the GPU's compute capability (CUDA_ARCH, default 90: H100/H200).
# 2. Runs benchmarks/gpu_throughput.py with the largest bundled model (MODEL, default
#    qwen2.5-1.5b) on the CPU and offloaded to the GPU (@n_gpu_layers=-1), side by side in one
#    process: SteerEval scenarios per minute and LLM-probe decisions per second, with ratios.
#    The goal it checks: at least 100 SteerEval scenarios per minute on one H200.
#
# Run from the repository root, in its venv:  bash benchmarks/gpu_check.sh
# Never needed for CI: nothing in the test suite needs a GPU.
set -euo pipefail

MODEL="${MODEL:-qwen2.5-1.5b}"
CUDA_ARCH="${CUDA_ARCH:-90}"
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
log="$OUT/gpu_check-$(date +%Y%m%d-%H%M%S).txt"

command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this machine has no NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$log"

gpu_build() {
    python - <<'PY'
import sys
import llama_cpp
sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)
PY
}

if ! gpu_build; then
    echo "gpu_check: building llama-cpp-python with CUDA for sm_${CUDA_ARCH} (about 5 minutes on 16 cores)" | tee -a "$log"
    version="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
    source="${LLAMA_SDIST:-llama-cpp-python==${version}}"
    # Flash-attention kernels for every head size take most of the build: off, as measured before.
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH} -DGGML_CUDA_FA=OFF" \
        pip install --no-deps --force-reinstall --no-binary llama-cpp-python "$source" 2>&1 | tail -3 | tee -a "$log"
    gpu_build || { echo "gpu_check: the build has no GPU offload" | tee -a "$log" >&2; exit 1; }
fi

# llama.cpp's CUDA library must load before numpy on some machines (a segfault in model loading
# otherwise: docs/performance.md, "On a GPU").
cuda_lib="$(python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib' / 'libggml-cuda.so')")"
export LD_PRELOAD="${cuda_lib}${LD_PRELOAD:+:$LD_PRELOAD}"

cd benchmarks
python gpu_throughput.py --llms "${MODEL},${MODEL}@n_gpu_layers=-1" \
    --users "${USERS:-2}" --tags "${TAGS:-Horror,Comedy}" --pool-size "${POOL:-100}" \
    --history-len 50 --agents 16 --rounds 4 2>&1 | tee -a "../$log"
echo "gpu_check: written to $log"
