#!/usr/bin/env bash
# GPU check: the paper's light and mixed mixes under every strategy a comparison runs (the
# control plane's strategy registry: temporal, isolation, sharing, vres_greedy, vres_sync) on
# this host's GPU, profiled, planned, measured and scored with workers/ and
# controlplane/planning/ only (no Django, Celery or Redis; no network).
#
#   benchmarks/gpu_check.sh [--wheels DIR] [gpu_check.py options]
#   OUT=/some/dir benchmarks/gpu_check.sh --budget 150      # also writes $OUT/gpu_check.json
#
# Prints the GPU (nvidia-smi) and the Python packages, then runs benchmarks/gpu_check.py with
# its defaults (cuda-mps backend, 150 s of profiling, everything within 420 s) and any options
# given; `benchmarks/gpu_check.py --help` lists them. --wheels DIR first installs the wheels in
# DIR (pydantic and its dependencies, when the host lacks them) into a temporary folder put on
# PYTHONPATH, offline (--no-index --no-deps). The interpreter is $PYTHON, else the checkout's
# .venv, else python3. Exit code: the Python script's (0 ok, 1 a failure, 2 nothing could run,
# 3 stopped by the time limit).
#
# The wheels, fetched on a machine with network access for the GPU host's Python (3.12 here)
# (docs/deployment.md, "gpu_check.sh on a bare GPU host"):
#
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --implementation cp --abi cp312 -d wheels \
#       pydantic pydantic-core annotated-types typing-extensions typing-inspection \
#       safetensors nvidia-ml-py
#   # copy wheels/ to the GPU host, then:
#   OUT=/tmp/out benchmarks/gpu_check.sh --wheels ./wheels
#
# --no-deps installs exactly what the folder holds: pydantic needs pydantic-core (compiled: hence
# --platform and --abi), annotated-types, typing-extensions and typing-inspection.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

wheels=""
if [[ "${1:-}" == "--wheels" ]]; then
  wheels=${2:?"--wheels needs a folder of .whl files"}
  shift 2
fi

if [[ -n "${PYTHON:-}" ]]; then
  py=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  py=.venv/bin/python
else
  py=python3
fi

echo "== gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), python $("$py" -c 'import sys; print(sys.version.split()[0])' 2>&1) ($py)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,compute_mode,utilization.gpu \
    --format=csv 2>&1 | sed 's/^/   /'
else
  echo "   nvidia-smi: not found (no NVIDIA driver utilities on PATH)"
fi
if mps=$(command -v nvidia-cuda-mps-control 2>/dev/null); then
  echo "   MPS control: $mps"
else
  echo "   MPS control: nvidia-cuda-mps-control not on PATH (set MTFL_MPS_CONTROL to it)"
fi

if [[ -n "$wheels" ]]; then
  site=$(mktemp -d -t mtfl-gpu-check-site-XXXXXX)
  if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$wheels"/*.whl; then
    echo "gpu_check: FAILED: could not install the wheels in $wheels"
    exit 2
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "   wheels from $wheels installed into $site (on PYTHONPATH)"
fi

# Versions without importing anything heavy (torch takes seconds to import); the script imports
# them for real and stops at once, in one line, if one is missing.
"$py" - <<'EOF' || exit 2
import importlib.metadata as md
import importlib.util

found, missing = [], []
for module, dist in (("pydantic", "pydantic"), ("safetensors", "safetensors"), ("numpy", "numpy"), ("scipy", "scipy"),
                     ("sklearn", "scikit-learn"), ("torch", "torch"), ("torchvision", "torchvision"),
                     ("pynvml", "nvidia-ml-py")):
    if importlib.util.find_spec(module) is None:
        missing.append(dist)
        continue
    try:
        found.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        found.append(f"{dist} (version unknown)")
print("   packages: " + ", ".join(found) + (f"; MISSING: {', '.join(missing)}" if missing else ""))
EOF

# exec: a SIGTERM to this script reaches the check, which stops its processes and the MPS daemon.
export PYTHONUNBUFFERED=1
exec "$py" benchmarks/gpu_check.py "$@"
