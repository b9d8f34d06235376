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
    figures = dict(line.split("=", 1) for line in lines[-7:])
    assert list(figures) == [
        "sim_calibration_parvagpu_rmsle",
        "sim_calibration_miso_rmsle",
        "sim_calibration_gavel_rmsle",
        "sim_calibration_mtfl_h200_rmsle",
        "sim_calibration_mtfl_h200_ordering",
        "predictor_baseline_gavel_rmsle",
        "sim_calibration_worst_rmsle",
    ]
    assert re.fullmatch(r"sim_calibration_worst_rmsle=\d+\.\d{3}", lines[-1])
    assert re.fullmatch(r"(True|False) \(measured: .+; simulated: .+\)", figures["sim_calibration_mtfl_h200_ordering"])
    per_set = [float(figures[f"sim_calibration_{name}_rmsle"]) for name in ("parvagpu", "miso", "gavel", "mtfl_h200")]
    assert float(figures["sim_calibration_worst_rmsle"]) == max(per_set)
    assert all(math.isfinite(v) and 0 < v < 1 for v in per_set)
    # the backend's constants are as they were: the held-out fits change them only inside
    assert (sim.RECLAIM, sim.CONTENTION, sim.WIDTH_HALF) == (0.6, 0.3, 2.0)


def test_main_refuses_a_folder_without_data(calibration, tmp_path, capsys):
    assert calibration.main(["--quick", "--gavel", str(tmp_path)]) == 2

    assert "no throughputs.json in" in capsys.readouterr().err


def test_main_refuses_a_folder_without_the_h200_set(calibration, tmp_path, capsys):
    assert calibration.main(["--quick", "--h200", str(tmp_path)]) == 2

    assert "no measurements.csv in" in capsys.readouterr().err


# ------------------------------------------------------------------------------ H200 set


def test_h200_loader_reads_the_vendored_measurements(calibration):
    rows = calibration.load_h200(calibration.default_h200_data())

    assert calibration.default_h200_data() == REFERENCE / "mtfl-h200"
    assert len(rows) == 49  # 28 profiled tasks, 21 tasks of 7 measured plans
    assert {r.run for r in rows} == {"full_default", "light_short"}
    plans = {(r.run, r.strategy) for r in rows if r.kind == "plan"}
    assert plans == {
        (run, s) for run in ("full_default", "light_short") for s in ("temporal", "isolation", "sharing")
    } | {("full_default", "vres_greedy")}
    temporal = [r for r in rows if r.strategy == "temporal" and r.run == "light_short"]
    assert [r.partitioning for r in temporal] == ["timeslice"] * 3
    assert temporal[0].configuration[0] == ("resnet18", 128, 100)
    assert temporal[0].samples_per_s == pytest.approx(13095.253)
    assert calibration.strategy_throughputs(temporal, [r.samples_per_s for r in temporal]) == {
        "temporal": [pytest.approx(24990.96, abs=0.01)]
    }


def test_h200_loader_names_a_row_that_disagrees_with_its_configuration(calibration, tmp_path):
    header = (
        "run,kind,group,strategy,partitioning,task_index,architecture,batch_size,share,configuration,"
        "samples_per_s,timed_iterations,peak_memory_bytes,gpu_util_mean_percent\n"
    )
    (tmp_path / "measurements.csv").write_text(
        header + "r,profile,config00,,mps,0,resnet18,64,100,resnet18@32@100,1,1,,\n"
    )

    with pytest.raises(ValueError, match="is not the configuration's task 0"):
        calibration.load_h200(tmp_path)

    (tmp_path / "measurements.csv").write_text(
        header + "r,profile,config00,,mig,0,resnet18,32,100,resnet18@32@100,1,1,,\n"
    )
    with pytest.raises(ValueError, match="partitioning must be one of mps, timeslice"):
        calibration.load_h200(tmp_path)


def test_h200_split_keeps_each_configuration_and_plan_whole(calibration):
    rows = calibration.load_h200(calibration.default_h200_data())

    held = calibration.held_out_groups(calibration.h200_group(r) for r in rows)

    groups = {calibration.h200_group(r) for r in rows}
    assert len(groups) == 27 and len(held) == 13
    assert ("full_default", "light/sharing") in held and ("full_default", "light/temporal") not in held


def test_orderings_tie_strategies_within_the_tolerance(calibration):
    text, pairs = calibration.ordering({"temporal": 100.0, "sharing": 95.0, "vres_greedy": 60.0}, 0.1)

    assert text == "temporal ~ sharing > vres_greedy"
    assert pairs == {("sharing", "temporal"): 0, ("sharing", "vres_greedy"): 1, ("temporal", "vres_greedy"): 1}
    assert calibration.tie_tolerance({"a": [90.0, 110.0], "b": [50.0]}) == pytest.approx(0.2)
    assert calibration.tie_tolerance({"b": [50.0]}) == calibration.H200_STRATEGY_ORDER_TOLERANCE_DEFAULT
