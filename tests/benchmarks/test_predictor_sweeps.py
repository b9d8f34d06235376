"""The predictor on real sweeps: the 2-core cpu sweeps kept in benchmarks/sweeps/ (measured with
``python benchmarks/predictor.py --save``) are refitted as ``--load`` does, and the held-out
error must stay where the README reports it. A change to the physical model or the features
that makes real predictions worse fails here, not only in the benchmark."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from controlplane.planning.predictor import fit_predictor
from tests.benchmarks import BENCHMARKS, load_benchmark

SWEEPS = sorted((BENCHMARKS / "sweeps").glob("cpu-2cores-*.json"))
LINK_SWEEPS = [p for p in SWEEPS if "-link-" in p.stem]  # measured with the core link probe
FAMILIES = ("baseline", "random_forest", "extra_trees")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("predictor")


@pytest.fixture(scope="module")
def workloads(bench):
    """Workload features of every model in the kept sweeps, counted once (torch FLOP counting)."""
    architectures = {t["architecture"] for path in SWEEPS for r in json.loads(path.read_text())["results"]
                     for t in r["tasks"]}
    return bench.workloads_of(sorted(architectures))


def test_the_kept_sweeps_are_real_2_core_cpu_sweeps():
    assert len(SWEEPS) >= 3
    for path in SWEEPS:
        saved = json.loads(path.read_text())
        assert saved["cores"] == 2
        assert sum(r["status"] == "succeeded" for r in saved["results"]) >= 60
        assert all(r["backend"] == "cpu" for r in saved["results"])


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_held_out_error_on_a_real_sweep_stays_where_the_readme_reports_it(bench, workloads, path):
    # README: sweeps 1-3 0.151 / 0.152 / 0.157 for the kept family at the reference speed; the
    # physical baseline alone 0.151 / 0.152 / 0.170. Before the overhead exponent and the escape
    # weight the baseline gave 0.179 / 0.189 / 0.176, the kept family 0.179 / 0.189 / 0.168. The
    # probed sweeps link-1..3: 0.138 / 0.154 / 0.137 (baseline 0.138 / 0.154 / 0.139).
    saved = json.loads(path.read_text())
    samples = bench.to_samples(saved["results"])
    _predictor, report = fit_predictor(samples, workloads, cores=saved["cores"], placement="packed",
                                       families=FAMILIES)
    by_family = {f.family: f.rmsle for f in report.families}
    assert by_family["baseline"] < 0.175
    assert min(by_family.values()) < 0.162
    assert report.configurations >= 60 and report.groups >= 20


@pytest.fixture(scope="module")
def link_effect(bench, workloads):
    """Per probed sweep, the best held-out RMSLE with and without the link probe's round trips."""
    out = {}
    for path in LINK_SWEEPS:
        saved = json.loads(path.read_text())
        samples = bench.to_samples(saved["results"])
        assert sum(s.cross_core_rtt_ns is not None for s in samples) >= 40
        best = []
        for trial in (samples, [replace(s, cross_core_rtt_ns=None) for s in samples]):
            _p, report = fit_predictor(trial, workloads, cores=saved["cores"], placement="packed", families=FAMILIES)
            best.append(min(f.rmsle for f in report.families))
        out[path.stem] = tuple(best)
    return out


def test_the_core_link_probe_lowers_the_held_out_error_on_the_probed_sweeps(link_effect):
    # Measured: 0.152 -> 0.138, 0.149 -> 0.154, 0.142 -> 0.137 (the second sweep's host kept
    # the cores near for 80 % of its multi-core measurements, leaving little to correct).
    assert len(link_effect) >= 3
    with_link, without = np.array(list(link_effect.values())).T
    assert (with_link <= without + 0.01).all()
    assert with_link.mean() < without.mean() - 0.003
