"""Profiling on the control plane: sweeps and their samples, the closed loop from FL rounds,
fitting and loading predictors, workload features, and their API and pages."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from django.core.management import call_command

from controlplane.common.errors import ApplicationError
from controlplane.dashboard import figures as dashboard_figures
from controlplane.experiments.models import Assignment, Round, Run
from controlplane.experiments.services.samples import samples_from_round
from controlplane.planning.predictor import MAX_MIX, MixTask, passive_wait
from controlplane.profiling import services
from controlplane.profiling.models import Predictor, ProfileSample, ProfileSweep
from tests.controlplane.contention_law import store_synthetic_samples
from tests.controlplane.test_api import _queued_control_messages
from workers.protocol.queues import TaskName

pytestmark = pytest.mark.django_db


def _config_result(sweep: ProfileSweep, index: int, mix: list[tuple[str, int, int]], throughputs: list[float]) -> dict:
    return {
        "sweep_id": sweep.id,
        "device": sweep.device.name,
        "config_index": index,
        "tasks": [{"architecture": a, "batch_size": b, "active_thread_percentage": r} for a, b, r in mix],
        "measurements": [
            {
                "task_index": i,
                "architecture": a,
                "batch_size": b,
                "active_thread_percentage": r,
                "throughput_sps": p,
                "standalone_sps": 2 * p,
                "peak_memory_bytes": 400_000_000,
                "timed_iterations": 4,
                "speed_index": 14.0 + index,
                "cross_core_rtt_ns": 230.0 if r > 50 else None,
            }
            for i, ((a, b, r), p) in enumerate(zip(mix, throughputs, strict=True))
        ],
        "started_at": 1000.0 + index,
        "finished_at": 1001.0 + index,
        "status": "succeeded",
    }


@pytest.fixture
def sweep(make_device, django_capture_on_commit_callbacks):
    device = make_device("prof-a")
    _queued_control_messages()
    with django_capture_on_commit_callbacks(execute=True):
        return services.sweep_start(device=device, budget_s=60, architectures=["resnet18", "mobilenet_v3_small"])


def test_a_sweep_is_sent_to_the_device_with_a_watchdog(sweep):
    assert sweep.request["device"] == "prof-a" and sweep.request["budget_s"] == 60.0
    assert sweep.request["architectures"] == ["resnet18", "mobilenet_v3_small"]
    assert [name for name, _ in _queued_control_messages()] == [TaskName.PROFILE_SWEEP_WATCHDOG]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"budget_s": 1}, "budget_s"),
        ({"budget_s": 60, "architectures": ["alexnet"]}, "architectures"),
        ({"budget_s": 60, "max_mix": 9}, "max_mix"),
        ({"budget_s": 60, "batch_sizes": [1]}, "batch_sizes"),
    ],
)
def test_sweep_input_is_checked(make_device, kwargs, field):
    with pytest.raises(ApplicationError) as info:
        services.sweep_start(device=make_device("prof-b"), **kwargs)
    assert info.value.field == field


def test_a_device_without_an_agent_cannot_be_profiled(make_device):
    with pytest.raises(ApplicationError, match="never connected") as info:
        services.sweep_start(device=make_device("ghost", connected=False), budget_s=60)
    assert info.value.status_code == 409


def test_measured_configurations_become_samples_once(sweep):
    result = _config_result(sweep, 0, [("resnet18", 32, 50), ("mobilenet_v3_small", 64, 70)], [40.0, 150.0])
    assert services.profile_record(result=result) == 2
    assert services.profile_record(result=result) == 0  # a duplicate delivery
    sweep.refresh_from_db()
    assert (sweep.status, sweep.configs, sweep.samples) == ("running", 1, 2)
    sample = ProfileSample.objects.get(task_index=1)
    assert sample.configuration[0]["architecture"] == "resnet18" and sample.mix_size == 2
    assert sample.device_class == "cpu-2cores" and sample.standalone_sps == 300.0
    assert sample.speed_index == 14.0
    assert sample.cross_core_rtt_ns == 230.0  # 70 % of 2 cores: both cores, the link probed
    assert ProfileSample.objects.get(task_index=0).cross_core_rtt_ns is None  # 50 %: one core
    services.profile_done(
        summary={
            "sweep_id": sweep.id,
            "device": "prof-a",
            "status": "succeeded",
            "configs": 1,
            "samples": 2,
            "repeat_spread": [0.02, 0.05],
        }
    )
    sweep.refresh_from_db()
    assert sweep.status == "succeeded" and sweep.max_repeat_spread == 0.05


def test_a_record_handled_after_the_end_of_its_sweep_keeps_the_sweep_ended(sweep):
    # The control worker handles messages concurrently: the last configuration's record can be
    # stored after the agent's summary closed the sweep (seen in a clean clone's test run).
    services.profile_record(result=_config_result(sweep, 0, [("resnet18", 32, 100)], [90.0]))
    services.profile_done(
        summary={
            "sweep_id": sweep.id,
            "device": "prof-a",
            "status": "succeeded",
            "configs": 2,
            "samples": 2,
            "repeat_spread": [],
        }
    )
    assert services.profile_record(result=_config_result(sweep, 1, [("resnet18", 64, 100)], [120.0])) == 1
    sweep.refresh_from_db()
    assert (sweep.status, sweep.configs, sweep.samples) == ("succeeded", 2, 2)


def test_a_sweep_whose_agent_goes_silent_fails_but_keeps_its_samples(sweep):
    services.profile_record(result=_config_result(sweep, 0, [("resnet18", 32, 100)], [90.0]))
    services.sweep_watchdog(sweep_id=sweep.id)
    sweep.refresh_from_db()
    assert sweep.status == "failed" and "did not report the end" in sweep.error
    assert ProfileSample.objects.filter(sweep=sweep).count() == 1


def test_measured_assignments_of_shared_rounds_become_samples(make_experiment):
    experiment = make_experiment()
    for strategy in ("sharing", "temporal"):
        run = Run.objects.create(experiment=experiment, strategy=strategy, status="running")
        rnd = Round.objects.create(run=run, index=0, status="succeeded")
        for shard in experiment.shards.all():
            Assignment.objects.create(
                round=rnd,
                device=shard.device,
                task=shard.task,
                batch_size=8,  # 5 to 9 iterations: at least 3 timed after the 2 of warm-up
                active_thread_percentage=100,
                samples=shard.num_samples,
                throughput_sps=55.0,
                standalone_throughput_sps=80.0,
                status="succeeded",
            )
        stored = samples_from_round(round_id=rnd.id)
        assert stored == (4 if strategy == "sharing" else 0)  # time-sliced tasks do not run at their shares
    samples = ProfileSample.objects.filter(source="run")
    assert samples.count() == 4 and {s.mix_size for s in samples} == {2}
    assert all(s.assignment_id for s in samples)


def test_a_fitted_predictor_is_stored_and_loads_back(make_device, settings):
    store_synthetic_samples(make_device("prof-c"))
    predictor = services.predictor_fit(backend="cpu")
    assert predictor.status == "ready", predictor.error
    assert predictor.version == 1 and predictor.device_class == "cpu-2cores"
    assert set(predictor.metrics) == {"baseline", "random_forest", "gradient_boosting", "extra_trees"}
    assert predictor.heldout_rmsle == min(m["rmsle"] for m in predictor.metrics.values())
    assert len(predictor.heldout) == predictor.training_samples
    model = services.predictor_load(predictor)
    [[p]] = model.predict([(MixTask("resnet18", 64, 100),)])
    assert p > 0
    assert services.predictor_fit(backend="cpu", families=("baseline",)).version == 2
    path = settings.ARTIFACT_ROOT / predictor.artifact_path
    path.write_bytes(path.read_bytes() + b"tampered")
    with pytest.raises(ApplicationError, match="does not match its sha256"):
        services.predictor_load(predictor)


def test_a_predictor_fitted_on_probed_samples_predicts_at_their_median_speed(make_device, browser_client, capsys):
    store_synthetic_samples(make_device("prof-s"), n=40)
    ids = list(ProfileSample.objects.order_by("id").values_list("id", flat=True))
    ProfileSample.objects.filter(id__in=ids[: len(ids) // 3]).update(speed_index=10.0)
    ProfileSample.objects.filter(id__in=ids[len(ids) // 3 :]).update(speed_index=20.0)
    ProfileSample.objects.filter(id=ids[-1]).update(speed_index=30.0)
    predictor = services.predictor_fit(backend="cpu", families=("baseline",))
    assert predictor.status == "ready", predictor.error
    assert predictor.feature_spec["reference_speed_index"] == 20.0
    assert services.predictor_load(predictor).space.reference_speed_index == 20.0
    page = browser_client.get(f"/predictors/{predictor.id}/").content.decode()
    assert re.search(r"predicted at the host's median speed, speed index\s+20\.0:", page)
    # `mtfl fit-predictor` says it too, under the family table
    call_command("fit_predictor", "--backend", "cpu", "--families", "baseline")
    printed = capsys.readouterr().out
    assert re.search(r"Predictor\s+v2", printed) and "baseline" in printed and "kept" in printed
    assert "random_forest" not in printed  # --families baseline compares that family only
    assert re.search(r"median\s+speed\s+\(speed\s+index\s+20\.0\)", printed)  # rich may wrap the line


def test_a_predictor_fitted_on_probed_links_says_which_placement_it_predicts(make_device, browser_client, capsys):
    store_synthetic_samples(make_device("prof-l"), n=40)
    multi = ProfileSample.objects.filter(active_thread_percentage__gte=75).order_by("id")  # both of 2 cores
    ids = list(multi.values_list("id", flat=True))
    assert len(ids) >= 10
    ProfileSample.objects.filter(id__in=ids[::2]).update(cross_core_rtt_ns=230.0)
    ProfileSample.objects.filter(id__in=ids[1::2]).update(cross_core_rtt_ns=600.0)
    predictor = services.predictor_fit(backend="cpu", families=("baseline",))
    assert predictor.status == "ready", predictor.error
    assert predictor.feature_spec["reference_cross_core_rtt_ns"] == pytest.approx(230.0)  # the near placement
    assert services.predictor_load(predictor).space.link_exponent == predictor.feature_spec["link_exponent"]
    page = browser_client.get(f"/predictors/{predictor.id}/").content.decode()
    assert re.search(r"predicted at the near placement, a cross-core round trip of\s+230 ns", page)
    call_command("fit_predictor", "--backend", "cpu", "--families", "baseline")
    assert re.search(r"near\s+placement\s+\(cross-core\s+round\s+trip\s+230\s+ns", capsys.readouterr().out)


def test_the_predictor_page_and_the_cli_state_the_passive_wait_ratio_when_one_was_seen(
    make_device, browser_client, capsys
):
    # Synthetic samples from the contention law, with every multi-threaded task on shared cores
    # (those the cpu backend starts with OMP_WAIT_POLICY=PASSIVE) 40 % slower: the fit sees a
    # passive-wait cost, says so on the page and in `mtfl fit-predictor`; a ratio at its floor
    # (no such cost seen) is not stated.
    store_synthetic_samples(make_device("prof-k"), n=60)
    slowed = 0
    for sample in ProfileSample.objects.all():
        share = np.zeros((1, MAX_MIX))
        present = np.zeros((1, MAX_MIX), dtype=bool)
        for k, task in enumerate(sample.configuration):
            share[0, k], present[0, k] = task["active_thread_percentage"], True
        if passive_wait(share, present, 2)[0, sample.task_index]:
            ProfileSample.objects.filter(id=sample.id).update(throughput_sps=0.6 * sample.throughput_sps)
            slowed += 1
    assert slowed >= 10
    call_command("fit_predictor", "--backend", "cpu", "--families", "baseline")
    printed = capsys.readouterr().out
    predictor = Predictor.objects.get(version=1)
    kappa = predictor.feature_spec["passive_ratio"]
    assert kappa > 0.1 and services.predictor_load(predictor).space.passive_ratio == kappa
    assert re.search(rf"pay\s+{kappa:.2f}\s+of\s+their\s+per-iteration\s+overhead", printed)  # rich may wrap
    page = browser_client.get(f"/predictors/{predictor.id}/").content.decode()
    assert re.search(rf"pays {kappa:.2f}\s+of its per-iteration overhead more", page)
    Predictor.objects.filter(id=predictor.id).update(feature_spec={**predictor.feature_spec, "passive_ratio": 1e-4})
    assert "passive-wait ratio" not in browser_client.get(f"/predictors/{predictor.id}/").content.decode()


def test_fitting_without_samples_says_to_profile_first():
    with pytest.raises(ApplicationError, match="profile a device first") as info:
        services.predictor_fit(backend="cpu")
    assert info.value.status_code == 409


def test_workload_features_are_computed_once_and_shown_with_the_task(api, make_task):
    task = make_task("wl", "mobilenet_v3_small")
    assert api.get(f"/api/tasks/{task.id}/").json()["workload"] is None  # the control worker computes it
    first = services.workload_ensure(architecture="mobilenet_v3_small", num_classes=10)
    assert services.workload_ensure(architecture="mobilenet_v3_small", num_classes=10).id == first.id
    workload = api.get(f"/api/tasks/{task.id}/").json()["workload"]
    assert workload["train_flops_per_sample"] > workload["forward_flops_per_sample"] > 0
    assert workload["params"] > 1e6 and workload["activation_bytes_per_sample"] > 0


def test_profile_and_predictor_api(api, make_device):
    device = make_device("prof-d")
    started = api.post(
        f"/api/devices/{device.id}/profile/", {"budget_s": 30, "architectures": ["resnet18"]}, format="json"
    )
    assert started.status_code == 202 and started.json()["status"] == "pending" and started.json()["progress"] == 0.0
    bad = api.post(f"/api/devices/{device.id}/profile/", {"budget_s": 1}, format="json")
    assert bad.status_code == 400 and "budget_s" in bad.json()["errors"]
    assert api.get("/api/profile-sweeps/").json()["count"] == 1
    no_samples = api.post("/api/predictors/", {"backend": "cpu"}, format="json")
    assert no_samples.status_code == 409
    store_synthetic_samples(device, n=40)
    _queued_control_messages()
    fitting = api.post("/api/predictors/", {"backend": "cpu"}, format="json")
    assert fitting.status_code == 202 and fitting.json()["status"] == "fitting"
    listed = api.get("/api/profile-samples/?mix_size=1").json()
    assert listed["count"] == ProfileSample.objects.filter(mix_size=1).count()
    assert all(
        row["speed_index"] is None and row["cross_core_rtt_ns"] is None for row in listed["results"]
    )  # synthetic: no probe


def test_predictor_page_draws_the_held_out_scatter(browser_client, make_device):
    store_synthetic_samples(make_device("prof-e"), n=60)
    predictor = services.predictor_fit(backend="cpu", families=("baseline", "random_forest"))
    html = browser_client.get(f"/predictors/{predictor.id}/").content.decode()
    figures = json.loads(
        re.search(r'<script id="predictor-figures" type="application/json">(.*?)</script>', html, re.S).group(1)
    )
    points = sum(len(t["x"]) for t in figures["scatter"]["data"] if t["name"] != "y = x")
    assert points == len(predictor.heldout) == predictor.training_samples
    assert figures["scatter"]["layout"]["xaxis"]["type"] == "log"
    assert {t["name"] for t in figures["by_mix"]["data"]} == set(predictor.metrics)
    by_slice = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in figures["by_slice"]["data"]}
    assert by_slice == {f: m["by_slice"] for f, m in predictor.metrics.items()} and by_slice
    assert figures["learning"]["data"][0]["y"] == [predictor.heldout_rmsle]
    assert "median speed" not in html  # synthetic samples carry no speed index
    assert browser_client.get("/predictors/").status_code == 200
    assert Predictor.objects.count() == 1


def test_error_by_slice_says_so_for_a_predictor_fitted_before_the_breakdown():
    old = dashboard_figures.error_by_slice({"baseline": {"rmsle": 0.2, "by_mix_size": {"1": 0.2}}})
    assert not old.data and "before it was recorded" in old.layout.annotations[0].text
    new = dashboard_figures.error_by_slice(
        {"baseline": {"by_slice": {"10 units, shared": 0.3, "1 unit, alone": 0.05, "2 units, shared": 0.2}}}
    )
    assert list(new.data[0].x) == ["1 unit, alone", "2 units, shared", "10 units, shared"]  # by units, not by text
    assert list(new.data[0].y) == [0.05, 0.2, 0.3]
