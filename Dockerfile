# The lab deployment's two images (docker-compose.yml; docs/deployment.md, "Images"):
#
#   --target controlplane  web app, control worker and Flower: mtfl-lab[deploy] (Django, gunicorn,
#                          Flower); torch from TORCH_INDEX_URL (a CPU-only index where the site
#                          reaches one: the control plane evaluates models on the CPU).
#   --target agent         a device agent (`mtfl-agent`): mtfl-lab[agent], no Django; torch from
#                          PyPI, whose Linux x86_64 wheels are CUDA builds (the driver and
#                          nvidia-cuda-mps-control come from the host through the NVIDIA
#                          container toolkit). The compose `cpu` profile runs it on the CPU.
#
# `docker build` downloads from PyPI; nothing is downloaded when a container starts.

# The base image, as a build argument, so a site without Docker Hub supplies its own
# (deploy/standins/build.sh makes one from Debian packages). It must give `python` (3.11 or newer)
# and `pip` on PATH, pip's trust store included.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MTFL_HOME=/var/lib/mtfl \
    ARTIFACT_ROOT=/var/lib/mtfl/artifacts \
    STATIC_ROOT=/app/static
WORKDIR /app
# The app user (uid 1000) and the folders it writes, created owned by it so the named volumes
# mounted on them start writable. deploy/entrypoint.sh hands a host folder mounted there to it.
RUN useradd --create-home --uid 1000 mtfl \
 && mkdir -p /var/lib/mtfl/artifacts /var/lib/mtfl/datasets \
             /var/lib/mtfl/agent/mps/pipe /var/lib/mtfl/agent/mps/log \
 && chown -R mtfl:mtfl /var/lib/mtfl
COPY deploy/entrypoint.sh /usr/local/bin/mtfl-entrypoint
ENTRYPOINT ["mtfl-entrypoint"]

# torch and the project's code: the layers both images start from. Each image's build passes its
# own TORCH_INDEX_URL; where both use the same index (PyPI by default), the torch layer is built
# once and shared on disk.
FROM base AS torch
# The torch pair this project is tested with; the biggest layer first, so code changes do not
# download torch again. An empty TORCH_INDEX_URL means PyPI.
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
ARG TORCH_INDEX_URL=""
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
      "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
COPY pyproject.toml README.md manage.py ./
COPY controlplane ./controlplane
COPY workers ./workers
# Plug-in packages (docs/extending.md; docs/deployment.md, "Plug-ins"): pip requirement
# specifiers, space-separated, installed after mtfl-lab: a folder of the build context
# (./examples/custom-task), a PyPI name, a VCS URL. docker-compose.yml passes MTFL_PLUGINS from
# .env to both images, so every build gets the same ones. Empty (the default): none.
COPY examples ./examples

# The device agent.
FROM torch AS agent
# Editable, as the control plane's: one layout for both images. `agent` adds nothing to the
# base dependencies: no Django, DRF, psycopg or plotly.
RUN pip install -e ".[agent]"
ARG MTFL_PLUGINS=""
RUN if [ -n "$MTFL_PLUGINS" ]; then pip install $MTFL_PLUGINS && pip check; fi
CMD ["mtfl-agent", "--help"]

# The web app, the control worker and Flower.
FROM torch AS controlplane
COPY templates ./templates
COPY frontend ./frontend
# Editable: settings find templates/ and frontend/ next to the package. `deploy` adds the
# control plane's packages, gunicorn and Flower.
RUN pip install -e ".[deploy]"
# The control worker evaluates global models and the web app checks tasks, so both need the
# plug-ins the agents have (a run that needs one its control worker lacks is refused).
ARG MTFL_PLUGINS=""
RUN if [ -n "$MTFL_PLUGINS" ]; then pip install $MTFL_PLUGINS && pip check; fi
# Static files collected at build time (whitenoise serves STATIC_ROOT). The throwaway key and
# home keep any secret out of the image.
RUN SECRET_KEY=collectstatic-only MTFL_HOME=/tmp/build-home mtfl collectstatic --noinput \
 && rm -rf /tmp/build-home
CMD ["gunicorn", "controlplane.wsgi:application", "--bind", "0.0.0.0:8000"]
