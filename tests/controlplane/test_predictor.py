"""The throughput predictor on data from a known contention law (no Django, no torch)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from controlplane.planning.predictor import (
    MAX_MIX,
    FeatureSpace,
    MemoryModel,
    MixTask,
    PredictorError,
    ProfiledTask,
    SoloTable,
    encode_mixes,
    fit_physical,
    fit_predictor,
    granted_fraction,
    mix_group,
    normalise_speed,
    passive_wait,
    rmsle,
    sharing_rate,
    slice_labels,
)
from controlplane.planning.predictor.physics import (
    PHYSICS,
    CpuPhysics,
    GpuPhysics,
    physics_for,
    placement_for_backend,
)
from tests.controlplane.contention_law import ARCHS, WORKLOADS, alone, law, synthetic


@pytest.fixture(scope="module")
def fitted():
    # 100 allocation units: shares are granted almost continuously, as SMs under MPS
    return fit_predictor(
        synthetic(220), WORKLOADS, cores=100, families=("baseline", "random_forest", "extra_trees"), folds=4
    )


def test_learned_models_beat_the_baseline_on_held_out_mixes(fitted):
    _predictor, report = fitted
    by_family = {f.family: f for f in report.families}
    assert set(by_family) == {"baseline", "random_forest", "extra_trees"}
    assert report.kept != "baseline"
    assert by_family[report.kept].rmsle < 0.5 * by_family["baseline"].rmsle
    assert by_family[report.kept].rmsle < 0.15
    assert report.groups == len({mix_group(s.mix) for s in synthetic(220)}) and report.folds == 4
    assert {h["architecture"] for h in report.heldout} <= set(ARCHS) and len(report.heldout) == report.samples


def test_held_out_error_is_taken_over_several_random_partitions_into_folds():
    samples = synthetic(120)

    def baseline_rmsle(**kw) -> float:
        _p, report = fit_predictor(samples, WORKLOADS, cores=100, families=("baseline",), folds=4, **kw)
        return report.families[0].rmsle, report

    two, report = baseline_rmsle(partitions=2, seed=0)
    first, _ = baseline_rmsle(partitions=1, seed=0)
    second, _ = baseline_rmsle(partitions=1, seed=1)
    assert report.partitions == 2 and len(report.heldout) == report.samples  # one scatter point per sample
    # Every sample is held out once per partition: the pooled error of the two partitions.
    assert two == pytest.approx(math.sqrt((first**2 + second**2) / 2))
    assert first != pytest.approx(second)  # what one partition alone would have hidden
    with pytest.raises(PredictorError, match="partitions must be at least 1, got 0"):
        fit_predictor(samples, WORKLOADS, cores=100, families=("baseline",), partitions=0)


def test_prediction_does_not_depend_on_task_order(fitted):
    predictor, _ = fitted
    mix = (MixTask("resnet18", 64, 60), MixTask("mobilenet_v3_small", 32, 30), MixTask("shufflenet_v2_x1_0", 128, 50))
    forward, backward = predictor.predict([mix, tuple(reversed(mix))])
    assert forward == pytest.approx(list(reversed(backward)))


def test_prediction_is_vectorised_over_many_configurations(fitted):
    predictor, _ = fitted
    rng = np.random.default_rng(3)
    mixes = [tuple(MixTask(ARCHS[a], 64, 50) for a in rng.integers(0, 4, size=rng.integers(1, 5))) for _ in range(5000)]
    enc = encode_mixes(mixes, predictor.space.architectures)
    out = predictor.predict_arrays(enc)
    assert out.shape == (5000, 4) == enc.arch.shape  # as wide as the largest mix given
    assert np.isnan(out[~enc.present]).all() and (out[enc.present] > 0).all()


def test_predictions_track_the_law_on_new_configurations(fitted):
    predictor, _ = fitted
    fresh = synthetic(60, seed=99, noise=0.0)
    answers = predictor.predict([s.mix for s in fresh])
    predicted = np.array([row[s.task_index] for row, s in zip(answers, fresh, strict=True)])
    measured = np.array([s.throughput_sps for s in fresh])
    assert rmsle(predicted, measured) < 0.2


def test_unknown_model_and_oversized_mix_are_refused(fitted):
    predictor, _ = fitted
    with pytest.raises(PredictorError, match="'alexnet' is unknown"):
        predictor.predict([(MixTask("alexnet", 32, 50),)])
    with pytest.raises(PredictorError, match=f"plans at most {MAX_MIX} tasks per device"):
        predictor.predict([tuple(MixTask("resnet18", 32, 10) for _ in range(MAX_MIX + 1))])
    with pytest.raises(PredictorError, match=f"1 to {MAX_MIX} tasks"):
        encode_mixes([tuple(MixTask("resnet18", 32, 10) for _ in range(MAX_MIX + 1))], predictor.space.architectures)


def test_too_few_samples_are_refused():
    with pytest.raises(PredictorError, match="at least 10 measured configurations"):
        fit_predictor(synthetic(5), WORKLOADS, cores=2)


def test_solo_table_interpolates_in_log_space_and_learns_how_a_model_scales_with_its_slice():
    samples = [ProfiledTask(f"s{b}", (MixTask("resnet18", b, 100),), 0, alone("resnet18", b)) for b in (16, 64)]
    # on a 2-core device a 30 % share is granted one core; this model then runs at 70 % speed
    samples += [ProfiledTask(f"h{b}", (MixTask("resnet18", b, 30),), 0, 0.7 * alone("resnet18", b)) for b in (16, 64)]
    table = SoloTable.from_samples(samples, WORKLOADS, units=2)
    at = table.alone("resnet18", np.array([16, 32, 64, 256]), WORKLOADS)
    assert at[0] == pytest.approx(alone("resnet18", 16)) and at[2] == pytest.approx(alone("resnet18", 64))
    assert at[0] < at[1] < at[2] < at[3]
    half = table.lookup("resnet18", np.array([16, 64]), np.array([0.5, 0.5]), WORKLOADS)
    assert half == pytest.approx([0.7 * alone("resnet18", 16), 0.7 * alone("resnet18", 64)])
    assert table.exponents["resnet18"] == pytest.approx(math.log(0.7) / math.log(0.5))
    # a model never measured alone: the device's FLOP rate over its training FLOPs
    other = table.alone("mobilenet_v3_small", np.array([32]), WORKLOADS)[0]
    rate = np.median([alone("resnet18", b) * WORKLOADS["resnet18"].train_flops_per_sample for b in (16, 64)])
    assert other == pytest.approx(rate / WORKLOADS["mobilenet_v3_small"].train_flops_per_sample)


def test_memory_model_fits_a_line_per_model_and_falls_back_to_workloads():
    samples = [
        ProfiledTask(f"m{b}", (MixTask("resnet18", b, 100),), 0, 1.0, None, int(4e8 + 2e6 * b)) for b in (16, 32, 128)
    ]
    memory = MemoryModel.fit(samples, WORKLOADS)
    assert memory.predict("resnet18", 64) == pytest.approx(4e8 + 2e6 * 64, rel=1e-6)
    w = WORKLOADS["shufflenet_v2_x1_0"]
    assert memory.predict("shufflenet_v2_x1_0", 10) == pytest.approx(
        4e8 + 4 * w.param_bytes + w.activation_bytes_per_sample * 10
    )


def test_a_model_faster_on_one_core_gets_a_negative_exponent_also_from_tasks_alone_on_their_core_in_mixes():
    # on 2 cores: alone at 100 % (2 threads) 500 samples/s, on one core of its own 600 —
    # measured in a 2-task mix whose windows are disjoint (50 % + 50 %), not as a 1-task mix
    samples = [ProfiledTask("s", (MixTask("shufflenet_v2_x1_0", 64, 100),), 0, 500.0)]
    mix = (MixTask("shufflenet_v2_x1_0", 64, 50), MixTask("resnet18", 64, 50))
    samples += [ProfiledTask("m", mix, 0, 600.0), ProfiledTask("m", mix, 1, 400.0)]
    table = SoloTable.from_samples(samples, WORKLOADS, units=2, placement="packed")
    alpha = math.log(600 / 500) / math.log(0.5)
    assert alpha < 0 and table.exponents["shufflenet_v2_x1_0"] == pytest.approx(alpha)
    assert table.lookup("shufflenet_v2_x1_0", np.array([64]), np.array([0.5]), WORKLOADS)[0] == pytest.approx(600.0)
    # resnet18 was never measured alone: inferred from its task in the mix (alone on its core)
    # with the median exponent of the measured models
    assert table.exponent("resnet18") == pytest.approx(alpha)
    assert table.alone("resnet18", np.array([64]), WORKLOADS)[0] == pytest.approx(400.0 / 0.5**alpha)


def test_a_standalone_speed_growing_faster_than_the_batch_is_repaired():
    # 1/P = t0/B + t1 with t0 = 0.02 s, t1 = 1 ms; the B = 16 point disturbed (a third of the law)
    law_p = {b: 1.0 / (0.02 / b + 0.001) for b in (16, 32, 64, 128, 256)}
    samples = [
        ProfiledTask(f"s{b}", (MixTask("resnet18", b, 100),), 0, p / 3 if b == 16 else p) for b, p in law_p.items()
    ]
    table = SoloTable.from_samples(samples, WORKLOADS, units=2)
    assert table.alone("resnet18", np.array([16]), WORKLOADS)[0] == pytest.approx(law_p[16], rel=1e-6)
    assert table.alone("resnet18", np.array([64]), WORKLOADS)[0] == pytest.approx(law_p[64], rel=1e-9)


def test_packed_sharing_rate_weights_multithreaded_tasks_by_how_often_they_are_runnable():
    # 2 cores: a 2-core task (100 %) with a 1-core task (50 %) on core 0
    share, present = np.array([[100, 50, 0, 0]]), np.array([[True, True, False, False]])
    rate = sharing_rate(share, present, 2, "packed", weight=1.0)[0]
    assert rate[:2] == pytest.approx([(1 / 2 + 1) / 2, 1 / 2])  # mean over its cores of 1 / tasks there
    rate = sharing_rate(share, present, 2, "packed", weight=0.5)[0]
    # core 0: the 2-thread task runnable half the time → 0.5 / 1.5 of it; the 1-thread task 1 / 1.5
    assert rate[:2] == pytest.approx([(0.5 / 1.5 + 1.0) / 2, 1 / 1.5])
    # disjoint windows: nobody slows down; pooled: oversubscription for everyone
    assert sharing_rate(np.array([[50, 50, 0, 0]]), present, 2, "packed", 0.5)[0, :2] == pytest.approx([1, 1])
    assert sharing_rate(share, present, 100, "pooled")[0, :2] == pytest.approx([1 / 1.5, 1 / 1.5])


def test_a_multithreaded_task_with_a_core_of_its_own_weighs_its_escape_weight_on_shared_cores():
    present = np.array([[True, True, True, False]])
    # 2-core task beside a 1-core task on core 0: core 1 is its own → escape weight 0.2 there
    pair = np.array([[100, 50, 0, 0]])
    rate = sharing_rate(pair, present[:, [0, 1, 3, 3]], 2, "packed", weight=0.5, escape_weight=0.2)[0]
    assert rate[:2] == pytest.approx([(0.2 / 1.2 + 1.0) / 2, 1 / 1.2])
    # two 1-core tasks, one on each core: no core of its own → the ordinary weight 0.5
    trio = np.array([[100, 50, 50, 0]])
    rate = sharing_rate(trio, present, 2, "packed", weight=0.5, escape_weight=0.2)[0]
    assert rate[:3] == pytest.approx([0.5 / 1.5, 1 / 1.5, 1 / 1.5])
    assert rate[:3] == pytest.approx(sharing_rate(trio, present, 2, "packed", weight=0.5)[0, :3])


def test_slice_labels_name_each_tasks_units_and_whether_another_task_shares_them():
    mixes = [
        [MixTask("a", 32, 100)],  # alone on both cores
        [MixTask("a", 32, 50), MixTask("b", 32, 50)],  # one core each
        [MixTask("a", 32, 100), MixTask("b", 32, 50)],  # b on core 0, inside a's window
    ]
    enc = encode_mixes(mixes, ["a", "b"])
    space = FeatureSpace(("a", "b"), {}, SoloTable(curves={}, exponents={}, flop_rate=1.0), 2, "packed")
    assert slice_labels(space, enc).tolist() == [
        ["2 units, alone", ""],
        ["1 unit, alone", "1 unit, alone"],
        ["2 units, shared", "1 unit, shared"],
    ]
    pooled = FeatureSpace(("a", "b"), {}, SoloTable(curves={}, exponents={}, flop_rate=1.0), 2, "pooled")
    assert slice_labels(pooled, enc)[:, :2].tolist() == [
        ["within the device", ""],
        ["within the device", "within the device"],
        ["oversubscribed", "oversubscribed"],
    ]


def test_held_out_error_by_slice_recombines_to_the_overall_figure(fitted):
    _predictor, report = fitted
    for family in report.families:
        counts = {k: sum(h["slice"] == k for h in report.heldout) for k in family.by_slice}
        assert sum(counts.values()) == report.samples and all(counts.values())
        pooled = math.sqrt(sum(n * family.by_slice[k] ** 2 for k, n in counts.items()) / report.samples)
        assert pooled == pytest.approx(family.rmsle, rel=1e-9)


def test_held_out_standalone_speeds_do_not_reach_the_baseline():
    # the baseline predicts a held-out 1-task full-share configuration without its own
    # measurement (the SoloTable is refitted in every fold from the training mixes only)
    samples = synthetic(220)
    _predictor, report = fit_predictor(samples, WORKLOADS, cores=100, families=("baseline",), folds=4)
    solo_full = {
        (s.mix[0].architecture, round(s.throughput_sps, 6))
        for s in samples
        if len(s.mix) == 1 and s.mix[0].share == 100
    }
    assert solo_full
    held = [
        h
        for h in report.heldout
        if h["mix_size"] == 1 and (h["architecture"], round(h["measured_sps"], 6)) in solo_full
    ]
    assert held and all(h["predicted_sps"] != pytest.approx(h["measured_sps"], rel=1e-9) for h in held)


def test_normalise_speed_scales_each_sample_to_the_median_host_speed():
    mix = (MixTask("resnet18", 64, 100),)
    samples = [
        ProfiledTask("a", mix, 0, 100.0, 90.0, None, 2.0),
        ProfiledTask("b", mix, 0, 150.0, 90.0, None, 3.0),
        ProfiledTask("c", mix, 0, 130.0, 90.0, None, 2.5),
        ProfiledTask("run", mix, 0, 80.0, 90.0),
    ]
    normalised, reference = normalise_speed(samples)
    assert reference == pytest.approx(2.5)
    # the same configuration at two host speeds agrees once each is put at the reference speed
    assert [s.throughput_sps for s in normalised[:3]] == pytest.approx([125.0, 125.0, 130.0])
    # a standalone speed measured at another moment is dropped; a sample without an index is kept
    assert [s.standalone_sps for s in normalised] == [None, None, None, 90.0]
    assert normalised[3] == samples[3]
    assert normalise_speed(samples[3:]) == (samples[3:], None)


def test_speed_probe_readings_take_the_host_speed_out_of_the_held_out_error():
    # The law's throughputs measured at host speeds varying by ±30 % (log-normal), each with
    # the speed its probe read: the fit on normalised samples sees the law, the raw one noise.
    rng = np.random.default_rng(3)
    clean = synthetic(220)
    speeds = {key: float(np.exp(rng.normal(0, 0.3))) for key in {s.config_key for s in clean}}
    measured = [
        ProfiledTask(
            s.config_key,
            s.mix,
            s.task_index,
            s.throughput_sps * speeds[s.config_key],
            None,
            s.peak_memory_bytes,
            5.0 * speeds[s.config_key],
        )
        for s in clean
    ]
    raw = [
        ProfiledTask(s.config_key, s.mix, s.task_index, s.throughput_sps, None, s.peak_memory_bytes) for s in measured
    ]
    families = ("baseline", "extra_trees")
    predictor, report = fit_predictor(measured, WORKLOADS, cores=100, families=families, folds=4)
    _p, raw_report = fit_predictor(raw, WORKLOADS, cores=100, families=families, folds=4)
    best = min(f.rmsle for f in report.families)
    assert best < 0.15 < 0.25 < min(f.rmsle for f in raw_report.families)
    reference = predictor.space.reference_speed_index
    assert reference == pytest.approx(float(np.median([s.speed_index for s in measured])))
    assert predictor.space.spec()["reference_speed_index"] == reference
    # predictions are throughputs at the reference speed: the law scaled by reference / 5
    mixes = [s.mix for s in clean[:40]]
    truth = np.array([law(m, j) for m in mixes for j in range(len(m))]) * reference / 5.0
    predicted = np.array([p for row in predictor.predict(mixes) for p in row])
    assert rmsle(predicted, truth) < 0.15


def test_the_physical_model_is_refitted_jointly_on_every_measured_task():
    # Throughputs that follow the baseline's own law on 2 packed cores (a per-iteration time
    # law per model, slice exponents α for the per-sample time and β for the per-iteration
    # overhead, sharing weights w = 0.4 and 0.3 for a task with a core of its own); resnet18
    # is never measured alone, and the starting tables are wrong: the joint fit recovers all
    # of it from the mixes.
    laws = {"resnet18": (0.02, 0.004), "mobilenet_v3_small": (0.03, 0.001)}
    alphas = {"resnet18": 0.9, "mobilenet_v3_small": 0.6}
    betas = {"resnet18": 0.4, "mobilenet_v3_small": 0.1}
    archs = tuple(sorted(laws))
    rng = np.random.default_rng(0)
    mixes = [(MixTask("mobilenet_v3_small", b, 100),) for b in (16, 64, 256)]
    for _ in range(60):
        mixes.append(
            tuple(
                MixTask(archs[rng.integers(2)], int(rng.choice([16, 32, 64, 128, 256])), int(rng.choice([25, 50, 100])))
                for _ in range(int(rng.integers(1, 4)))
            )
        )
    mixes = [m for m in mixes if not (len(m) == 1 and m[0].architecture == "resnet18" and m[0].share == 100)]
    enc = encode_mixes(mixes, archs)
    truth = SoloTable(exponents=alphas, laws=laws, overhead_exponents=betas)
    truth_space = FeatureSpace(archs, WORKLOADS, truth, 2, "packed", 0.4, escape_weight=0.3)
    measured = np.where(enc.present, truth_space.slot_arrays(enc)["baseline"], np.nan)
    wrong = SoloTable(curves={a: [(16, 50.0), (256, 100.0)] for a in archs}, exponents={a: 1.0 for a in archs})
    fitted = fit_physical(FeatureSpace(archs, WORKLOADS, wrong, 2, "packed", 1.0), enc, measured)
    assert fitted.sharing_weight == pytest.approx(0.4, abs=0.02)
    assert fitted.escape_weight == pytest.approx(0.3, abs=0.05)  # against its prior's 0.2
    for arch in archs:
        assert fitted.solo.laws[arch] == pytest.approx(laws[arch], rel=0.05)
        assert fitted.solo.exponent(arch) == pytest.approx(alphas[arch], abs=0.05)
        assert fitted.solo.overhead_exponents[arch] == pytest.approx(betas[arch], abs=0.05)
    assert rmsle(fitted.slot_arrays(enc)["baseline"][enc.present], measured[enc.present]) < 0.01


def test_with_a_fitted_law_a_slice_speeds_up_the_per_sample_work_more_than_the_overhead():
    # B / (t0·g^-β + t1·B·g^-α): a larger batch is mostly per-sample work, so doubling the
    # slice speeds it up by nearly 2^α; a small batch is mostly overhead, nearer 2^β.
    table = SoloTable(
        exponents={"resnet18": 1.0}, laws={"resnet18": (0.02, 0.001)}, overhead_exponents={"resnet18": 0.0}
    )
    batch = np.array([4.0, 4096.0])
    half = table.lookup("resnet18", batch, np.array([0.5, 0.5]), WORKLOADS)
    whole = table.lookup("resnet18", batch, np.array([1.0, 1.0]), WORKLOADS)
    assert whole == pytest.approx(batch / (0.02 + 0.001 * batch))
    assert half == pytest.approx(batch / (0.02 + 0.002 * batch))
    speedup = whole / half
    assert speedup[0] == pytest.approx(1.0 + 0.004 / 0.024, rel=1e-9)  # mostly overhead: 1.17×
    assert speedup[1] > 1.99


def _two_placements(enc, rng):
    """Cross-core round trips of a 2-core host switching between near (230 ns) and far (500 ns)
    placements, per configuration; ``nan`` for tasks on one core."""
    per_config = rng.choice([230.0, 500.0], size=(len(enc.arch), 1))
    multi = enc.present & (granted_fraction(enc.share, 2) > 0.75)
    return np.where(multi, per_config, np.nan)


def test_the_link_exponent_is_fitted_from_tasks_measured_at_both_placements():
    # The joint law of the test above with a placement effect: a task alone on both cores
    # runs (rtt/230)^-0.5 as fast; tasks on one core, or sharing a core, do not notice. The
    # fit recovers the exponent against its prior at 0.
    laws = {"resnet18": (0.02, 0.004), "mobilenet_v3_small": (0.03, 0.001)}
    archs = tuple(sorted(laws))
    rng = np.random.default_rng(1)
    mixes = [
        tuple(
            MixTask(archs[rng.integers(2)], int(rng.choice([16, 32, 64, 128, 256])), int(rng.choice([25, 50, 100])))
            for _ in range(int(rng.integers(1, 4)))
        )
        for _ in range(80)
    ]
    enc = encode_mixes(mixes, archs)
    enc = replace(enc, rtt=_two_placements(enc, rng))
    truth = SoloTable(exponents={a: 0.8 for a in archs}, laws=laws, overhead_exponents={a: 0.4 for a in archs})
    truth_space = FeatureSpace(
        archs,
        WORKLOADS,
        truth,
        2,
        "packed",
        0.5,
        escape_weight=0.2,
        reference_cross_core_rtt_ns=230.0,
        link_exponent=0.5,
    )
    measured = np.where(enc.present, truth_space.slot_arrays(enc)["baseline"], np.nan)
    x = truth_space.link_log_ratio(enc)
    alone_on_both = (enc.present.sum(axis=1) == 1)[:, None] & ~np.isnan(enc.rtt)
    assert (x[~alone_on_both] == 0).all()  # one core, or beside another task: no link term
    assert set(np.round(x[alone_on_both], 6)) == {0.0, round(math.log(500 / 230), 6)}
    start = SoloTable(curves={a: [(16, 50.0), (256, 100.0)] for a in archs}, exponents={a: 1.0 for a in archs})
    fitted = fit_physical(
        FeatureSpace(archs, WORKLOADS, start, 2, "packed", 1.0, reference_cross_core_rtt_ns=230.0), enc, measured
    )
    assert fitted.link_exponent == pytest.approx(0.5, abs=0.05)
    assert rmsle(fitted.slot_arrays(enc)["baseline"][enc.present], measured[enc.present]) < 0.01
    # without a reference (samples never probed) there is no link term and nothing to fit
    plain = fit_physical(FeatureSpace(archs, WORKLOADS, start, 2, "packed", 1.0), enc, measured)
    assert plain.link_exponent == 0.0 and plain.spec()["reference_cross_core_rtt_ns"] is None


def test_a_predictor_fitted_on_probed_links_predicts_at_the_near_placement():
    # Samples from the physical law on 2 packed cores (2 % noise), tasks alone on both cores
    # slowed by (rtt/230)^-0.6 when the host placed the cores far apart (500 ns): the
    # predictor fitted on the probed samples learns it and predicts at the near placement;
    # blind to the probe, its held-out error carries the placement's ±30 %.
    laws = {"resnet18": (0.02, 0.004), "mobilenet_v3_small": (0.03, 0.001), "shufflenet_v2_x1_0": (0.025, 0.0008)}
    archs = tuple(sorted(laws))
    rng = np.random.default_rng(5)
    mixes = [
        tuple(
            MixTask(archs[rng.integers(3)], int(rng.choice([16, 32, 64, 128, 256])), int(rng.choice([25, 50, 75, 100])))
            for _ in range(int(rng.integers(1, 4)))
        )
        for _ in range(120)
    ]
    enc = encode_mixes(mixes, archs)
    enc = replace(enc, rtt=_two_placements(enc, rng))
    truth = FeatureSpace(
        archs,
        WORKLOADS,
        SoloTable(exponents={a: 0.8 for a in archs}, laws=laws, overhead_exponents={a: 0.4 for a in archs}),
        2,
        "packed",
        0.5,
        escape_weight=0.2,
        reference_cross_core_rtt_ns=230.0,
        link_exponent=0.6,
    )
    speed = truth.slot_arrays(enc)["baseline"] * np.exp(rng.normal(0, 0.02, enc.arch.shape))
    measured = [
        ProfiledTask(
            f"c{r}",
            mix,
            j,
            float(speed[r, j]),
            None,
            None,
            None,
            None if np.isnan(enc.rtt[r, j]) else float(enc.rtt[r, j]),
        )
        for r, mix in enumerate(mixes)
        for j in range(len(mix))
    ]
    unprobed = [replace(s, cross_core_rtt_ns=None) for s in measured]
    # One mix held out at a time: with three models, folds of several mixes can hold out every
    # 1-task mix together, and only those put a 2-core task alone on its cores to fit γ from.
    logo = dict(folds=10_000, partitions=1)
    predictor, report = fit_predictor(measured, WORKLOADS, cores=2, placement="packed", families=("baseline",), **logo)
    _p, blind = fit_predictor(unprobed, WORKLOADS, cores=2, placement="packed", families=("baseline",), **logo)
    assert predictor.space.reference_cross_core_rtt_ns == pytest.approx(230.0)  # 10th percentile: near
    assert predictor.space.spec()["reference_cross_core_rtt_ns"] == predictor.space.reference_cross_core_rtt_ns
    assert predictor.space.link_exponent == pytest.approx(0.6, abs=0.1)
    assert predictor.space.spec()["link_exponent"] == predictor.space.link_exponent
    probed_alone, blind_alone = report.families[0].by_mix_size[1], blind.families[0].by_mix_size[1]
    assert probed_alone < 0.04 < 0.12 < blind_alone  # the 1-task mixes are where the placement shows
    assert report.families[0].rmsle < 0.04 < 0.06 < blind.families[0].rmsle
    # a configuration to predict has no round trip: the near placement, the law's own speed
    alone = [(MixTask(a, 64, 100),) for a in archs]
    near = replace(encode_mixes(alone, archs), rtt=np.full((len(alone), 1), 230.0))
    assert (
        rmsle(np.array([row[0] for row in predictor.predict(alone)]), truth.slot_arrays(near)["baseline"][:, 0]) < 0.05
    )


def test_the_physical_fit_jacobian_is_the_derivative_of_its_residuals(monkeypatch):
    # fit_physical hands scipy an analytic Jacobian (about 3 residual evaluations instead of
    # 4k + 4): it must be the residuals' derivative, checked by central differences at the
    # start and at the solution, on 2 packed cores with both placements probed (every
    # parameter, the sharing weights, γ and the passive-wait ratio κ included, moves some
    # residual).
    import scipy.optimize

    laws = {"resnet18": (0.02, 0.004), "mobilenet_v3_small": (0.03, 0.001), "shufflenet_v2_x1_0": (0.025, 0.0008)}
    archs = tuple(sorted(laws))
    rng = np.random.default_rng(11)
    mixes = [
        tuple(
            MixTask(archs[rng.integers(3)], int(rng.choice([16, 64, 256])), int(rng.choice([25, 50, 100])))
            for _ in range(int(rng.integers(1, 4)))
        )
        for _ in range(60)
    ]
    enc = encode_mixes(mixes, archs)
    enc = replace(enc, rtt=_two_placements(enc, rng))
    truth = FeatureSpace(
        archs,
        WORKLOADS,
        SoloTable(exponents={a: 0.8 for a in archs}, laws=laws, overhead_exponents={a: 0.4 for a in archs}),
        2,
        "packed",
        0.5,
        escape_weight=0.2,
        reference_cross_core_rtt_ns=230.0,
        link_exponent=0.6,
        passive_ratio=0.8,
    )
    measured = np.where(
        enc.present, truth.slot_arrays(enc)["baseline"] * np.exp(rng.normal(0, 0.05, enc.arch.shape)), np.nan
    )
    start = replace(
        truth,
        solo=SoloTable(exponents={a: 1.0 for a in archs}, laws={a: (2 * t0, 0.5 * t1) for a, (t0, t1) in laws.items()}),
        sharing_weight=0.8,
        escape_weight=0.5,
        link_exponent=0.0,
    )
    seen = []
    real = scipy.optimize.least_squares

    def checking(fun, x0, jac, **kw):
        solution = real(fun, x0, jac=jac, **kw)
        lower, upper = kw["bounds"]
        for theta in (x0, solution.x):
            numeric = np.empty_like(jac(theta))
            for i in range(len(theta)):
                h = 1e-6 * max(1.0, abs(theta[i]))
                if upper[i] - lower[i] < 1e-6:  # held fixed by its bounds: scipy never moves it
                    numeric[:, i] = jac(theta)[:, i]
                    continue
                up, down = theta.copy(), theta.copy()
                up[i], down[i] = min(theta[i] + h, upper[i]), max(theta[i] - h, lower[i])
                numeric[:, i] = (fun(up) - fun(down)) / (up[i] - down[i])
            np.testing.assert_allclose(jac(theta), numeric, rtol=1e-4, atol=1e-6)
        seen.append(solution)
        return solution

    monkeypatch.setattr(scipy.optimize, "least_squares", checking)
    fitted_space = fit_physical(start, enc, measured)
    assert len(seen) == 1 and seen[0].success
    assert fitted_space.link_exponent == pytest.approx(0.6, abs=0.15)  # what the data were made with
    assert fitted_space.sharing_weight == pytest.approx(0.5, abs=0.15)
    assert fitted_space.passive_ratio == pytest.approx(0.8, abs=0.3)
    assert fitted_space.spec()["passive_ratio"] == fitted_space.passive_ratio


@pytest.mark.parametrize("cores", [2, 3, 4])
def test_passive_wait_marks_the_trainers_the_cpu_backend_starts_with_a_passive_wait_policy(cores):
    # The predictor's δ applies exactly where the cpu backend sets OMP_WAIT_POLICY=PASSIVE on a
    # trainer with several threads: its window overlaps another trainer's.
    from workers.backends.base import AgentContext
    from workers.backends.cpu import CpuBackend

    ctx = AgentContext(
        device="d", cores=list(range(cores)), state_dir=Path("/nonexistent"), artifact_root=Path("/nonexistent")
    )
    rng = np.random.default_rng(3)
    for _ in range(200):
        shares = [int(rng.choice([10, 25, 40, 50, 60, 75, 90, 100])) for _ in range(int(rng.integers(1, MAX_MIX + 1)))]
        share = np.zeros((1, MAX_MIX))
        present = np.zeros((1, MAX_MIX), dtype=bool)
        share[0, : len(shares)], present[0, : len(shares)] = shares, True
        resources = CpuBackend().resources_for_shares(shares, "mps", ctx)
        expected = [r.threads > 1 and r.env.get("OMP_WAIT_POLICY") == "PASSIVE" for r in resources]
        assert passive_wait(share, present, cores)[0, : len(shares)].tolist() == expected, shares
        assert not passive_wait(share, present, cores)[0, len(shares) :].any()


def test_without_a_task_waiting_passively_the_passive_wait_ratio_is_not_set():
    # κ is only fitted from tasks that waited passively: with 2-thread tasks only ever alone on
    # the device (and on a 1-core device, where no task has 2 threads) it stays 0, so no cost
    # is predicted, stored or stated that no measurement showed.
    laws = {"resnet18": (0.02, 0.004), "mobilenet_v3_small": (0.03, 0.001)}
    archs = tuple(sorted(laws))
    truth = SoloTable(exponents={a: 0.8 for a in archs}, laws=laws, overhead_exponents={a: 0.4 for a in archs})
    rng = np.random.default_rng(2)
    for cores, shares in ((2, (25, 50)), (1, (25, 50, 100))):
        mixes = [(MixTask(a, b, 100),) for a in archs for b in (16, 64, 256)]
        mixes += [
            tuple(
                MixTask(archs[rng.integers(2)], int(rng.choice([16, 64, 256])), int(rng.choice(shares)))
                for _ in range(int(rng.integers(2, 4)))
            )
            for _ in range(30)
        ]
        enc = encode_mixes(mixes, archs)
        space = FeatureSpace(archs, WORKLOADS, truth, cores, "packed", 0.5, escape_weight=0.2)
        assert not passive_wait(enc.share, enc.present, cores).any()
        measured = np.where(enc.present, space.slot_arrays(enc)["baseline"], np.nan)
        start = replace(
            space,
            solo=SoloTable(
                exponents={a: 1.0 for a in archs}, laws={a: (2 * t0, 0.5 * t1) for a, (t0, t1) in laws.items()}
            ),
        )
        fitted = fit_physical(start, enc, measured)
        assert fitted.passive_ratio == 0.0 and fitted.spec()["passive_ratio"] == 0.0


def test_fitting_holds_native_thread_pools_to_one_thread_and_gives_them_back(monkeypatch):
    # Gradient boosting's OpenMP threads spin while they wait: beside another busy process on
    # a 2-core machine one cross-validation ran past 280 s instead of 8 s. Fitting holds BLAS
    # and OpenMP to one thread; the caller's settings come back afterwards.
    from sklearn.ensemble import ExtraTreesRegressor
    from threadpoolctl import threadpool_info, threadpool_limits

    import controlplane.planning.predictor.fit as fit_module

    seen = []

    class Recording(ExtraTreesRegressor):
        def fit(self, X, y):
            seen.append([pool["num_threads"] for pool in threadpool_info()])
            return super().fit(X, y)

    monkeypatch.setattr(fit_module, "make_model", lambda family, seed: Recording(n_estimators=5, random_state=seed))
    with threadpool_limits(limits=2):  # the caller's setting, 2 even on a 1-core machine
        fit_predictor(synthetic(40), WORKLOADS, cores=100, families=("extra_trees",), folds=2, partitions=1)
        after = [pool["num_threads"] for pool in threadpool_info()]
    assert len(seen) == 3  # 2 folds and the refit on everything
    assert seen[0] and all(threads == [1] * len(seen[0]) for threads in seen)
    assert after == [2] * len(after)


# ------------------------------------------------------------------------------------ physics


def _random_mixes(seed: int, rows: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    share = np.zeros((rows, MAX_MIX))
    present = np.zeros((rows, MAX_MIX), dtype=bool)
    for r in range(rows):
        k = int(rng.integers(1, MAX_MIX + 1))
        share[r, :k] = rng.choice([10, 25, 40, 50, 60, 75, 100], size=k)
        present[r, :k] = True
    return share, present


@pytest.mark.parametrize("placement", sorted(PHYSICS))
@pytest.mark.parametrize("units", [1, 2, 4, 100])
def test_every_physics_keeps_the_interfaces_contract(placement, units):
    # What the generic part relies on, for every physics in the table (a new one included).
    physics = physics_for(placement)
    assert physics.placement == placement
    share, present = _random_mixes(units)
    rate = physics.sharing_rate(share, present, units, 0.5, 0.2)
    assert rate.shape == share.shape and (rate[present] > 0).all() and (rate[present] <= 1).all()
    alone = physics.alone(share, present, units)
    single = present.sum(axis=1) == 1
    assert alone[single, 0].all()  # a task alone in its mix has its units to itself
    assert (physics.sharing_rate(share, present, units)[single, 0] == 1).all()
    terms = physics.slot_terms(share, present, units)
    assert (terms.contention >= 1).all() and (terms.worst >= terms.contention - 1e-12).all()
    assert not terms.passive[~present].any() and not terms.passive[single].any()
    labels = physics.slice_labels(share, present, units)
    assert ((labels == "") == ~present).all()
    assert (physics.link_log_ratio(share, present, units, None, 300.0) == 0).all()
    assert (physics.link_log_ratio(share, present, units, np.full(share.shape, np.nan), 300.0) == 0).all()


def test_physics_is_chosen_by_placement_and_backend_and_an_unknown_one_is_refused():
    assert isinstance(physics_for("packed"), CpuPhysics) and isinstance(physics_for("pooled"), GpuPhysics)
    assert placement_for_backend("cpu") == "packed"
    assert {placement_for_backend(b) for b in ("cuda-mps", "cuda-timeslice", "simulated")} == {"pooled"}
    with pytest.raises(PredictorError, match="placement: 'numa' is not allowed; allowed: packed, pooled"):
        physics_for("numa")
    with pytest.raises(PredictorError, match="placement: 'numa'"):
        fit_predictor(synthetic(40), WORKLOADS, cores=2, placement="numa", families=("baseline",))


def test_a_gpu_has_no_placement_term_whatever_the_samples_carry():
    # Round trips between cores are a cpu host's measurement; under MPS a share is not a place.
    share = np.array([[100.0, 0, 0, 0], [60.0, 60.0, 0, 0]])
    present = share > 0
    rtt = np.array([[900.0, np.nan, np.nan, np.nan], [900.0, 900.0, np.nan, np.nan]])
    gpu = physics_for("pooled")
    assert gpu.link_reference(np.array([300.0, 900.0])) is None
    assert (gpu.link_log_ratio(share, present, 100, rtt, 300.0) == 0).all()
    cpu = physics_for("packed")
    assert cpu.link_log_ratio(share, present, 2, rtt, 300.0)[0, 0] == pytest.approx(math.log(3.0))


def test_the_generic_modules_reach_a_backends_physics_only_through_the_interface():
    # Nothing outside predictor/physics/ imports a backend family's module (cpu.py, gpu.py):
    # they ask the table for a Physics and call it.
    import ast

    package = Path(__file__).resolve().parents[2] / "controlplane" / "planning" / "predictor"
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("controlplane.planning.predictor.physics."), (path.name, node.module)


def test_the_physical_fit_of_a_real_gpu_profile_stays_finite():
    """The H200 profile of the first GPU check (benchmarks/results/gpu_check_h200) sent the
    solver's trial steps to times that overflowed ``exp`` and throughputs of 0 into ``log``."""
    import importlib.util
    import json
    import warnings

    from controlplane.planning.predictor import ModelWorkload, fit_predictor
    from workers.protocol.messages import ProfileConfigResult

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("gpu_check", root / "benchmarks" / "gpu_check.py")
    assert spec and spec.loader
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    data = json.loads((root / "benchmarks/results/gpu_check_h200/light_short.json").read_text())
    results = [ProfileConfigResult.model_validate(c) for c in data["profile"]["configs"]]
    # Workload features of the three models as the check computed them (GFLOP and parameters
    # printed in its log); the fit's overflow does not depend on their exact values.
    workloads = {
        "resnet18": ModelWorkload(0.217e9, 2.0e6, 11.2e6, 44.8e6),
        "mobilenet_v3_large": ModelWorkload(0.042e9, 3.0e6, 4.2e6, 16.8e6),
        "shufflenet_v2_x1_0": ModelWorkload(0.017e9, 1.5e6, 1.3e6, 5.2e6),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        predictor, report = fit_predictor(
            gpu_check.to_samples(results), workloads, cores=132, placement="pooled", families=["baseline"], seed=0
        )
    assert report.kept == "baseline"
    assert all(math.isfinite(f.rmsle) for f in report.families)
