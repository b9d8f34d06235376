"""The benchmarks' recorded figures (benchmarks/results/*.json) say how each was produced."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.benchmarks import BENCHMARKS

RESULTS = sorted((BENCHMARKS / "results").glob("*.json"))
REPOSITORY = BENCHMARKS.parent


def _is_a_command_here(command: str) -> bool:
    """A benchmark script of the repository (``python benchmarks/x.py ...``), the lab deployment's
    check (``deploy/compose_check.sh``) or one of the project's own ``mtfl`` commands (a
    management command module: ``mtfl demo --algorithms``)."""
    words = command.split()
    if words and words[0] == "mtfl":
        module = words[1].replace("-", "_")
        return bool(list(REPOSITORY.glob(f"controlplane/*/management/commands/{module}.py")))
    script = next((word for word in words if word.startswith(("benchmarks/", "deploy/"))), None)
    return script is not None and (REPOSITORY / script).is_file()


def _entries(data: dict) -> list[dict]:
    """Every entry list in a results file: ``entries`` at the top or in a section."""
    found = list(data.get("entries", []))
    for value in data.values():
        if isinstance(value, dict) and "entries" in value:
            found += value["entries"]
    return found


def test_there_is_a_results_file_per_benchmark_with_recorded_figures():
    assert {p.stem for p in RESULTS} >= {"predictor", "scale_sim", "api_load", "sim_calibration"}


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_entry_names_its_command_date_and_host(path: Path):
    data = json.loads(path.read_text())
    entries = _entries(data)

    assert _is_a_command_here(data["benchmark"]) or (REPOSITORY / data["benchmark"]).is_file(), data["benchmark"]
    assert entries
    for entry in entries:
        assert _is_a_command_here(entry["command"]), entry["command"]
        dt.date.fromisoformat(entry["date"])
        assert isinstance(entry["host"], str) and entry["host"] and "\n" not in entry["host"]


def test_the_kept_sweeps_figures_name_files_in_benchmarks_sweeps():
    data = json.loads((BENCHMARKS / "results" / "predictor.json").read_text())
    kept = data["kept_sweeps"]["entries"]

    assert sorted(e["sweep"] for e in kept) == sorted(p.stem for p in (BENCHMARKS / "sweeps").glob("*.json"))
    for entry in kept:
        assert f"benchmarks/sweeps/{entry['sweep']}.json" in entry["command"]
