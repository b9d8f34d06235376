"""The reference data the benchmarks read is part of the repository, with its licence."""

from __future__ import annotations

import subprocess

from tests.benchmarks import BENCHMARKS, load_benchmark

REFERENCE = BENCHMARKS / "reference-data"
REPOSITORY = BENCHMARKS.parent


def test_sim_calibration_reads_the_vendored_parvagpu_profiles():
    calibration = load_benchmark("sim_calibration")

    data = calibration.default_data()
    table = calibration.load(data)

    assert data == REFERENCE / "parvagpu-a100"
    assert sorted(table) == sorted(calibration.MODELS)
    # every model has measurements at the full A100 (7 GPCs) with 1 to 5 processes
    for model, rows in table.items():
        assert {k for g, _b, k in rows if g == 7} == {1, 2, 3, 4, 5}, model
        assert all(sps > 0 for sps in rows.values()), model


def test_every_vendored_folder_has_its_licence_and_is_described():
    folders = [p for p in REFERENCE.iterdir() if p.is_dir()]
    readme = (REFERENCE / "README.md").read_text()

    assert folders
    for folder in folders:
        assert "MIT License" in (folder / "LICENSE").read_text(), folder.name
        assert f"## {folder.name}/" in readme, folder.name


def test_a_clone_gets_the_reference_data():
    """The files are tracked, so ``git clone`` brings them (none is ignored or left untracked)."""
    wanted = sorted(str(p.relative_to(REPOSITORY)) for p in REFERENCE.rglob("*") if p.is_file())
    tracked = subprocess.run(
        ["git", "ls-files", "--", str(REFERENCE.relative_to(REPOSITORY))],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()

    assert sorted(tracked) == wanted
