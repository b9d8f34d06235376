#!/usr/bin/env bash
# Stand-ins for the lab deployment's three base images, made from Debian packages, for a site
# whose Docker engine cannot reach Docker Hub (docs/deployment.md, "Without Docker Hub"):
#
#   mtfl-standin/python:3.11-slim  for python:3.11-slim  (Debian's python3 in a venv on PATH)
#   mtfl-standin/postgres:15       for postgres:16       (Debian's PostgreSQL 15, POSTGRES_* honoured)
#   mtfl-standin/redis:7           for redis:7           (Debian's redis-server 7.0)
#
# Debian bookworm is bootstrapped once (debootstrap --variant=minbase, imported with
# `docker import`), then each image is built from it with apt. The host's CA certificates go into
# the images, so pip and apt work where TLS is inspected. Then point the build at them, in .env:
#   PYTHON_IMAGE=mtfl-standin/python:3.11-slim
#   POSTGRES_IMAGE=mtfl-standin/postgres:15
#   REDIS_IMAGE=mtfl-standin/redis:7
#
# Usage: deploy/standins/build.sh [--force]   (as root; needs debootstrap and a running dockerd)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
suite=${STANDIN_SUITE:-bookworm}
mirror=${STANDIN_MIRROR:-http://deb.debian.org/debian}
base=mtfl-standin/debian:$suite
force=${1:-}

have() { docker image inspect "$1" >/dev/null 2>&1; }

if [ "$force" = "--force" ] || ! have "$base"; then
  command -v debootstrap >/dev/null || { echo "standins: debootstrap is missing: apt-get install debootstrap" >&2; exit 2; }
  rootfs=$(mktemp -d)
  trap 'rm -rf --one-file-system "$rootfs"' EXIT
  echo "standins: debootstrap $suite (minbase) from $mirror"
  debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >/dev/null
  # What a Debian container image leaves out: apt caches and docs it never needs.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$base" >/dev/null
  echo "standins: $base imported"
fi

# The host's extra CA certificates (a TLS-inspecting proxy's) into each image's trust store.
ctx=$(mktemp -d)
trap 'rm -rf --one-file-system "$ctx" ${rootfs:-}' EXIT
cp "$here"/*.Dockerfile "$here"/postgres-entrypoint.sh "$ctx"/
mkdir -p "$ctx/ca"
cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true

for role in python:3.11-slim postgres:15 redis:7; do
  name=${role%%:*}
  if [ "$force" = "--force" ] || ! have "mtfl-standin/$role"; then
    echo "standins: building mtfl-standin/$role"
    docker build --build-arg "BASE=$base" -f "$ctx/$name.Dockerfile" -t "mtfl-standin/$role" "$ctx" \
      >"$ctx/build.log" 2>&1 || { tail -30 "$ctx/build.log" >&2; echo "standins: building mtfl-standin/$role failed" >&2; exit 1; }
  fi
done
echo "standins: ready: mtfl-standin/python:3.11-slim mtfl-standin/postgres:15 mtfl-standin/redis:7"
