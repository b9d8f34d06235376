"""The predictor on real sweeps: the 2-core cpu sweeps kept in benchmarks/sweeps/ (measured with
``python benchmarks/predictor.py --save``) are refitted as ``--load`` does, and the held-out
error must stay where the README reports it. A change to the physical model or the features
that makes real predictions worse fails here, not only in the benchmark. A change to the code
that should leave the predictor's arithmetic alone (a refactoring) must reproduce the held-out
figures pinned in ``predictor_pins.json`` (written by ``python -m tests.benchmarks.predictor_pins``)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from controlplane.planning.predictor import ModelWorkload, fit_predictor
from tests.benchmarks import BENCHMARKS, load_benchmark
from tests.benchmarks.predictor_pins import PINS

SWEEPS = sorted((BENCHMARKS / "sweeps").glob("cpu-2cores-*.json"))
FORK_SWEEPS = [p for p in SWEEPS if "-fork-" in p.stem]  # profilers forked from a fork server
LINK_SWEEPS = [p for p in SWEEPS if "-link-" in p.stem] + FORK_SWEEPS  # measured with the core link probe
FAMILIES = ("baseline", "random_forest", "extra_trees")
"""The families the figures below are checked on (every family is fitted for the pins)."""
PINNED = json.loads(PINS.read_text())


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("predictor")


@pytest.fixture(scope="module")
def workloads():
    """Workload features of every model in the kept sweeps, as pinned (the zoo's torch FLOP
    counts, checked by :func:`test_the_pinned_workloads_are_the_zoos`)."""
    return {a: ModelWorkload(*values) for a, values in PINNED["workloads"].items()}


@pytest.fixture(scope="module")
def fitted(bench, workloads):
    """``fitted(path, link=True)``: ``(predictor, report)`` of fitting :data:`FAMILIES` on a kept sweep
    (with the core link probe's round trips, or with them dropped), fitted once per module: the
    per-sweep tests, the pin test and the link test share the fits. Gradient boosting is left out
    of the suite's fits: it is never the kept family on these sweeps and costs more than the other
    three together (its pinned figures stay in the pin file, which
    ``python -m tests.benchmarks.predictor_pins`` rewrites with every family)."""
    cache = {}

    def fit(path, link: bool = True):
        if (path, link) not in cache:
            saved = json.loads(path.read_text())
            samples = bench.to_samples(saved["results"])
            if not link:
                samples = [replace(s, cross_core_rtt_ns=None) for s in samples]
            cache[path, link] = fit_predictor(
                samples,
                workloads,
                cores=saved["cores"],
                placement="packed",
                families=FAMILIES,
            )
        return cache[path, link]

    return fit


def _families(path, fitted, link: bool = True):
    """The :data:`FAMILIES` reports of a fit."""
    return [f for f in fitted(path, link)[1].families if f.family in FAMILIES]


def test_the_pinned_workloads_are_the_zoos(bench):
    pinned = {a: ModelWorkload(*values) for a, values in PINNED["workloads"].items()}
    assert bench.workloads_of(sorted(pinned)) == pinned


def test_every_kept_sweep_is_pinned():
    assert sorted(PINNED["sweeps"]) == [p.name for p in SWEEPS]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_held_out_figures_on_a_kept_sweep_are_the_pinned_ones(fitted, path):
    # Every figure is deterministic given the seeds (grouped partitions and the families'
    # random_state; BLAS and OpenMP held to one thread while fitting): any change beyond
    # floating-point noise means the predictor's arithmetic changed.
    pin = PINNED["sweeps"][path.name]
    predictor, report = fitted(path)
    exact = {"rel": 1e-9, "abs": 1e-12}
    assert (report.configurations, report.groups, report.samples, report.folds, report.partitions, report.kept) == (
        pin["configurations"],
        pin["groups"],
        pin["samples"],
        pin["folds"],
        pin["partitions"],
        pin["kept"],
    )
    assert [f.family for f in report.families] == [f for f in pin["families"] if f in FAMILIES]
    for family in report.families:
        want = pin["families"][family.family]
        assert family.rmsle == pytest.approx(want["rmsle"], **exact), family.family
        assert family.mape == pytest.approx(want["mape"], **exact), family.family
        assert {str(k): v for k, v in family.by_mix_size.items()} == pytest.approx(want["by_mix_size"], **exact)
        assert family.by_slice == pytest.approx(want["by_slice"], **exact), family.family
    for name, want in pin["physics"].items():
        got = getattr(predictor.space, name)
        assert got == (None if want is None else pytest.approx(want, **exact)), name


def test_the_kept_sweeps_are_real_2_core_cpu_sweeps():
    assert len(SWEEPS) >= 3
    for path in SWEEPS:
        saved = json.loads(path.read_text())
        assert saved["cores"] == 2
        assert sum(r["status"] == "succeeded" for r in saved["results"]) >= 60
        assert all(r["backend"] == "cpu" for r in saved["results"])


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_held_out_error_on_a_real_sweep_stays_where_the_readme_reports_it(fitted, path):
    # README, held-out over 3 random partitions into 5 folds (the default): sweeps 1-3 0.147 /
    # 0.152 / 0.159 for the best family, the physical baseline 0.147 / 0.152 / 0.165; the probed
    # sweeps link-1..3 0.139 / 0.156 / 0.118 (baseline 0.142 / 0.156 / 0.119). With
    # scikit-learn's one unshuffled partition they had read 0.151 / 0.152 / 0.157 and 0.138 /
    # 0.154 / 0.137: which mixes are held out together moves a sweep's figure by up to 0.03.
    # The sweeps profiled through the fork server (2.0-2.3x the configurations per budget):
    # fork-1, fork-2 (2 s windows) 0.115 / 0.120, 2026-12-01-fork-window-4s 0.097; on another
    # host 2026-12-02-fork-1 (2 s) 0.113 and -fork-window-4s 0.111 (baseline 0.118 / 0.120 /
    # 0.097 / 0.128 / 0.116). Before the passive-wait term κ (fit_physical) they read 0.115 /
    # 0.123 / 0.102 / 0.112 / 0.110.
    report = fitted(path)[1]
    by_family = {f.family: f.rmsle for f in _families(path, fitted)}
    if path in FORK_SWEEPS:
        assert by_family["baseline"] < 0.13
        assert min(by_family.values()) < 0.122
        assert report.configurations >= 75 and report.groups >= 29
    else:
        assert by_family["baseline"] < 0.175
        assert min(by_family.values()) < 0.175
        assert report.configurations >= 60 and report.groups >= 20


@pytest.fixture(scope="module")
def link_effect(bench, fitted):
    """Per probed sweep, the best held-out RMSLE with and without the link probe's round trips."""
    out = {}
    for path in LINK_SWEEPS:
        samples = bench.to_samples(json.loads(path.read_text())["results"])
        assert sum(s.cross_core_rtt_ns is not None for s in samples) >= 40
        out[path.stem] = tuple(min(f.rmsle for f in _families(path, fitted, link)) for link in (True, False))
    return out


def test_the_core_link_probe_lowers_the_held_out_error_on_the_probed_sweeps(link_effect):
    # Measured (3 partitions, without -> with the round trips): link-1..3 0.158 -> 0.139,
    # 0.162 -> 0.156, 0.137 -> 0.118 (the second sweep's host kept the cores near for 80 % of
    # its multi-core measurements, leaving little to correct); fork-1, fork-2,
    # 2026-12-01-fork-window-4s 0.123 -> 0.115, 0.131 -> 0.120, 0.120 -> 0.096;
    # 2026-12-02-fork-1 and -fork-window-4s (another host, whose round trips all lay within
    # 370-456 ns) with and without alike.
    assert len(link_effect) >= 6
    with_link, without = np.array(list(link_effect.values())).T
    assert (with_link <= without + 0.01).all()
    assert with_link.mean() < without.mean() - 0.003


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_on_a_real_sweep_the_error_is_in_the_multithreaded_and_shared_slices(fitted, path):
    # README, "by the slice a task ran on" (kept family): a 1-thread task alone on its core is
    # predicted to 0.037-0.065 on every kept sweep; beside other threads on its core 0.082-0.130;
    # a 2-thread task 0.09-0.23, alone or shared: where the held-out error above 0.10 comes from.
    best = min(_families(path, fitted), key=lambda f: f.rmsle)
    slices = best.by_slice
    assert set(slices) == {"1 unit, alone", "1 unit, shared", "2 units, alone", "2 units, shared"}
    assert slices["1 unit, alone"] < 0.075
    assert slices["1 unit, alone"] < slices["1 unit, shared"]
    assert min(slices["2 units, alone"], slices["2 units, shared"]) > slices["1 unit, alone"] + 0.03


def test_the_benchmark_refits_a_kept_sweep_and_ends_with_the_kept_familys_heldout_rmsle():
    # `python benchmarks/predictor.py --load <sweep>` as the README gives it, end to end: the
    # families' table, the slices, the fitted physical terms, the speed figures and, last,
    # `heldout_rmsle=<value>` (issue 3's contract). On fork-window-4s that value is 0.0965,
    # under the 0.10 target.
    import subprocess
    import sys

    sweep = BENCHMARKS / "sweeps" / "cpu-2cores-2026-12-01-fork-window-4s.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "predictor.py"), "--load", str(sweep)],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("heldout_rmsle=")
    assert float(lines[-1].split("=")[1]) <= 0.10
    for expected in (
        "extra_trees",
        "random_forest",
        "gradient_boosting",
        "baseline",
        "2 units, shared",
        "passive-wait ratio κ = ",
        "link exponent γ = ",
        "fit_5000_samples_s=",
        "predict_100000_configs_s=",
    ):
        assert expected in done.stdout, expected
