"""Regime awareness (issue 31 item 3): samples keep the step's host time and the GPU's busy
fraction, sweeps carry execution options (graphs refused on cpu), the workload cache keeps the
operations per step, and the guard says when a GPU device is host-bound."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from controlplane.common.errors import ApplicationError
from controlplane.experiments.services.planner_check import planner_check
from controlplane.planning.guard import RegimeFacts, host_bound_warnings
from controlplane.profiling import services
from controlplane.profiling.models import ModelWorkload, ProfileSample, ProfileSweep
from controlplane.profiling.selectors import device_regimes
from controlplane.profiling.services.predictors import training_samples
from tests.controlplane.test_api import _queued_control_messages

pytestmark = pytest.mark.django_db


def _result(sweep: ProfileSweep, index: int, *, host_step_s, gpu_busy_fraction, mode="eager", batch=32, sps=3200.0):
    return {
        "sweep_id": sweep.id,
        "device": sweep.device.name,
        "config_index": index,
        "backend": sweep.backend,
        "tasks": [{"architecture": "resnet18", "batch_size": batch, "active_thread_percentage": 100}],
        "measurements": [
            {
                "task_index": 0,
                "architecture": "resnet18",
                "batch_size": batch,
                "active_thread_percentage": 100,
                "throughput_sps": sps,
                "timed_iterations": 20,
                "execution_mode": mode,
                "host_step_s": host_step_s,
                "gpu_busy_fraction": gpu_busy_fraction,
            }
        ],
        "started_at": 1000.0 + index,
        "finished_at": 1001.0 + index,
        "status": "succeeded",
    }


@pytest.fixture
def gpu_sweep(make_device):
    device = make_device("gpu-a", "cuda-mps")
    return services.sweep_start(device=device, budget_s=60, architectures=["resnet18"], execution={"mode": "eager"})


# --------------------------------------------------------------------------- recording


def test_a_recorded_sample_keeps_host_time_gpu_busy_fraction_and_execution_mode(gpu_sweep):
    stored = services.profile_record(result=_result(gpu_sweep, 0, host_step_s=0.0095, gpu_busy_fraction=0.31))

    sample = ProfileSample.objects.get()
    assert stored == 1
    assert (sample.host_step_s, sample.gpu_busy_fraction, sample.execution_mode) == (0.0095, 0.31, "eager")


def test_a_sample_from_a_trainer_that_did_not_report_them_leaves_them_unknown(gpu_sweep):
    services.profile_record(result=_result(gpu_sweep, 0, host_step_s=None, gpu_busy_fraction=None, mode=None))

    sample = ProfileSample.objects.get()
    assert (sample.host_step_s, sample.gpu_busy_fraction, sample.execution_mode) == (None, None, "")


def test_the_sample_api_lists_the_regime_fields(api, gpu_sweep):
    services.profile_record(result=_result(gpu_sweep, 0, host_step_s=0.01, gpu_busy_fraction=0.4, mode="graphs"))

    row = api.get("/api/profile-samples/").json()["results"][0]

    assert (row["host_step_s"], row["gpu_busy_fraction"], row["execution_mode"]) == (0.01, 0.4, "graphs")


# --------------------------------------------------------------------------- sweep requests


def test_a_sweep_request_carries_the_execution_options_asked_for(gpu_sweep, make_device):
    assert gpu_sweep.request["execution"] == {"mode": "eager", "precision": "fp32", "channels_last": False}
    plain = services.sweep_start(device=make_device("cpu-a"), budget_s=60, architectures=["resnet18"])
    assert plain.request["execution"]["mode"] == "auto"  # auto: eager on cpu, graphs on a GPU


def test_graphs_on_a_cpu_device_is_refused_naming_the_field(make_device):
    with pytest.raises(ApplicationError, match=r"execution.mode 'graphs' needs a GPU backend") as info:
        services.sweep_start(device=make_device("cpu-b"), budget_s=60, execution={"mode": "graphs"})

    assert info.value.field == "execution" and info.value.status_code == 400
    assert not ProfileSweep.objects.exists()


def test_a_malformed_execution_is_refused_with_the_allowed_values(make_device):
    with pytest.raises(ApplicationError, match=r"execution.mode: .*allowed: mode auto/eager/graphs") as info:
        services.sweep_start(device=make_device("cpu-c"), budget_s=60, execution={"mode": "fast"})

    assert info.value.field == "execution"


@pytest.mark.parametrize("backend", ["cuda-mps", "cuda-timeslice", "simulated"])
def test_graphs_is_accepted_on_gpu_backends_and_the_simulator(make_device, backend):
    sweep = services.sweep_start(
        device=make_device(f"g-{backend}", backend),
        budget_s=60,
        architectures=["resnet18"],
        execution={"mode": "graphs"},
    )

    assert sweep.request["execution"]["mode"] == "graphs"


def test_the_sweep_api_takes_execution_and_answers_400_for_graphs_on_cpu(api, make_device):
    cpu = make_device("cpu-api")
    gpu = make_device("gpu-api", "cuda-mps")

    refused = api.post(
        f"/api/devices/{cpu.id}/profile/", {"budget_s": 30, "execution": {"mode": "graphs"}}, format="json"
    )
    unknown = api.post(f"/api/devices/{cpu.id}/profile/", {"budget_s": 30, "execution": {"speed": 1}}, format="json")
    started = api.post(
        f"/api/devices/{gpu.id}/profile/",
        {"budget_s": 30, "architectures": ["resnet18"], "execution": {"mode": "graphs", "precision": "bf16"}},
        format="json",
    )

    assert refused.status_code == 400 and "needs a GPU backend" in refused.json()["errors"]["execution"][0]
    assert (
        unknown.status_code == 400
        and "allowed: mode, precision, channels_last" in unknown.json()["errors"]["execution.speed"][0]
    )
    assert started.status_code == 202
    assert started.json()["request"]["execution"] == {"mode": "graphs", "precision": "bf16", "channels_last": False}


def test_the_cli_refuses_graphs_on_a_cpu_device_in_one_line(make_device):
    make_device("cpu-cli")

    with pytest.raises(CommandError) as info:
        call_command("profile", "--device", "cpu-cli", "--budget", "30", "--execution-mode", "graphs")

    message = str(info.value)
    assert message.startswith("--execution-mode 'graphs' needs a GPU backend") and "\n" not in message
    with pytest.raises(CommandError, match="--execution-mode must be one of auto, eager, graphs"):
        call_command("profile", "--device", "cpu-cli", "--budget", "30", "--execution-mode", "turbo")


# --------------------------------------------------------------------------- workload cache


def test_the_workload_cache_stores_ops_per_step_and_fills_a_row_cached_before_them():
    first = services.workload_ensure(architecture="mobilenet_v3_small", num_classes=10)
    assert first.ops_per_step is not None and 200 < first.ops_per_step < 2000
    ModelWorkload.objects.filter(id=first.id).update(ops_per_step=None)  # as cached before issue 31

    again = services.workload_ensure(architecture="mobilenet_v3_small", num_classes=10)

    assert again.id == first.id and again.ops_per_step == first.ops_per_step


# --------------------------------------------------------------------------- the guard


def test_the_guard_warns_on_a_host_bound_device_and_not_on_a_busy_one():
    idle = RegimeFacts("gpu-a", [0.25, 0.3, 0.35], [0.9, 0.92, 0.95], "eager")
    busy = RegimeFacts("gpu-b", [0.95, 0.97], [0.2, 0.3], "graphs")

    warnings = host_bound_warnings([idle, busy])

    assert warnings == [
        "device gpu-a is host-bound (GPU busy 30 %, host 92 % of each step, eager): co-location cannot gain there, "
        "the GPU waits for the host to issue each step whatever its share; use execution_mode graphs or larger batches"
    ]


@pytest.mark.parametrize(
    "busy,shares,warned",
    [
        ([0.9], [0.85], True),  # the host issues most of each step: the GPU only looks busy
        ([0.3], [], True),  # GPU idle, host time not reported
        ([], [0.5], False),
        ([], [], False),  # nothing measured: nothing to say
    ],
)
def test_either_figure_alone_makes_a_device_host_bound(busy, shares, warned):
    assert bool(host_bound_warnings([RegimeFacts("gpu-c", busy, shares)])) is warned


def test_a_host_bound_device_running_graphs_is_told_to_use_larger_batches():
    (warning,) = host_bound_warnings([RegimeFacts("gpu-d", [0.2], [0.9], "graphs")])

    assert warning.endswith("use larger batches") and "execution_mode graphs" not in warning


def test_the_guard_thresholds_are_checked():
    with pytest.raises(ValueError, match=r"max_gpu_busy must be in \[0, 1\]"):
        host_bound_warnings([], max_gpu_busy=1.5)


def test_regimes_are_read_from_gpu_devices_latest_mode_and_never_from_cpu(make_device, gpu_sweep):
    # eager first, idle; then graphs, busy: the device is judged on graphs
    for i in range(3):
        services.profile_record(result=_result(gpu_sweep, i, host_step_s=0.0095, gpu_busy_fraction=0.3))
    for i in range(3, 6):
        services.profile_record(
            result=_result(gpu_sweep, i, host_step_s=0.001, gpu_busy_fraction=0.96, mode="graphs", sps=9600.0)
        )
    cpu = make_device("cpu-r")
    cpu_sweep = services.sweep_start(device=cpu, budget_s=60, architectures=["resnet18"])
    services.profile_record(result=_result(cpu_sweep, 0, host_step_s=0.4, gpu_busy_fraction=None, sps=80.0))

    (facts,) = device_regimes([gpu_sweep.device_id, cpu.id])

    assert facts.device == "gpu-a" and facts.execution_mode == "graphs"
    assert facts.gpu_busy_fractions == [0.96] * 3
    assert facts.host_step_shares == pytest.approx([0.001 * 9600 / 32] * 3)  # 30 % of each step


def test_the_planner_check_shows_a_host_bound_device(make_experiment, make_device, gpu_sweep, make_task):
    for i in range(3):
        # resnet18 at batch 32: 3,200 samples/s is 100 steps/s, each 9.5 ms on the host: 95 %
        services.profile_record(result=_result(gpu_sweep, i, host_step_s=0.0095, gpu_busy_fraction=0.3))
    experiment = make_experiment(devices=[gpu_sweep.device], tasks=[make_task("t-r18", "resnet18")])
    _queued_control_messages()

    check = planner_check(experiment)

    assert check["warnings"][-1].startswith("device gpu-a is host-bound (GPU busy 30 %, host 95 % of each step")


def test_a_predictor_is_fitted_on_the_newest_execution_mode_only(gpu_sweep):
    # Eager and graph throughputs of one configuration differ by the factor graphs exist for,
    # and a graph step's host time is one replay: fitted together they describe neither mode.
    for index in range(3):
        services.profile_record(result=_result(gpu_sweep, index, host_step_s=0.009, gpu_busy_fraction=0.3))
    ProfileSample.objects.update(device_class="h200")
    eager = {s.config_key for s in training_samples("cuda-mps", "h200")}
    assert len(eager) == 3

    for index in range(3, 5):
        services.profile_record(
            result=_result(gpu_sweep, index, host_step_s=4e-5, gpu_busy_fraction=0.9, mode="graphs", sps=9000.0)
        )
    ProfileSample.objects.update(device_class="h200")
    graphs = training_samples("cuda-mps", "h200")
    assert {s.throughput_sps for s in graphs} == {9000.0} and len(graphs) == 2
    assert {s.host_step_s for s in graphs} == {4e-5}

    ProfileSample.objects.filter(execution_mode="graphs").delete()
    ProfileSample.objects.filter(config_key__in=list(eager)[:1]).update(execution_mode="")  # before modes existed
    assert len(training_samples("cuda-mps", "h200")) == 3
