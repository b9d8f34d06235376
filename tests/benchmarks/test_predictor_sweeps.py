"""The predictor on real sweeps: the 2-core cpu sweeps kept in benchmarks/sweeps/ (measured with
``python benchmarks/predictor.py --save``) are refitted as ``--load`` does, and the held-out
error must stay where the README reports it. A change to the physical model or the features
that makes real predictions worse fails here, not only in the benchmark."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from controlplane.planning.predictor import fit_predictor

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "benchmarks" / "sweeps").glob("cpu-2cores-*.json"))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("predictor_benchmark_under_test", ROOT / "benchmarks" / "predictor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kept_sweeps_are_real_2_core_cpu_sweeps():
    assert len(SWEEPS) >= 3
    for path in SWEEPS:
        saved = json.loads(path.read_text())
        assert saved["cores"] == 2
        assert sum(r["status"] == "succeeded" for r in saved["results"]) >= 60
        assert all(r["backend"] == "cpu" for r in saved["results"])


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_held_out_error_on_a_real_sweep_stays_where_the_readme_reports_it(bench, path):
    # README: 0.151 / 0.152 / 0.157 for the kept family at the reference speed; the physical
    # baseline alone 0.151 / 0.152 / 0.170. Before the overhead exponent and the escape weight
    # the baseline gave 0.179 / 0.189 / 0.176, the kept family 0.179 / 0.189 / 0.168.
    saved = json.loads(path.read_text())
    samples = bench.to_samples(saved["results"])
    workloads = bench.workloads_of(sorted({t.architecture for s in samples for t in s.mix}))
    _predictor, report = fit_predictor(samples, workloads, cores=saved["cores"], placement="packed",
                                       families=("baseline", "random_forest", "extra_trees"))
    by_family = {f.family: f.rmsle for f in report.families}
    assert by_family["baseline"] < 0.175
    assert min(by_family.values()) < 0.162
    assert report.configurations >= 60 and report.groups >= 20
