"""benchmarks/sim_calibration.py: its loaders read the vendored data, its splits are fixed, and
its main ends with the figure the target is checked on."""

from __future__ import annotations

import math
import random
import re

import pytest

from tests.benchmarks import BENCHMARKS, load_benchmark
from workers.backends import simulated as sim

REFERENCE = BENCHMARKS / "reference-data"


@pytest.fixture(scope="module")
def calibration():
    return load_benchmark("sim_calibration")


def test_miso_loader_reads_the_vendored_csv(calibration):
    rows = calibration.load_miso(calibration.default_miso_data())

    assert calibration.default_miso_data() == REFERENCE / "miso-a100-mig"
    assert len(rows) == 145  # every data row of training_iterations.csv
    resnet = [r for r in rows if r.model == "resnet"]
    assert {(r.gpcs, r.batch_size) for r in resnet} == {(g, b) for g in (1, 2, 3, 4, 7) for b in (64, 128, 256, 512)}
    full = next(r for r in resnet if r.gpcs == 7 and r.batch_size == 512)
    assert full.samples_per_s == pytest.approx(13989.071)
    # every model is either mapped to the zoo or left out with a reason
    assert {r.model for r in rows} == set(calibration.MISO_ZOO) | set(calibration.MISO_LEFT_OUT)


def test_miso_loader_names_a_bad_slice(calibration, tmp_path):
    (tmp_path / "training_iterations.csv").write_text(
        "slice,gpcs,model,batch_size,iterations,iteration_s_p10,iteration_s_median,iteration_s_p90,samples_per_s\n"
        "5g,5,resnet,64,10,0.1,0.1,0.1,640\n"
    )

    with pytest.raises(ValueError, match="gpcs must be one of 1, 2, 3, 4, 7; got 5"):
        calibration.load_miso(tmp_path)


def test_gavel_loader_reads_each_scale_1_pair_once(calibration):
    pairs, left_out = calibration.load_gavel(calibration.default_gavel_data())

    assert calibration.default_gavel_data() == REFERENCE / "gavel-p100-k80"
    assert {p.gpu for p in pairs} == {"p100", "k80"}
    keys = [(p.gpu, *p.jobs) for p in pairs]
    assert len(keys) == len(set(keys))
    assert all(p.jobs[0] <= p.jobs[1] for p in pairs)
    # 26 scale-1 job types per GPU: 26·27/2 unordered pairs, each either kept or left out
    assert len(pairs) + sum(left_out.values()) == 2 * 26 * 27 // 2
    assert left_out["failed"] > 0
    for pair in pairs:
        assert all(0 < r < 1.5 for r in pair.ratios), pair
    p100 = {
        (p.jobs[0].name, p.jobs[0].batch_size, p.jobs[1].name, p.jobs[1].batch_size): p
        for p in pairs
        if p.gpu == "p100"
    }
    pair = p100[("ResNet-18", 16, "ResNet-50", 16)]
    assert pair.alone[0] == pytest.approx(35.869203207990005)
    assert pair.colocated == pytest.approx((16.730906097669408, 5.524574180391599))
    assert len(p100[("ResNet-18", 16, "ResNet-18", 16)].ratios) == 1  # a job beside a copy of itself


def test_held_out_groups_is_every_other_sorted_group_whatever_the_order(calibration):
    groups = [("m", g, b) for g in (1, 2, 3) for b in (8, 16)]
    shuffled = groups * 2
    random.Random(1).shuffle(shuffled)

    held = calibration.held_out_groups(shuffled)

    assert held == calibration.held_out_groups(groups)
    assert held == {("m", 1, 16), ("m", 2, 16), ("m", 3, 16)}


def test_the_splits_are_disjoint_and_cover_each_data_set(calibration):
    table = calibration.load(calibration.default_data())
    fit_part, held_part = calibration.parvagpu_split(table)
    for model, rows in table.items():
        assert set(fit_part[model]).isdisjoint(held_part[model])
        assert set(fit_part[model]) | set(held_part[model]) == set(rows)
        # a (MIG size, batch) co-location series is never cut in two
        assert {k[:2] for k in fit_part[model]}.isdisjoint({k[:2] for k in held_part[model]})

    miso = [r for r in calibration.load_miso(calibration.default_miso_data()) if r.model in calibration.MISO_ZOO]
    held = calibration.held_out_groups(calibration.miso_group(r) for r in miso)
    assert held == {("resnet", 128), ("resnet", 512)}


def test_module_constants_are_put_back_even_after_an_error(calibration):
    before = (sim.RECLAIM, sim.CONTENTION)

    with pytest.raises(RuntimeError), calibration.module_constants(RECLAIM=0.1, CONTENTION=9.0):
        assert (sim.RECLAIM, sim.CONTENTION) == (0.1, 9.0)
        raise RuntimeError

    assert (sim.RECLAIM, sim.CONTENTION) == before


def test_the_predictor_baseline_halves_each_job_of_a_pair(calibration):
    pairs, _ = calibration.load_gavel(calibration.default_gavel_data())

    ratios = calibration.predictor_ratios(pairs[:3])

    assert ratios == pytest.approx(0.5)


def test_simulated_pair_ratios_lie_between_time_slicing_and_no_slowdown(calibration):
    pairs, _ = calibration.load_gavel(calibration.default_gavel_data())
    mapped = [p for p in pairs if p.gpu == "p100" and all(j.name in calibration.GAVEL_ZOO for j in p.jobs)]

    ratios = calibration.simulate_gavel_ratios(mapped, sim.device_spec("p100"))

    assert ratios.shape == (len(mapped), 2)
    assert ((ratios > 0.45) & (ratios <= 1.0)).all()


def test_main_quick_ends_with_the_worst_held_out_figure(calibration, capsys):
    assert calibration.main(["--quick"]) == 0

    lines = capsys.readouterr().out.strip().splitlines()
    figures = dict(line.split("=") for line in lines[-5:])
    assert list(figures) == [
        "sim_calibration_parvagpu_rmsle",
        "sim_calibration_miso_rmsle",
        "sim_calibration_gavel_rmsle",
        "predictor_baseline_gavel_rmsle",
        "sim_calibration_worst_rmsle",
    ]
    assert re.fullmatch(r"sim_calibration_worst_rmsle=\d+\.\d{3}", lines[-1])
    per_set = [float(figures[f"sim_calibration_{name}_rmsle"]) for name in ("parvagpu", "miso", "gavel")]
    assert float(figures["sim_calibration_worst_rmsle"]) == max(per_set)
    assert all(math.isfinite(v) and 0 < v < 1 for v in per_set)
    # the backend's constants are as they were: the held-out fits change them only inside
    assert (sim.RECLAIM, sim.CONTENTION, sim.WIDTH_HALF) == (0.6, 0.3, 2.0)


def test_main_refuses_a_folder_without_data(calibration, tmp_path, capsys):
    assert calibration.main(["--quick", "--gavel", str(tmp_path)]) == 2

    assert "no throughputs.json in" in capsys.readouterr().err
