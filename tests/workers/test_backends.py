"""Execution backends: a contract every backend passes (concurrent tasks, weights, failures as
data, standalone measurements), a contract of the trainer-process backends (real processes,
the start barrier, the shutdown hook), plus the cpu backend's resource mapping."""

from __future__ import annotations

import threading
import time

import pytest

from workers import launch
from workers.backends import (
    BackendUnavailableError,
    CpuBackend,
    TrainerProcessBackend,
)
from workers.fl.artifacts import load_model_weights
from workers.protocol.messages import ShardRef, StandaloneItem, StandaloneRequest
from workers.registry.backends import BACKEND_REGISTRY, get_backend
from workers.training.zoo import build_model

BACKENDS = BACKEND_REGISTRY.names()
PROCESS_BACKENDS = [name for name in BACKENDS if isinstance(get_backend(name), TrainerProcessBackend)]


def _available(name: str):
    """The backend, or a skip when this host cannot run it (the GPU backends without a GPU;
    tests/workers/test_cuda_backends.py covers them with stand-ins for the NVIDIA pieces)."""
    chosen = get_backend(name)
    try:
        chosen.check_available()
    except BackendUnavailableError as exc:
        pytest.skip(f"{name} cannot run here: {exc}")
    return chosen


@pytest.fixture(params=BACKENDS)
def backend(request):
    return _available(request.param)


@pytest.fixture(params=PROCESS_BACKENDS)
def process_backend(request):
    return _available(request.param)


@pytest.fixture
def two_task_round(make_task_ref, make_assignment, make_round, initial_weights):
    def build(partitioning: str, *, break_second: bool = False):
        mobilenet = make_task_ref(1, "mobilenet_v3_small")
        shufflenet = make_task_ref(2, "shufflenet_v2_x1_0")
        first = make_assignment(mobilenet, initial_weights(mobilenet), assignment_id=11, offset=0)
        second_key = "runs/1/tasks/2/global/missing.safetensors" if break_second else initial_weights(shufflenet)
        second = make_assignment(shufflenet, second_key, assignment_id=12, offset=64)
        return make_round([first, second], partitioning)

    return build


class TestExecutionBackendContract:
    """What every execution backend must do."""

    @pytest.mark.parametrize("partitioning", ["timeslice", "mps"])
    def test_round_trains_both_tasks_concurrently(self, backend, partitioning, two_task_round, agent_context, store):
        request = two_task_round(partitioning)

        result = backend.run_round(request, agent_context)

        assert result.status == "succeeded", result.error
        assert [a.assignment_id for a in result.assignments] == [11, 12]
        for spec, outcome in zip(request.assignments, result.assignments, strict=True):
            assert outcome.status == "succeeded"
            assert outcome.samples_trained == 64 and outcome.iterations == 4
            assert outcome.throughput_sps > 0 and outcome.timed_iterations == 3
            assert outcome.started_at < outcome.finished_at
            # a model trains nothing, so it has no loss; a real trainer always has one
            assert (outcome.train_loss is None) == outcome.simulated
            assert outcome.weights_sha256 == store.sha256(spec.output_weights)
            load_model_weights(build_model(spec.task.architecture, 10, 0), store.path(spec.output_weights))
        a, b = result.assignments
        assert a.started_at < b.finished_at and b.started_at < a.finished_at  # spans overlap

    def test_failing_trainer_fails_the_device_and_kills_the_other(self, backend, two_task_round, agent_context):
        request = two_task_round("mps", break_second=True)

        result = backend.run_round(request, agent_context)

        assert result.status == "failed"
        assert "task 2 (shufflenet_v2_x1_0-digits)" in result.error
        assert "missing.safetensors" in result.error
        first, second = result.assignments
        assert second.status == "failed" and "FileNotFoundError" in second.error
        # trainer processes are killed; a model just stops the device's round
        stopped = "killed" if isinstance(backend, TrainerProcessBackend) else "stopped"
        assert first.status == "failed" and f"{stopped} because task 2" in first.error
        assert launch.live_children() == []

    def test_request_for_another_device_is_refused(self, backend, two_task_round, agent_context):
        request = two_task_round("mps").model_copy(update={"device": "other"})

        result = backend.run_round(request, agent_context)

        assert result.status == "failed" and "'other'" in result.error

    def test_measure_standalone_reports_positive_throughput(self, backend, make_task_ref, agent_context):
        items = [
            StandaloneItem(
                task=make_task_ref(1, "mobilenet_v3_small"),
                batch_size=16,
                shard=ShardRef(permutation_seed=7, offset=0, count=40),
            ),
            # shard smaller than the batch: the whole shard is the batch
            StandaloneItem(
                task=make_task_ref(2, "shufflenet_v2_x1_0"),
                batch_size=64,
                shard=ShardRef(permutation_seed=7, offset=40, count=20),
            ),
        ]
        request = StandaloneRequest(
            run_id=1, device=agent_context.device, warmup_iterations=1, timed_iterations=2, items=items
        )

        result = backend.measure_standalone(request, agent_context)

        assert result.status == "succeeded", result.error
        assert [m.task_id for m in result.measurements] == [1, 2]
        assert all(m.throughput_sps > 0 and not m.error for m in result.measurements)


