"""GPU devices on the control plane: what a cuda-* agent reports (per-trainer MPS verification,
peak GPU memory, whole-GPU NVML telemetry) is stored, served by the API and drawn on the run
page; a run whose plan needs MPS is refused on a device whose backend has none.

Device results are built as a GPU agent sends them (the message schema is the process
boundary; tests/workers/test_cuda_backends.py covers the agent producing them).
"""

from __future__ import annotations

import json
import re

import pytest

from controlplane.common.errors import ApplicationError
from controlplane.dashboard import figures
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, DeviceTelemetry, Round
from tests.controlplane.test_round_protocol import _device_results

pytestmark = pytest.mark.django_db

GIB = 2**30


def _gpu_results(rnd: Round, *, failed: set[str] = frozenset()) -> list[dict]:
    """``_device_results`` plus what cuda-mps adds: MPS verification, peak CUDA memory, a
    telemetry series (dev-a: 5 samples, dev-b: 3) and, on a failed device, the MPS restart."""
    results = _device_results(rnd, failed=failed)
    for k, device in enumerate(results):
        n = 5 if device["device"] == "dev-a" else 3
        device["telemetry"] = [
            {
                "t": 1000.0 + i,
                "gpu_util_percent": 40 + 10 * i,
                "memory_used_bytes": (2 + i) * GIB,
                "memory_total_bytes": 141 * GIB,
            }
            for i in range(n)
        ]
        device["mps_restarted"] = device["status"] == "failed"
        for a in device["assignments"]:
            a.update(
                torch_device="cuda",
                peak_memory_bytes=(3 + k) * GIB,
                mps_active_thread_percentage=100.0,
                mps_verified=True,
                mps_detail="client pid 4242 connected to this agent's MPS server",
            )
    return results


def test_gpu_measurements_and_telemetry_are_recorded_and_served(started_round, api):
    run, rnd = started_round()
    services.round_record(round_id=rnd.id, results=_gpu_results(rnd))

    a = Assignment.objects.get(round=rnd, device__name="dev-a")
    assert (a.torch_device, a.peak_memory_bytes, a.mps_verified, a.mps_active_thread_percentage) == (
        "cuda",
        3 * GIB,
        True,
        100.0,
    )
    assert "MPS server" in a.mps_detail
    series = {t.device.name: t for t in DeviceTelemetry.objects.filter(round=rnd)}
    assert series["dev-a"].gpu_util_percent == [40, 50, 60, 70, 80]
    assert series["dev-b"].memory_used_bytes == [2 * GIB, 3 * GIB, 4 * GIB]
    assert series["dev-a"].memory_total_bytes == 141 * GIB

    body = api.get(f"/api/rounds/{rnd.id}/telemetry/").json()
    assert [row["device_name"] for row in body] == ["dev-a", "dev-b"]
    assert body[0]["t"] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    row = api.get(f"/api/assignments/{a.id}/").json()
    assert row["mps_verified"] is True and row["peak_memory_bytes"] == 3 * GIB and row["torch_device"] == "cuda"


def test_a_crashed_gpu_device_stays_out_of_fedavg_and_its_mps_restart_is_recorded(started_round):
    run, rnd = started_round()
    services.round_record(round_id=rnd.id, results=_gpu_results(rnd, failed={"dev-b"}))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.PARTIAL and "dev-b" in rnd.error
    assert DeviceTelemetry.objects.get(round=rnd, device__name="dev-b").mps_restarted is True
    assert DeviceTelemetry.objects.get(round=rnd, device__name="dev-a").mps_restarted is False
    # only dev-a's 30 samples trained: the failed device's weights never entered the average
    assert rnd.samples_trained == 30


def test_a_cpu_device_result_has_no_telemetry_row(started_round):
    run, rnd = started_round()
    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    assert not DeviceTelemetry.objects.exists()
    assert Assignment.objects.filter(round=rnd, mps_verified__isnull=True).count() == 2


def test_mps_strategies_are_refused_on_a_cuda_timeslice_device_before_dispatch(make_device, make_task, make_experiment):
    gpu, cpu = make_device("gpu-ts", backend="cuda-timeslice"), make_device("cpu-a")
    experiment = make_experiment(devices=[gpu, cpu], tasks=[make_task()])
    for strategy in ("isolation", "sharing"):
        with pytest.raises(ApplicationError) as err:
            services.run_create(experiment=experiment, strategy=strategy)
        assert err.value.field == "strategy"
        assert (
            "gpu-ts" in err.value.message and "cuda-timeslice" in err.value.message and "temporal" in err.value.message
        )
    assert services.run_create(experiment=experiment, strategy="temporal").strategy == "temporal"


def test_the_run_page_draws_gpu_telemetry_under_the_timeline_for_gpu_devices(
    started_round, browser_client, make_device
):
    from controlplane.fleet.models import Device

    run, rnd = started_round()
    Device.objects.filter(name__in=["dev-a", "dev-b"]).update(backend="cuda-mps")
    services.round_record(round_id=rnd.id, results=_gpu_results(rnd))
    html = browser_client.get(f"/runs/{run.id}/").content.decode()
    assert html.index('id="fig-timeline"') < html.index('id="fig-gpu"')
    live = json.loads(re.search(r'<script id="run-live" type="application/json">(.*?)</script>', html, re.S).group(1))
    gpu = live["figures"]["gpu"]
    util = [t for t in gpu["data"] if t.get("yaxis", "y") == "y" and t["name"] == "dev-a"][0]
    assert [v for v in util["y"] if v is not None] == [40, 50, 60, 70, 80]
    assert "GPU telemetry" in json.dumps(gpu["layout"]["title"])


def test_the_run_page_of_cpu_devices_has_no_gpu_figure(started_round, browser_client):
    run, rnd = started_round()
    services.round_record(round_id=rnd.id, results=_device_results(rnd))
    html = browser_client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="fig-gpu"' not in html and '"gpu"' not in html


def test_gpu_telemetry_is_thinned_to_a_bounded_number_of_points_per_device():
    series = [
        {
            "device": "gpu-a",
            "round_index": r,
            "t": [r * 10_000.0 + i for i in range(5000)],
            "gpu_util_percent": [50] * 5000,
            "memory_used_bytes": [GIB] * 5000,
            "memory_total_bytes": 80 * GIB,
        }
        for r in range(4)
    ]
    fig = figures.gpu_telemetry(series, max_points_per_device=1000)
    util = fig.data[0]
    points = [v for v in util.y if v is not None]
    assert 900 <= len(points) <= 1000
    assert sum(v is None for v in util.y) == 4  # one gap after each round: lines never join rounds
