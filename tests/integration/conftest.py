"""Integration fixtures: the embedded stack's real processes against the test database."""

from __future__ import annotations

import os

import pytest
from django.db import connection


def test_database_url() -> str:
    """A DATABASE_URL for child processes pointing at the database this test session uses."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    if connection.vendor == "postgresql":
        user = s.get("USER") or ""
        password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
        auth = f"{user}{password}@" if user else ""
        return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"
    raise RuntimeError(f"unsupported database vendor {connection.vendor}")


@pytest.fixture
def child_env(monkeypatch, transactional_db):
    """Point child processes at the test database (committed data is visible to them)."""
    monkeypatch.setenv("DATABASE_URL", test_database_url())
    monkeypatch.setenv("MTFL_WARMUP_ITERATIONS", "1")
    monkeypatch.setenv("MTFL_STANDALONE_TIMED_ITERATIONS", "2")
    return os.environ
