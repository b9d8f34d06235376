"""The simulated backend's execution modes (issue 31): the Hopper presets' host term per
operation, CUDA graphs collapsing it to one replay, time slicing of host-bound tasks, and the
backend honouring and reporting each request's execution options."""

from __future__ import annotations

import pytest

from workers.backends import SimulatedBackend
from workers.backends import simulated as sim
from workers.profiling.sweep import run_sweep
from workers.protocol.messages import (
    ExecutionOptions,
    ProfileConfigResult,
    ProfileSweepRequest,
    ProfileTaskSpec,
    ShardRef,
    StandaloneItem,
    StandaloneRequest,
)

H200 = sim.device_spec("h200")
EAGER = ExecutionOptions(mode="eager")
GRAPHS = ExecutionOptions(mode="graphs")


def _alone(architecture: str, batch: int, device: sim.DeviceSpec = H200, *, graphs: bool) -> float:
    sps = sim.alone_throughput(sim.simulation_workload(architecture), batch, device, graphs=graphs)
    assert sps is not None
    return sps


def _light_mix(partitioning: str, shares: list[int], *, graphs: bool, device: sim.DeviceSpec = H200):
    loads = [sim.simulation_workload(a) for a in ("resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0")]
    return sim.simulate_throughput(
        [w.flops_per_sample for w in loads],
        [w.activation_bytes_per_sample for w in loads],
        [w.param_bytes for w in loads],
        [w.layers for w in loads],
        128,
        shares,
        device,
        partitioning=partitioning,
        ops_per_step=[w.ops_per_step for w in loads],
        graphs=graphs,
    )


# ------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("name", ["h200", "h100-sxm"])
def test_the_hopper_presets_carry_the_fitted_host_term_per_operation(name):
    spec = sim.device_spec(name)

    assert spec.host_op_s == sim.H200_HOST_OP_S
    assert 15e-6 <= spec.host_op_s <= 30e-6  # the H200's measured 18-25 µs per operation
    assert spec.kernel_gap_s > 0 and 0 < spec.graph_launch_s < 100e-6


def test_the_other_presets_keep_the_per_layer_launch_term():
    assert all(spec.host_op_s == 0 for name, spec in sim.DEVICE_PRESETS.items() if name not in ("h200", "h100-sxm"))


def test_eager_step_time_on_the_h200_is_ops_times_host_time_per_operation():
    workload = sim.simulation_workload("mobilenet_v3_large")
    prediction = _light_mix("mps", [100, 100, 100], graphs=False)

    assert workload.ops_per_step > 500  # counted by workers.training.features, not estimated
    assert prediction.host_step_s[1] == pytest.approx(workload.ops_per_step * sim.H200_HOST_OP_S)
    # host-bound: the step takes the launch term, whatever the batch (as measured: 23-26 ms)
    assert prediction.iteration_s[1] == pytest.approx(prediction.host_step_s[1], rel=0.01)
    assert 0.02 < prediction.iteration_s[1] < 0.03


def test_a_workload_without_an_op_count_is_estimated_from_its_layers():
    workload = sim.SimWorkload(flops_per_sample=1e8, activation_bytes_per_sample=1e6, param_bytes=1e7, layers=100)

    prediction = sim.simulate_throughput(
        [workload.flops_per_sample], [1e6], [1e7], [100], [32], [100], H200, ops_per_step=[workload.ops_per_step]
    )

    assert prediction.host_step_s[0] == pytest.approx(sim.OPS_PER_LAYER * 100 * sim.H200_HOST_OP_S)


def test_a_negative_op_count_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="ops_per_step must be finite and >= 0"):
        sim.simulate_throughput([1e8], [1e6], [1e7], [10], [32], [100], H200, ops_per_step=[-1])


# ------------------------------------------------------------------------------- graphs


