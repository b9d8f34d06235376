# One image for web, control worker, Flower and device agents (docker-compose.yml picks the
# command). `docker build` downloads from PyPI; nothing is downloaded when a container starts.
FROM python:3.11-slim

# The torch pair this project is tested with. PyPI's Linux x86_64 wheels are CUDA builds: they
# bring the CUDA runtime libraries; the driver (and nvidia-cuda-mps-control) come from the host
# through the NVIDIA container toolkit.
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MTFL_HOME=/var/lib/mtfl \
    ARTIFACT_ROOT=/var/lib/mtfl/artifacts \
    STATIC_ROOT=/app/static
WORKDIR /app

# The biggest layer first, so code changes do not download torch again.
RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

COPY pyproject.toml README.md manage.py ./
COPY controlplane ./controlplane
COPY workers ./workers
COPY templates ./templates
COPY frontend ./frontend
# Editable: settings find templates/ and frontend/ next to the package. The `deploy` extra adds
# gunicorn and Flower.
RUN pip install -e ".[deploy]"

# Plug-in packages (docs/extending.md; docs/deployment.md, "Plug-ins"): pip requirement
# specifiers, space-separated, installed after mtfl-lab — a folder of the build context
# (./examples/custom-task), a PyPI name, a VCS URL. Every service runs this image, so the web app,
# the control worker (it evaluates the global models) and the agents all get them; a run that
# needs a plug-in its devices or the control worker lack is refused. Empty (the default): none.
#   MTFL_PLUGINS="./examples/custom-task" docker compose build
ARG MTFL_PLUGINS=""
COPY examples ./examples
RUN if [ -n "$MTFL_PLUGINS" ]; then pip install $MTFL_PLUGINS && pip check; fi

# Static files collected at build time (whitenoise serves STATIC_ROOT). The throwaway key and
# home keep any secret out of the image. The folders below are created owned by the app user,
# so the named volumes mounted on them start writable by it.
RUN useradd --create-home --uid 1000 mtfl \
 && SECRET_KEY=collectstatic-only MTFL_HOME=/tmp/build-home mtfl collectstatic --noinput \
 && rm -rf /tmp/build-home \
 && mkdir -p /var/lib/mtfl/artifacts /var/lib/mtfl/datasets \
             /var/lib/mtfl/agent/mps/pipe /var/lib/mtfl/agent/mps/log \
 && chown -R mtfl:mtfl /var/lib/mtfl
USER mtfl
EXPOSE 8000 5555
CMD ["gunicorn", "controlplane.wsgi:application", "--bind", "0.0.0.0:8000"]
