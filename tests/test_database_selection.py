"""tests/conftest.py's selection for CI's PostgreSQL pass (``MTFL_TESTS_DATABASE_ONLY=1``):
which tests count as using the database."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.conftest import uses_the_database


@dataclass
class _Item:
    markers: set[str] = field(default_factory=set)
    fixturenames: tuple[str, ...] = ()

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_a_django_db_mark_or_a_database_fixture_counts_as_using_the_database():
    assert uses_the_database(_Item(markers={"django_db"}))
    assert uses_the_database(_Item(fixturenames=("tmp_path", "db")))
    assert uses_the_database(_Item(fixturenames=("transactional_db",)))
    assert uses_the_database(_Item(fixturenames=("live_server",)))


def test_the_session_fixture_every_test_gets_does_not_count():
    # autouse for every test: it opens the database only on the PostgreSQL pass, for children
    assert not uses_the_database(_Item(fixturenames=("_child_processes_use_the_test_database", "tmp_path")))
    assert not uses_the_database(_Item(markers={"integration"}))
