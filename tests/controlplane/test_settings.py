"""12-factor settings: embedded defaults when variables are unset, strict values otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SERVICE_VARIABLES = {
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "ARTIFACT_ROOT",
    "DEBUG",
    "MTFL_ENV",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
}


def _settings(env_extra: dict, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _SERVICE_VARIABLES}
    env.update(env_extra, DJANGO_SETTINGS_MODULE="controlplane.settings")
    return subprocess.run(
        [sys.executable, "-c", "from django.conf import settings as s; " + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_unset_variables_give_the_embedded_defaults(tmp_path):
    out = _settings(
        {"MTFL_HOME": str(tmp_path)},
        "print(s.DATABASES['default']['NAME']); print(s.ARTIFACT_ROOT); print(s.DEBUG); "
        "print(s.CELERY_BROKER_URL == ''); print(s.ALLOWED_HOSTS)",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(tmp_path / "mtfl.sqlite3")
    assert lines[1] == str(tmp_path / "artifacts")
    assert lines[2] == "False" and lines[3] == "True"
    assert "localhost" in lines[4]
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_an_empty_database_url_means_the_embedded_default(tmp_path):
    out = _settings({"MTFL_HOME": str(tmp_path), "DATABASE_URL": " "}, "print(s.DATABASES['default']['NAME'])")

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "mtfl.sqlite3")


def test_variables_override_the_defaults(tmp_path):
    out = _settings(
        {
            "MTFL_HOME": str(tmp_path),
            "DATABASE_URL": "postgres://u@db.example:5432/mtfl",
            "CELERY_BROKER_URL": "redis://r:6379/0",
            "SECRET_KEY": "k" * 50,
            "DEBUG": "true",
            "ALLOWED_HOSTS": "lab.example,10.0.0.2",
        },
        "print(s.DATABASES['default']['ENGINE'], s.DATABASES['default']['HOST']); print(s.CELERY_RESULT_BACKEND); "
        "print(s.SECRET_KEY == 'k' * 50, s.DEBUG, s.ALLOWED_HOSTS)",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "django.db.backends.postgresql db.example"
    assert lines[1] == "redis://r:6379/0"
    assert lines[2] == "True True ['lab.example', '10.0.0.2']"


def test_a_debug_value_that_is_not_a_boolean_stops_the_start(tmp_path):
    out = _settings({"MTFL_HOME": str(tmp_path), "DEBUG": "maybe"}, "s.DEBUG")
    assert out.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in out.stderr


# --- production (MTFL_ENV=production, set by docker-compose.yml) ----------------------------

_PRODUCTION = {
    "MTFL_ENV": "production",
    "SECRET_KEY": "s" * 50,
    "ALLOWED_HOSTS": "mtfl.lab.example",
    "DATABASE_URL": "postgres://mtfl:pg-pass@postgres:5432/mtfl",
    "CELERY_BROKER_URL": "redis://:redis-pass@redis:6379/0",
}


def _refusal(out: subprocess.CompletedProcess) -> str:
    """The one-line ImproperlyConfigured message a refused start ends with."""
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: "), out.stderr
    return last.removeprefix("django.core.exceptions.ImproperlyConfigured: ")


def test_a_complete_production_configuration_starts(tmp_path):
    out = _settings(
        {**_PRODUCTION, "MTFL_HOME": str(tmp_path), "CSRF_TRUSTED_ORIGINS": "https://mtfl.lab.example"},
        "print(s.MTFL_ENV, s.DEBUG, s.ALLOWED_HOSTS, s.CSRF_TRUSTED_ORIGINS, s.SECRET_KEY == 's' * 50)",
    )

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "production False ['mtfl.lab.example'] ['https://mtfl.lab.example'] True"
    assert not (tmp_path / "secret_key").exists()


@pytest.mark.parametrize("value", [None, "", "   "])
def test_production_refuses_to_start_without_secret_key(tmp_path, value):
    env = {**_PRODUCTION, "MTFL_HOME": str(tmp_path)}
    env.pop("SECRET_KEY")
    if value is not None:
        env["SECRET_KEY"] = value

    message = _refusal(_settings(env, "s.SECRET_KEY"))

    assert message.startswith("SECRET_KEY is not set: MTFL_ENV=production needs its own key")
    assert not (tmp_path / "secret_key").exists()  # no key was generated behind the lab's back


def test_production_refuses_the_placeholder_secret_key_of_env_example(tmp_path):
    message = _refusal(
        _settings({**_PRODUCTION, "MTFL_HOME": str(tmp_path), "SECRET_KEY": "change-me"}, "s.SECRET_KEY")
    )

    assert message.startswith("SECRET_KEY is still the 'change-me' placeholder of .env.example")


@pytest.mark.parametrize("value", ["true", "1", "on"])
def test_production_refuses_to_start_with_debug_on(tmp_path, value):
    message = _refusal(_settings({**_PRODUCTION, "MTFL_HOME": str(tmp_path), "DEBUG": value}, "s.DEBUG"))

    assert message.startswith("DEBUG is on: MTFL_ENV=production refuses debug mode")


@pytest.mark.parametrize("value", [None, "", " , "])
def test_production_refuses_to_start_with_allowed_hosts_empty(tmp_path, value):
    env = {**_PRODUCTION, "MTFL_HOME": str(tmp_path)}
    env.pop("ALLOWED_HOSTS")
    if value is not None:
        env["ALLOWED_HOSTS"] = value

    message = _refusal(_settings(env, "s.ALLOWED_HOSTS"))

    assert message.startswith("ALLOWED_HOSTS is empty: MTFL_ENV=production needs the host names")


@pytest.mark.parametrize(
    "name,source", [("DATABASE_URL", "POSTGRES_PASSWORD"), ("CELERY_BROKER_URL", "REDIS_PASSWORD")]
)
def test_production_refuses_urls_built_from_placeholder_passwords(tmp_path, name, source):
    env = {**_PRODUCTION, "MTFL_HOME": str(tmp_path)}
    env[name] = env[name].replace("pg-pass", "change-me").replace("redis-pass", "change-me")

    message = _refusal(_settings(env, "s.DATABASES"))

    assert (
        message
        == f"{name} still holds the 'change-me' placeholder of .env.example: set a real password ({source} in .env)"
    )


def test_an_unknown_environment_name_stops_the_start(tmp_path):
    message = _refusal(_settings({"MTFL_HOME": str(tmp_path), "MTFL_ENV": "prod"}, "s.DEBUG"))

    assert message == "MTFL_ENV='prod' is not allowed: use embedded or production"


def test_the_embedded_defaults_need_none_of_the_production_variables(tmp_path):
    out = _settings(
        {"MTFL_HOME": str(tmp_path), "DEBUG": "true", "ALLOWED_HOSTS": ""},
        "print(s.MTFL_ENV, s.DEBUG, s.ALLOWED_HOSTS, len(s.SECRET_KEY) > 40)",
    )

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "embedded True [] True"


def test_the_mtfl_command_refuses_a_production_start_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _SERVICE_VARIABLES}
    env.update(_PRODUCTION, MTFL_HOME=str(tmp_path), DEBUG="true")

    out = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "migrate", "--noinput"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )

    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "mtfl: DEBUG is on: MTFL_ENV=production refuses debug mode (its error pages show settings and code); "
        "set DEBUG=false or leave it unset"
    ]
