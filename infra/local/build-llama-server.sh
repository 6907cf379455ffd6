#!/usr/bin/env bash
# Build llama.cpp's llama-server (continuous batching, slots, prompt cache) from the llama.cpp source
# vendored in the llama-cpp-python sdist on PyPI: the only registry route to the server here.
# Only the llama-server target is built (about 5-10 min on 2 cores); the binary is cached under
# $PARLEY_CACHE so a fresh clone on the same machine reuses it.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${PARLEY_CACHE:-$HOME/.cache/parley}"
# Native code for this CPU, less Intel AMX: on a Sapphire Rapids VM (AMX in its CPU flags) ggml's AMX
# matrix kernel crashed the server (SIGSEGV in ggml_backend_amx_mul_mat) at the first decode of the model,
# while the AVX-512 kernels serve it. The flavour names the cache folder, so an earlier AMX build is not reused.
FLAVOUR="native-noamx"
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
OUT="$CACHE/llama-server-$VERSION-$FLAVOUR"
BIN="$OUT/bin/llama-server"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi

PY="${PYTHON:-python3}"
mkdir -p "$CACHE/src"
SDIST="$CACHE/src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  echo "[llama] downloading llama-cpp-python $VERSION sdist" >&2
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$CACHE/src" "llama-cpp-python==$VERSION" >&2
fi
SRC="$CACHE/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$CACHE/src"
BUILD="$CACHE/src/build-$VERSION-$FLAVOUR"
echo "[llama] configuring llama-server" >&2
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
echo "[llama] building llama-server (several minutes on 2 cores)" >&2
cmake --build "$BUILD" --target llama-server -j "${BUILD_JOBS:-2}" >&2
mkdir -p "$OUT/bin"
cp "$BUILD/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
