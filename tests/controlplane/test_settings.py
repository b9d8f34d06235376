"""12-factor settings: embedded defaults when variables are unset, strict values otherwise."""

from __future__ import annotations

import os
import subprocess
import sys


def _settings(env_extra: dict, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "ARTIFACT_ROOT", "DEBUG"}}
    env.update(env_extra, DJANGO_SETTINGS_MODULE="controlplane.settings")
    return subprocess.run([sys.executable, "-c", "from django.conf import settings as s; " + code],
                          capture_output=True, text=True, env=env, timeout=60)


def test_unset_variables_give_the_embedded_defaults(tmp_path):
    out = _settings({"MTFL_HOME": str(tmp_path)},
                    "print(s.DATABASES['default']['NAME']); print(s.ARTIFACT_ROOT); print(s.DEBUG); "
                    "print(s.CELERY_BROKER_URL == ''); print(s.ALLOWED_HOSTS)")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(tmp_path / "mtfl.sqlite3")
    assert lines[1] == str(tmp_path / "artifacts")
    assert lines[2] == "False" and lines[3] == "True"
    assert "localhost" in lines[4]
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_variables_override_the_defaults(tmp_path):
    out = _settings(
        {"MTFL_HOME": str(tmp_path), "DATABASE_URL": "postgres://u@db.example:5432/mtfl",
         "CELERY_BROKER_URL": "redis://r:6379/0", "SECRET_KEY": "k" * 50, "DEBUG": "true",
         "ALLOWED_HOSTS": "lab.example,10.0.0.2"},
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
