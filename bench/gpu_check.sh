#!/usr/bin/env bash
# The GPU check, in one call on a GPU machine (CUDA, nvcc, CMake, PyTorch's Python; no internet; at most
# 64 MiB carried beyond the tracked tree):
#
#   here:           bash bench/gpu_check.sh prepare   # writes .gpu-check/ (ignored by git, under 64 MiB)
#   on the machine: bash bench/gpu_check.sh run       # carry [".gpu-check"]; JSON in $OUT/gpu_check.json
#
# `prepare` packs llama.cpp's source (the same llama-cpp-python sdist the local build uses), the bundled
# SmolLM2-135M cut to its first 8 blocks to carry (bench/gpu_model.py: the check is of the serving path),
# and the wheels of httpx, which Parley's engine client needs. `run` builds llama-server with CUDA for the
# machine's GPU (flash-attention kernels left out: they are most of the build's time), serves the model with
# 64 slots, and drives Parley's engine client against it (bench/gpu_engine.py): a stream, a continuation, a
# cancel that frees its slot while every other slot is busy, 64 concurrent streams through the coalescer.
# The CPU build answers the same script here: bash bench/gpu_check.sh local
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu-check
CACHE="${PARLEY_CACHE:-$HOME/.cache/parley}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
SLOTS="${SLOTS:-64}"
PORT="${PORT:-8089}"

serve_and_check() {  # $1: llama-server, $2: model, $3: where the JSON goes, $4: python with httpx
  local server=$1 model=$2 out=$3 py=$4 log
  log="$(dirname "$out")/gpu_check_server.log"
  "$server" -m "$model" --host 127.0.0.1 --port "$PORT" -np "$SLOTS" -c $((SLOTS * 2560)) --cont-batching \
    --alias gpu-check ${NGL:+-ngl "$NGL"} >"$log" 2>&1 &
  local pid=$!
  trap 'kill $pid 2>/dev/null || true' RETURN
  for _ in $(seq 1 120); do
    curl -fs "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { tail -20 "$log" >&2; return 1; }
    sleep 1
  done
  PYTHONPATH=. "$py" bench/gpu_engine.py --url "http://127.0.0.1:$PORT" --slots "$SLOTS" ${CHECK_ARGS:-} \
    | tee "$out"
}

case "${1:-}" in
  prepare)
    rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
    bash infra/local/build-llama-server.sh >/dev/null  # unpacks the sdist and builds the CPU tools' base
    SRC="$CACHE/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
    echo "[gpu-check] packing llama.cpp's source" >&2
    tar cJf "$CARRY/llama.cpp.tar.xz" -C "$SRC" --exclude=tools/ui --exclude='*.gguf' \
      CMakeLists.txt cmake ggml src include common tools vendor LICENSE
    echo "[gpu-check] the model, cut to its first 8 blocks" >&2
    MODEL=$(.venv/bin/python -c "from runtime.llama_server import model_path; print(model_path())")
    .venv/bin/python bench/gpu_model.py "$SRC/gguf-py" "$MODEL" "$CARRY/model.gguf" --blocks 8 >&2
    .venv/bin/python -m pip download -q --only-binary :all: -d "$CARRY/wheels" httpx >&2
    du -sh "$CARRY" "$CARRY"/* >&2
    ;;
  run)
    OUT="${OUT:-$PWD}"
    WORK=$(mktemp -d)
    tar xJf "$CARRY/llama.cpp.tar.xz" -C "$WORK"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" || true
    echo "[gpu-check] $(date +%T) building llama-server with CUDA" >&2
    cmake -S "$WORK" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_FA=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF >"$OUT/gpu_check_build.log" 2>&1
    cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >>"$OUT/gpu_check_build.log" 2>&1
    echo "[gpu-check] $(date +%T) built; serving" >&2
    python3 -m venv --system-site-packages "$WORK/venv"
    "$WORK/venv/bin/pip" install -q --no-index --find-links "$CARRY/wheels" httpx
    NGL=99 serve_and_check "$WORK/build/bin/llama-server" "$CARRY/model.gguf" "$OUT/gpu_check.json" \
      "$WORK/venv/bin/python"
    ;;
  local)
    SLOTS=${LOCAL_SLOTS:-8} CHECK_ARGS="--streams 16 --tokens 32" serve_and_check \
      "$(bash infra/local/build-llama-server.sh)" "$CARRY/model.gguf" "${OUT:-/tmp}/gpu_check_cpu.json" \
      .venv/bin/python
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh prepare|run|local" >&2
    exit 2
    ;;
esac