class TestTrainerProcessBackendContract:
    """What every backend that runs trainer processes must also do."""

    def test_shutdown_hook_kills_a_running_round(
        self, process_backend, make_task_ref, make_assignment, make_round, initial_weights, agent_context
    ):
        backend = process_backend
        task = make_task_ref(2, "shufflenet_v2_x1_0")
        request = make_round(
            [make_assignment(task, initial_weights(task), assignment_id=1, offset=0, count=1000)],
            "timeslice",
        )
        outcome = {}
        runner = threading.Thread(target=lambda: outcome.update(result=backend.run_round(request, agent_context)))
        try:
            runner.start()
            deadline = time.monotonic() + 60
            while not launch.live_children() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            launch.request_shutdown()
            runner.join(timeout=30)
        finally:
            launch.clear_shutdown()

        result = outcome["result"]
        assert result.status == "failed" and "agent shutting down" in result.error
        assert launch.live_children() == []


def test_cpu_timeslice_gives_every_trainer_all_cores_and_the_lock(two_task_round, agent_context):
    resources = CpuBackend().trainer_resources(two_task_round("timeslice"), agent_context)

    assert [r.cores for r in resources] == [agent_context.cores] * 2
    assert {r.threads for r in resources} == {len(agent_context.cores)}
    assert {r.lock_path for r in resources} == {agent_context.state_dir / "device.lock"}
    assert all(r.env["OMP_WAIT_POLICY"] == "PASSIVE" for r in resources)  # no spinning waiters


def test_cpu_mps_maps_shares_to_core_windows(two_task_round, agent_context):
    agent_context.cores = [0, 1, 2, 3]

    resources = CpuBackend().trainer_resources(two_task_round("mps"), agent_context)

    assert [r.cores for r in resources] == [[0, 1], [2, 3]]
    assert [r.threads for r in resources] == [2, 2]
    assert all(r.lock_path is None for r in resources)
    assert all("OMP_WAIT_POLICY" not in r.env for r in resources)  # disjoint cores: OpenMP may spin


def test_cpu_trainers_on_shared_cores_do_not_spin(agent_context):
    agent_context.cores = [0, 1]
    shared = CpuBackend().resources_for_shares([100, 100], "mps", agent_context)
    assert all(r.env["OMP_WAIT_POLICY"] == "PASSIVE" for r in shared)
    partly = CpuBackend().resources_for_shares([50, 50, 50], "mps", agent_context)  # the third wraps onto core 0
    assert [r.cores for r in partly] == [[0], [1], [0]]
    assert ["OMP_WAIT_POLICY" in r.env for r in partly] == [True, False, True]
    assert "OMP_WAIT_POLICY" not in CpuBackend().standalone_resources(agent_context).env


def test_cpu_trainers_keep_freed_memory_so_iterations_do_not_page_fault(agent_context):
    """Every cpu trainer, profiled or training a round, gets the same glibc allocator settings."""
    backend = CpuBackend()
    everyone = [
        *backend.resources_for_shares([50, 50], "mps", agent_context),
        *backend.resources_for_shares([100, 100], "mps", agent_context),
        *backend.resources_for_shares([30, 30], "timeslice", agent_context),
        backend.standalone_resources(agent_context),
    ]
    assert all(r.env["MALLOC_MMAP_MAX_"] == "0" for r in everyone)
    assert all(int(r.env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 30 for r in everyone)


def test_get_backend_rejects_unknown_name():
    with pytest.raises(
        ValueError, match="backend: 'rocm' is not allowed; allowed: cpu, simulated, cuda-mps, cuda-timeslice"
    ):
        get_backend("rocm")


def test_cpu_resources_for_shares_is_the_one_share_mapping(agent_context):
    agent_context.cores = [0, 1, 2, 3]
    backend = CpuBackend()

    mps = backend.resources_for_shares([25, 100], "mps", agent_context)
    timeslice = backend.resources_for_shares([25, 100], "timeslice", agent_context)

    assert [r.cores for r in mps] == [[0], [1, 2, 3, 0]]
    assert all(r.lock_path is None for r in mps)
    assert [r.threads for r in timeslice] == [4, 4] and timeslice[0].lock_path is not None


@pytest.mark.parametrize(
    "shares,partitioning,message",
    [
        ([50, 0], "mps", r"shares\[1\]"),
        ([50], "spatial", "'timeslice', 'mps'"),
    ],
)
def test_cpu_resources_for_shares_refuses_bad_input(agent_context, shares, partitioning, message):
    with pytest.raises(ValueError, match=message):
        CpuBackend().resources_for_shares(shares, partitioning, agent_context)
