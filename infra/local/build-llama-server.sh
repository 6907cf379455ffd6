#!/usr/bin/env bash
# Build llama.cpp's llama-server (continuous batching, slots, prompt cache) from the llama.cpp source
# vendored in the llama-cpp-python sdist on PyPI: the only registry route to the server here.
# Only the llama-server target is built (about 5-10 min on 2 cores); the binary is cached under
# $PARLEY_CACHE so a fresh clone on the same machine reuses it.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${PARLEY_CACHE:-$HOME/.cache/parley}"
OUT="$CACHE/llama-server-$VERSION"
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
BUILD="$CACHE/src/build-$VERSION"
echo "[llama] configuring llama-server" >&2
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
echo "[llama] building llama-server (several minutes on 2 cores)" >&2
cmake --build "$BUILD" --target llama-server -j "${BUILD_JOBS:-2}" >&2
mkdir -p "$OUT/bin"
cp "$BUILD/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