@pytest.mark.parametrize("architecture", ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"])
def test_graphs_are_much_faster_than_eager_where_the_host_bounds_the_step(architecture):
    eager = _alone(architecture, 128, graphs=False)
    graphs = _alone(architecture, 128, graphs=True)

    assert graphs > 2 * eager


def test_graphs_change_nothing_where_the_kernels_bound_the_step():
    heavy = sim.SimWorkload(
        flops_per_sample=2e10, activation_bytes_per_sample=2e7, param_bytes=5e8, layers=40, ops_per_step=400
    )

    eager = sim.alone_throughput(heavy, 256, H200)
    graphs = sim.alone_throughput(heavy, 256, H200, graphs=True)

    assert eager is not None and graphs is not None
    assert graphs == pytest.approx(eager, rel=0.01)


def test_a_graph_step_costs_the_host_one_replay_and_the_gpu_stays_busy():
    eager = _light_mix("mps", [100, 100, 100], graphs=False)
    graphs = _light_mix("mps", [100, 100, 100], graphs=True)

    assert (graphs.host_step_s < 1e-3).all() and (eager.host_step_s > 5e-3).all()
    assert eager.gpu_busy_fraction < 0.5 < graphs.gpu_busy_fraction <= 1.0


# ------------------------------------------------------------------------- time slicing


def test_time_slicing_runs_host_bound_tasks_at_their_alone_speed():
    """As measured on the H200: ``temporal`` ran each light-mix task at its alone speed."""
    alone = [_alone(a, 128, graphs=False) for a in ("resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0")]

    temporal = _light_mix("timeslice", [100, 100, 100], graphs=False).throughput_sps

    assert temporal == pytest.approx(alone, rel=0.02)


def test_time_slicing_gives_device_bound_graphs_their_turn():
    graphs_alone = _alone("resnet18", 128, graphs=True)

    temporal = _light_mix("timeslice", [100, 100, 100], graphs=True).throughput_sps
    sharing = _light_mix("mps", [100, 100, 100], graphs=True).throughput_sps

    assert temporal[0] < 0.8 * graphs_alone  # the device is the bottleneck now: turns cost
    assert sharing.sum() > temporal.sum()  # and MPS overlaps what slicing serialises


# ------------------------------------------------------------------------------ backend


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend(device=H200, time_scale=0.0)


@pytest.mark.parametrize(("options", "mode"), [(ExecutionOptions(), "graphs"), (EAGER, "eager"), (GRAPHS, "graphs")])
def test_the_execution_mode_resolves_auto_to_graphs_on_a_simulated_gpu(options, mode):
    assert sim.simulated_execution_mode(options) == mode


def test_a_round_runs_each_assignment_in_its_mode_and_reports_it(
    backend, make_task_ref, make_assignment, make_round, initial_weights, agent_context
):
    task = make_task_ref(1, "resnet18")
    weights = initial_weights(task)
    assignments = [
        make_assignment(task, weights, assignment_id=31, offset=0, count=2048, batch_size=128, share=100).model_copy(
            update={"execution": options}
        )
        for options in (EAGER, ExecutionOptions())
    ]
    eager_round, auto_round = (backend.run_round(make_round([a], "mps"), agent_context) for a in assignments)

    assert eager_round.status == auto_round.status == "succeeded"
    (eager,), (auto,) = eager_round.assignments, auto_round.assignments
    assert (eager.execution_mode, auto.execution_mode) == ("eager", "graphs")
    assert eager.execution_fallback == auto.execution_fallback == ""
    assert auto.throughput_sps > 2 * eager.throughput_sps


def test_standalone_measurements_report_their_mode(backend, make_task_ref, agent_context):
    shard = ShardRef(permutation_seed=7, offset=0, count=1000)
    task = make_task_ref(1, "mobilenet_v3_large")
    request = StandaloneRequest(
        run_id=8,
        device=agent_context.device,
        backend="simulated",
        items=[StandaloneItem(task=task, batch_size=128, shard=shard, execution=o) for o in (EAGER, GRAPHS)],
    )

    eager, graphs = backend.measure_standalone(request, agent_context).measurements

    assert (eager.execution_mode, graphs.execution_mode) == ("eager", "graphs")
    assert eager.throughput_sps is not None and graphs.throughput_sps is not None
    assert graphs.throughput_sps > 2 * eager.throughput_sps


def _sweep(execution: ExecutionOptions) -> ProfileSweepRequest:
    return ProfileSweepRequest(
        sweep_id=5,
        device="dev-a",
        backend="simulated",
        budget_s=120,
        architectures=["resnet18", "mobilenet_v3_large"],
        batch_sizes=[32, 128],
        max_mix=2,
        repeat_every=0,
        seed=2,
        execution=execution,
    )


@pytest.mark.parametrize("execution", [EAGER, GRAPHS])
def test_a_sweeps_measurements_carry_host_time_and_gpu_busy_fraction(backend, agent_context, execution):
    emitted: list[ProfileConfigResult] = []

    summary = run_sweep(_sweep(execution), agent_context, backend, emitted.append)

    assert summary.status == "succeeded" and summary.configs >= 5
    measured = [m for r in emitted if r.status == "succeeded" for m in r.measurements]
    assert measured
    for m in measured:
        assert m.execution_mode == execution.mode
        assert m.host_step_s is not None and m.gpu_busy_fraction is not None
        assert 0 <= m.gpu_busy_fraction <= 1
        assert m.throughput_sps is not None
        step_s = m.batch_size / m.throughput_sps
        # the host's share of the step: most of it eager on the H200 (host-bound; a small share
        # stretches the kernels, 3 % noise either way), little as a graph
        if execution.mode == "eager":
            assert 0.7 * step_s < m.host_step_s < 1.1 * step_s
        else:
            assert m.host_step_s < 0.2 * step_s


def test_one_configuration_reports_the_modelled_host_time(backend, agent_context):
    tasks = [ProfileTaskSpec(architecture="resnet18", batch_size=32, active_thread_percentage=100)]

    result = backend.profile_configuration(
        tasks, _sweep(EAGER), agent_context, config_index=0, repeat_of=None, started_at=0.0
    )

    (m,) = result.measurements
    ops = sim.simulation_workload("resnet18").ops_per_step
    assert m.host_step_s == pytest.approx(ops * sim.H200_HOST_OP_S)
    assert m.gpu_busy_fraction is not None and m.gpu_busy_fraction < 0.5  # mostly idle, as measured (30 %)
