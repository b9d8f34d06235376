"""Loaded with ``-p tests.env_plugin`` (pyproject) before Django's settings: every test session
gets its own ``MTFL_HOME`` and ``ARTIFACT_ROOT``, so tests never touch ``~/.mtfl``."""

import os
import tempfile

_home = tempfile.mkdtemp(prefix="mtfl-test-")
os.environ["MTFL_HOME"] = _home
os.environ["ARTIFACT_ROOT"] = os.path.join(_home, "artifacts")
# Tests choose their broker explicitly (memory for unit tests, real Redis for integration).
os.environ.pop("CELERY_BROKER_URL", None)
os.environ.pop("CELERY_RESULT_BACKEND", None)
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"
# The suite runs the embedded settings; the production refusals are tested in subprocesses
# (tests/controlplane/test_settings.py), so a deployment's MTFL_ENV exported in the shell that
# runs pytest must not turn them on here.
os.environ.pop("MTFL_ENV", None)
