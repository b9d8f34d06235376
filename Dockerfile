# One image for web, control worker and device agents (docker-compose.yml picks the command).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MTFL_HOME=/var/lib/mtfl
WORKDIR /app
COPY pyproject.toml README.md ./
COPY controlplane ./controlplane
COPY workers ./workers
COPY templates ./templates
COPY frontend ./frontend
COPY manage.py ./
RUN pip install --no-cache-dir -e . gunicorn
RUN useradd --create-home --uid 1000 mtfl && mkdir -p /var/lib/mtfl && chown mtfl /var/lib/mtfl
USER mtfl
EXPOSE 8000
CMD ["gunicorn", "controlplane.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
