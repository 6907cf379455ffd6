#!/usr/bin/env bash
# Build Parley's image on a machine with no container daemon and no registry: buildah (daemonless, vfs
# storage, chroot isolation) builds the Dockerfile on two base images assembled here from Debian's own
# packages with debootstrap (bookworm: Python 3.11, Node.js 18), passed as NODE_BASE and PYTHON_BASE. Then it
# runs the image's entrypoints: `parley --version`, and each deployable's modules imported as its command
# would. Needs root, buildah and debootstrap (apt-get install buildah debootstrap). Published images are
# built from the Dockerfile's pinned bases instead (deploy/README.md).
#   bash infra/image/build-here.sh [tag]      # default tag: the version in pyproject.toml
set -euo pipefail
cd "$(dirname "$0")/../.."
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
version=$(python3 -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")
tag=${1:-$version}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

base() {  # base NAME PACKAGES SETUP [ENV]: a Debian bookworm root with PACKAGES, then SETUP run inside it
  local name=$1 packages=$2 setup=$3 env=${4:-LANG=C.UTF-8} c m
  if buildah inspect --type image "$name" >/dev/null 2>&1; then
    echo "base $name: built before"
    return
  fi
  c=$(buildah from scratch)
  m=$(buildah mount "$c")
  echo "base $name: debootstrap bookworm with $packages"
  debootstrap --variant=minbase --include="$packages" bookworm "$m" "$mirror" >/tmp/debootstrap-$$.log
  buildah run "$c" -- sh -c "$setup; apt-get clean; rm -rf /var/lib/apt/lists/*"
  buildah config --env LANG=C.UTF-8 --env "$env" --cmd '["sh"]' "$c"
  buildah commit --quiet "$c" "$name" >/dev/null
  buildah rm "$c" >/dev/null
}

# What python:3.11-slim gives the Dockerfile: `python` and a pip that installs into the system.
base localhost/parley-base/python:bookworm "python3,python3-pip,ca-certificates" \
  "ln -sf /usr/bin/python3 /usr/local/bin/python && printf '[global]\nbreak-system-packages = true\n' > /etc/pip.conf"
# npm's many node-* packages fail debootstrap's own configure pass; apt inside the root installs them.
base localhost/parley-base/node:bookworm "ca-certificates" \
  "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null" \
  NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt

echo "image localhost/parley:$tag"
# The host's CA bundle is lent to the build's steps (a registry behind an egress proxy with its own CA is
# reached as the host reaches it); the image keeps its own bundle.
buildah bud --quiet --layers=false -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  --build-arg NODE_BASE=localhost/parley-base/node:bookworm \
  --build-arg PYTHON_BASE=localhost/parley-base/python:bookworm \
  -t "localhost/parley:$tag" .

echo "entrypoints"
c=$(buildah from "localhost/parley:$tag")
trap 'buildah rm "$c" >/dev/null' EXIT
buildah run --user 10001:10001 "$c" -- parley --version
# Each deployable's modules, imported as its command would (the commands themselves need Kafka), and the
# model files the image carries: the GGUF the CPU engines copy, the safety encoder.
for module in api.server processors.moderate_prompt processors.schedule_run processors.persist_turn \
  processors.meter_usage processors.remember inference.worker registry.app storage.schema; do
  buildah run --user 10001:10001 "$c" -- python -c "import $module" && echo "  $module: imports"
done
buildah run --user 10001:10001 "$c" -- python -c \
  "from runtime.llama_server import model_path; from safety.encoder import model_dir; print('  models:', model_path().name, model_dir().name)"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "localhost/parley:$tag"
