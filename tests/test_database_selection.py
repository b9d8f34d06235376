"""tests/conftest.py's selection for CI's PostgreSQL pass (``MTFL_TESTS_DATABASE_ONLY=1``):
which tests count as using the database; and what keeps tests independent of the order
pytest-xdist runs them in (one node id per test, the environment put back)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.conftest import _environment_is_restored, pytest_collection_modifyitems, uses_the_database


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


@dataclass
class _NamedItem:
    nodeid: str
    path: str = "tests/t.py"
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_two_tests_with_one_node_id_are_refused_before_anything_runs(monkeypatch):
    # pytest-xdist schedules by node id: of two tests sharing one it would silently run one.
    monkeypatch.delenv("MTFL_TESTS_DATABASE_ONLY", raising=False)
    items = [_NamedItem("tests/t.py::test_a"), _NamedItem("tests/t.py::test_b"), _NamedItem("tests/t.py::test_a")]
    with pytest.raises(pytest.UsageError, match=r"share a node id.*tests/t.py::test_a'\]"):
        pytest_collection_modifyitems(None, items)
    distinct = items[:2]
    pytest_collection_modifyitems(None, distinct)
    assert [i.nodeid for i in distinct] == ["tests/t.py::test_a", "tests/t.py::test_b"]


def test_the_environment_is_put_back_after_a_test_that_exports_a_variable(request):
    # workers.agent.app.main exports --control-url as MTFL_CONTROL_URL for its children; a test
    # calling it in process must not leave it to the tests a pytest-xdist worker runs next.
    import os

    fixture = _environment_is_restored.__wrapped__()
    next(fixture)
    os.environ["MTFL_TEST_LEAK"] = "http://127.0.0.1:1"
    with pytest.raises(StopIteration):
        next(fixture)
    assert "MTFL_TEST_LEAK" not in os.environ


def test_files_with_integration_tests_are_handed_out_first(monkeypatch):
    monkeypatch.delenv("MTFL_TESTS_DATABASE_ONLY", raising=False)
    items = [
        _NamedItem("a.py::t1", "a.py"),
        _NamedItem("b.py::t1", "b.py"),
        _NamedItem("b.py::t2", "b.py", {"integration"}),
        _NamedItem("c.py::t1", "c.py"),
    ]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "a.py::t1", "c.py::t1"]
