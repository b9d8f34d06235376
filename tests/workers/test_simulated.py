"""The ``simulated`` backend: the contention model's trends, its determinism and labels, and
the backend answering rounds, standalone measurements and profiling sweeps like a device."""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
import pytest
import torch

from workers import launch
from workers.agent import app as agent
from workers.backends import SimulatedBackend
from workers.backends import simulated as sim
from workers.fl.artifacts import LocalArtifactStore, global_weights_key
from workers.profiling.sweep import run_sweep, sweep_design
from workers.protocol.messages import (
    DatasetRef,
    ProfileConfigResult,
    ProfileSweepRequest,
    ProfileTaskSpec,
    ShardRef,
    StandaloneItem,
    StandaloneRequest,
    TaskRef,
    WorkloadShape,
)
from workers.registry.backends import get_backend
from workers.registry.models import MODEL_REGISTRY, Model
from workers.training.zoo import write_initial_weights

TITAN_V = sim.device_spec("titan-v")


def _columns(architectures: list[str]) -> list[np.ndarray]:
    """Workload columns of ``simulate_throughput`` for a mix, shape ``(I,)`` each."""
    loads = [sim.simulation_workload(a) for a in architectures]
    return [
        np.array([getattr(w, f) for w in loads], dtype=float)
        for f in ("flops_per_sample", "activation_bytes_per_sample", "param_bytes", "layers")
    ]


def _mix(architecture: str, batch: int, shares: list[int], **kwargs) -> sim.MixPrediction:
    """``len(shares)`` copies of one model co-located on the Titan V."""
    return sim.simulate_throughput(
        *_columns([architecture] * len(shares)), batch, shares, kwargs.pop("device", TITAN_V), **kwargs
    )


def _alone(architecture: str, batch: int, device: sim.DeviceSpec = TITAN_V, *, graphs: bool = False) -> float:
    return sim.alone_throughput(sim.simulation_workload(architecture), batch, device, graphs=graphs)


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend(device=TITAN_V, time_scale=0.0)


# ------------------------------------------------------------------------------- model


def test_throughput_grows_with_the_batch_size_and_saturates():
    batches = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    for architecture in ("resnet18", "vgg16", "mobilenet_v3_small"):
        curve = [_alone(architecture, b) for b in batches]
        gains = [b / a for a, b in itertools.pairwise(curve)]

        assert all(g > 1 for g in gains), (architecture, curve)
        assert all(b < a for a, b in itertools.pairwise(gains)), (architecture, gains)  # concave
        assert gains[-1] < 1.1, (architecture, gains)  # the last doubling barely helps


def test_throughput_grows_with_the_share_with_diminishing_returns():
    shares = [10, 25, 50, 75, 100]
    speeds = [float(_mix("resnet18", 128, [s]).throughput_sps[0]) for s in shares]
    small_batch = [float(_mix("resnet18", 16, [s]).throughput_sps[0]) for s in shares]

    assert all(b > a for a, b in itertools.pairwise(speeds))
    # a batch that cannot fill the device loses little when it gets a tenth of it
    assert small_batch[0] / small_batch[-1] > 2 * speeds[0] / speeds[-1]


def test_per_process_throughput_falls_and_the_total_stays_between_one_and_k_times():
    for architecture, batch in itertools.product(("resnet50", "mobilenet_v3_small"), (8, 64, 512)):
        single = _alone(architecture, batch)
        per_process = [float(_mix(architecture, batch, [100] * k).throughput_sps[0]) for k in range(1, 6)]

        assert per_process[0] == pytest.approx(single)
        assert all(b <= a for a, b in itertools.pairwise(per_process)), per_process
        for k, p in enumerate(per_process, start=1):
            assert single <= k * p * (1 + 1e-9) and k * p <= k * single * (1 + 1e-9)


def test_shares_over_100_percent_slow_device_bound_tasks_down():
    alone = _alone("vgg16", 256)

    two = _mix("vgg16", 256, [100, 100]).throughput_sps
    four = _mix("vgg16", 256, [100] * 4).throughput_sps

    assert np.all(two < 0.6 * alone) and np.all(four < 0.3 * alone)
    assert np.all(four < two[0])


def test_small_operators_co_locate_almost_for_free():
    alone = _alone("mobilenet_v3_small", 16)

    four = _mix("mobilenet_v3_small", 16, [100] * 4).throughput_sps

    assert np.all(four > 0.95 * alone)


def test_the_best_total_lies_between_100_percent_and_all_tasks_at_100():
    def total(shares):
        return float(np.sum(_mix("resnet18", 128, shares).throughput_sps))

    overlapping = total([70, 70])

    assert overlapping > total([50, 50]) and overlapping > total([100, 100])


def test_timeslice_gives_each_device_bound_task_its_turn_and_mps_overlaps_them():
    alone = _alone("vgg16", 256)
    overhead = TITAN_V.timeslice_overhead

    timeslice = _mix("vgg16", 256, [30, 30, 30], partitioning="timeslice").throughput_sps
    mps = _mix("resnet18", 128, [100, 100, 100]).throughput_sps
    resnet_timeslice = _mix("resnet18", 128, [30, 30, 30], partitioning="timeslice").throughput_sps

    # device-bound: each gets its turn of 1/3, less the context switches
    assert timeslice == pytest.approx([alone / 3 * (1 - overhead)] * 3, rel=1e-3)
    assert np.all(mps > resnet_timeslice)


def test_tasks_that_do_not_fit_are_out_of_memory_in_order():
    small = dataclasses.replace(TITAN_V, memory_bytes=2 * sim.GIB)

    prediction = sim.simulate_throughput(*_columns(["resnet50", "vgg16", "resnet18"]), 256, [50, 50, 50], small)

    assert prediction.oom.tolist() == [False, True, False]  # the third fits beside the first
    assert np.isnan(prediction.throughput_sps[1]) and np.all(prediction.throughput_sps[[0, 2]] > 0)
    expected = (
        small.context_bytes
        + 4 * sim.simulation_workload("resnet50").param_bytes
        + 256 * sim.simulation_workload("resnet50").activation_bytes_per_sample
    )
    assert prediction.peak_memory_bytes[0] == pytest.approx(expected)


def test_many_configurations_at_once_equal_one_at_a_time():
    rng = np.random.default_rng(0)
    architectures = ["resnet18", "mobilenet_v3_small", "vgg16", "densenet121"]
    mixes = [list(rng.choice(architectures, 3)) for _ in range(20)]
    batches = rng.choice([16, 64, 256], (20, 3))
    shares = rng.choice(np.arange(10, 101, 10), (20, 3))
    columns = [np.stack(c) for c in zip(*(_columns(m) for m in mixes), strict=True)]
    present = rng.random((20, 3)) < 0.8
    present[:, 0] = True
    devices = sim.stack_devices([sim.device_spec(n) for n in ["titan-v", "t4"] * 10])

    together = sim.simulate_throughput(*columns, batches, shares, devices, present=present)

    for n in range(20):
        device = sim.device_spec("titan-v" if n % 2 == 0 else "t4")
        keep = present[n]
        one = sim.simulate_throughput(*(c[n][keep] for c in columns), batches[n][keep], shares[n][keep], device)
        np.testing.assert_allclose(together.throughput_sps[n][keep], one.throughput_sps, rtol=1e-9)
        assert np.all(np.isnan(together.throughput_sps[n][~keep]))


def test_noise_is_deterministic_per_seed_round_device_and_task():
    factors = sim.noise_factors(3, 7, "dev-a", np.arange(20_000))

    assert np.array_equal(factors, sim.noise_factors(3, 7, "dev-a", np.arange(20_000)))
    for other in (
        sim.noise_factors(4, 7, "dev-a", np.arange(20_000)),
        sim.noise_factors(3, 8, "dev-a", np.arange(20_000)),
        sim.noise_factors(3, 7, "dev-b", np.arange(20_000)),
    ):
        assert abs(np.corrcoef(np.log(factors), np.log(other))[0, 1]) < 0.05
    assert np.std(np.log(factors)) == pytest.approx(sim.NOISE_SIGMA, rel=0.05)
    assert np.median(factors) == pytest.approx(1.0, abs=0.002)


def test_out_of_range_inputs_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"share .*\(0, 100\].*index \(1,\)"):
        _mix("resnet18", 32, [50, 0])
    with pytest.raises(ValueError, match="partitioning 'spatial'"):
        _mix("resnet18", 32, [50], partitioning="spatial")
    with pytest.raises(ValueError, match="task axis"):
        sim.simulate_throughput(1e9, 1e6, 1e6, 10, 32, 50, TITAN_V)


# --------------------------------------------------------------------- configuration


def test_device_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(sim.ENV_DEVICE, "t4")
    assert get_backend("simulated").device == sim.device_spec("t4")

    monkeypatch.delenv(sim.ENV_DEVICE)
    assert get_backend("simulated").device.name == "titan-v"

    monkeypatch.setenv(sim.ENV_DEVICE, "h9000")
    with pytest.raises(ValueError, match=r"MTFL_SIM_DEVICE='h9000'.*a100-40gb.*titan-v"):
        get_backend("simulated")


def test_time_scale_must_be_a_number_at_least_zero(monkeypatch):
    monkeypatch.setenv(sim.ENV_TIME_SCALE, "-1")
    with pytest.raises(ValueError, match="MTFL_SIM_TIME_SCALE"):
        SimulatedBackend()


def test_backend_needs_no_gpu(backend):
    backend.check_available()  # raises BackendUnavailableError if it did

    assert backend.name == "simulated" and isinstance(get_backend("simulated"), SimulatedBackend)


def test_agent_refuses_a_bad_simulated_device_with_exit_code_2(monkeypatch, capsys):
    monkeypatch.setenv(sim.ENV_DEVICE, "h9000")

    code = agent.main(["--device", "sim-a", "--backend", "simulated"])

    assert code == agent.EXIT_CONFIG and "MTFL_SIM_DEVICE" in capsys.readouterr().err


# ------------------------------------------------------------------------------ rounds


@pytest.fixture
def sim_round(make_task_ref, make_assignment, make_round, initial_weights):
    """A resnet18 + mobilenet round; the mobilenet has a quarter of the samples."""

    def build(partitioning: str = "mps", *, seed: int = 3, epochs: int = 2):
        resnet = make_task_ref(1, "resnet18")
        mobilenet = make_task_ref(2, "mobilenet_v3_small")
        first = make_assignment(
            resnet, initial_weights(resnet), assignment_id=21, offset=0, count=4001, batch_size=64, share=60
        )
        second = make_assignment(
            mobilenet, initial_weights(mobilenet), assignment_id=22, offset=0, count=1000, batch_size=32, share=60
        )
        first, second = (a.model_copy(update={"seed": seed, "local_epochs": epochs}) for a in (first, second))
        return make_round([first, second], partitioning)

    return build


def test_round_reports_virtual_training_labelled_simulated(backend, sim_round, agent_context, store):
    request = sim_round()
    for architecture in ("resnet18", "mobilenet_v3_small"):  # features counted once, before the clock
        sim.simulation_workload(architecture)
    tick = time.monotonic()

    result = backend.run_round(request, agent_context)

    assert time.monotonic() - tick < 5  # nothing slept, although minutes were simulated
    assert result.status == "succeeded" and result.simulated
    first, second = result.assignments
    assert all(a.simulated and a.status == "succeeded" and a.train_loss is None for a in result.assignments)
    assert (first.samples_trained, second.samples_trained) == (8002, 2000)
    # 4001 = 62·64 + 33 → 63 batches; 1000 = 31·32 + 8 → 32; warm-up 1
    assert (first.iterations, second.iterations) == (126, 64)
    assert (first.timed_iterations, second.timed_iterations) == (125, 63)
    for outcome in result.assignments:
        assert outcome.finished_at - outcome.started_at == pytest.approx(outcome.seconds)
        assert outcome.throughput_sps == pytest.approx(outcome.samples_trained / outcome.seconds)
    assert first.started_at == second.started_at and second.finished_at < first.finished_at


def test_round_passes_the_global_weights_through(backend, sim_round, agent_context, store):
    request = sim_round()

    result = backend.run_round(request, agent_context)

    for spec, outcome in zip(request.assignments, result.assignments, strict=True):
        assert outcome.weights == spec.output_weights
        assert outcome.weights_sha256 == store.sha256(spec.global_weights)
        assert store.path(spec.output_weights).read_bytes() == store.path(spec.global_weights).read_bytes()


def test_a_task_speeds_up_when_its_neighbour_finishes(backend, sim_round, agent_context):
    request = sim_round("timeslice")
    together = sim.simulate_throughput(
        *_columns(["resnet18", "mobilenet_v3_small"]),
        [64, 32],
        [60, 60],
        TITAN_V,
        partitioning="timeslice",
        noise=[sim.noise_factors(3, 0, agent_context.device, [t])[0] for t in (1, 2)],
        ops_per_step=[sim.simulation_workload(a).ops_per_step for a in ("resnet18", "mobilenet_v3_small")],
        graphs=True,  # the assignments' execution is auto: CUDA graphs on a simulated GPU
    ).throughput_sps

    first, second = backend.run_round(request, agent_context).assignments

    assert second.throughput_sps == pytest.approx(together[1])  # it ended first
    assert first.throughput_sps > together[0] * 1.01  # ran alone for a while


def test_rounds_are_deterministic_for_a_seed(backend, sim_round, agent_context):
    def speeds(seed):
        result = backend.run_round(sim_round(seed=seed), agent_context)
        return [a.throughput_sps for a in result.assignments]

    assert speeds(3) == speeds(3)
    assert speeds(3) != speeds(4)


def test_timeslice_round_is_slower_than_mps(backend, sim_round, agent_context):
    mps = backend.run_round(sim_round("mps"), agent_context)
    timeslice = backend.run_round(sim_round("timeslice"), agent_context)

    assert timeslice.status == mps.status == "succeeded"
    assert max(a.seconds for a in timeslice.assignments) > max(a.seconds for a in mps.assignments)


def test_round_that_does_not_fit_fails_as_out_of_memory(sim_round, agent_context, store):
    tiny = SimulatedBackend(device=dataclasses.replace(TITAN_V, memory_bytes=0.5 * sim.GIB))
    request = sim_round()

    result = tiny.run_round(request, agent_context)

    assert result.status == "failed" and result.simulated
    first, second = result.assignments  # the first fits alone, the second not beside it
    assert second.status == "failed" and "CUDA out of memory (simulated)" in second.error
    assert first.status == "failed" and "stopped because task 2 (mobilenet_v3_small-digits)" in first.error
    assert "task 2 (mobilenet_v3_small-digits): CUDA out of memory" in result.error
    assert not any(store.exists(a.output_weights) for a in request.assignments)


def test_empty_shard_trains_nothing_and_copies_the_weights(
    backend, make_task_ref, make_assignment, make_round, initial_weights, agent_context, store
):
    task = make_task_ref(1, "resnet18")
    spec = make_assignment(task, initial_weights(task), assignment_id=5, offset=0, count=0)

    (outcome,) = backend.run_round(make_round([spec], "mps"), agent_context).assignments

    assert outcome.status == "succeeded" and outcome.samples_trained == 0
    assert outcome.throughput_sps is None and outcome.seconds == 0
    assert outcome.weights_sha256 == store.sha256(spec.global_weights)


def test_time_scale_makes_a_round_take_real_time(sim_round, agent_context):
    request = sim_round(epochs=1)
    simulated_s = max(a.seconds for a in SimulatedBackend(device=TITAN_V).run_round(request, agent_context).assignments)
    scale = 0.4 / simulated_s
    tick = time.monotonic()

    result = SimulatedBackend(device=TITAN_V, time_scale=scale).run_round(request, agent_context)

    assert result.status == "succeeded" and time.monotonic() - tick >= 0.4


def test_shutdown_refuses_a_round(backend, sim_round, agent_context):
    launch.request_shutdown()
    try:
        result = backend.run_round(sim_round(), agent_context)
    finally:
        launch.clear_shutdown()

    assert result.status == "failed" and "agent shutting down" in result.error


def test_standalone_measurements_are_the_model_alone(backend, make_task_ref, agent_context):
    items = [
        StandaloneItem(
            task=make_task_ref(1, "resnet18"), batch_size=128, shard=ShardRef(permutation_seed=7, offset=0, count=1000)
        ),
        StandaloneItem(
            task=make_task_ref(2, "vgg16"), batch_size=64, shard=ShardRef(permutation_seed=7, offset=0, count=0)
        ),
    ]
    request = StandaloneRequest(run_id=8, device=agent_context.device, items=items)

    result = backend.measure_standalone(request, agent_context)

    assert result.simulated and all(m.simulated for m in result.measurements)
    good, empty = result.measurements
    noise = sim.noise_factors(8, -1, agent_context.device, [1])[0]
    # the items' execution is auto: CUDA graphs on a simulated GPU
    assert good.throughput_sps == pytest.approx(_alone("resnet18", 128, graphs=True) * noise)
    assert good.execution_mode == "graphs"
    assert result.status == "failed" and "shard.count is 0" in empty.error


def test_standalone_measures_the_model_at_the_tasks_input_shape(backend, make_task_ref, agent_context):
    small = make_task_ref(1, "resnet18")
    large = small.model_copy(update={"task_id": 2, "input_shape": (3, 64, 64)})
    shard = ShardRef(permutation_seed=7, offset=0, count=1000)
    request = StandaloneRequest(
        run_id=8,
        device=agent_context.device,
        items=[StandaloneItem(task=t, batch_size=128, shard=shard) for t in (small, large)],
    )

    at_32, at_64 = backend.measure_standalone(request, agent_context).measurements

    noise = sim.noise_factors(8, -1, agent_context.device, [1, 2])
    workload_64 = sim.simulation_workload("resnet18", 10, (3, 64, 64))
    assert at_64.throughput_sps == pytest.approx(
        sim.alone_throughput(workload_64, 128, TITAN_V, graphs=True) * noise[1]
    )
    assert at_32.throughput_sps == pytest.approx(_alone("resnet18", 128, graphs=True) * noise[0])
    assert at_64.throughput_sps < 0.5 * at_32.throughput_sps  # 4× the pixels, about 4× the work


class _TabularMLP(torch.nn.Module):
    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(input_shape[0], 256), torch.nn.ReLU(), torch.nn.Linear(256, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.fixture
def tabular_model():
    MODEL_REGISTRY.register(Model("test_sim_mlp", "test_sim_mlp", _TabularMLP))
    yield "test_sim_mlp"
    MODEL_REGISTRY.unregister("test_sim_mlp")


def test_a_round_of_a_tabular_task_uses_its_input_shape(tabular_model):
    workload = sim.simulation_workload(tabular_model, 3, (20,))

    macs = 20 * 256 + 256 * 3
    # forward, the weight gradients, the input gradient of the second layer (not of the input)
    assert workload.flops_per_sample == 2 * macs + 2 * macs + 2 * 256 * 3
    assert workload.layers == 3
    task = TaskRef(
        task_id=1, name="t", architecture=tabular_model, num_classes=3, dataset=DatasetRef(), input_shape=(20,)
    )
    assert sim._task_workload(task) == workload


# ---------------------------------------------------------------------------- profiling


def _sweep(**overrides) -> ProfileSweepRequest:
    fields = dict(
        sweep_id=5,
        device="dev-a",
        backend="simulated",
        budget_s=600,
        architectures=["resnet18", "mobilenet_v3_small", "vgg16"],
        batch_sizes=[16, 64, 256],
        max_mix=3,
        repeat_every=5,
        seed=2,
    )
    fields.update(overrides)
    return ProfileSweepRequest(**fields)


def test_profile_sweep_spends_its_budget_in_simulated_seconds(backend, agent_context):
    emitted: list[ProfileConfigResult] = []
    request = _sweep()
    tick = time.monotonic()

    summary = run_sweep(request, agent_context, backend, emitted.append)

    assert time.monotonic() - tick < 30
    assert summary.status == "succeeded" and summary.simulated
    assert summary.configs == len(emitted) >= 20
    assert request.budget_s <= summary.elapsed_s < request.budget_s + request.config_timeout_s
    assert summary.elapsed_s == pytest.approx(emitted[-1].finished_at - emitted[0].started_at)
    for before, after in itertools.pairwise(emitted):
        assert after.started_at == pytest.approx(before.finished_at)  # one virtual clock
    assert all(r.simulated and r.backend == "simulated" and all(m.simulated for m in r.measurements) for r in emitted)


def test_profile_sweep_on_the_model_follows_the_design_with_standalones_and_repeats(backend, agent_context):
    emitted: list[ProfileConfigResult] = []
    request = _sweep()

    summary = run_sweep(request, agent_context, backend, emitted.append)

    measured = [r for r in emitted if r.repeat_of is None]
    design = [
        [(t.architecture, t.batch_size, t.active_thread_percentage) for t in c]
        for c in itertools.islice(sweep_design(request), 5)
    ]
    keys = [[(t.architecture, t.batch_size, t.active_thread_percentage) for t in r.tasks] for r in measured]
    assert all(d in keys for d in design[:3])
    succeeded = [r for r in emitted if r.status == "succeeded"]
    assert all(m.standalone_sps and m.throughput_sps and m.peak_memory_bytes for r in succeeded for m in r.measurements)
    repeats = [r for r in emitted if r.repeat_of is not None]
    assert repeats and all(0 < s < 0.25 for s in summary.repeat_spread)


def test_profile_configuration_builds_each_architecture_at_its_workload_shape(backend, agent_context, tabular_model):
    tasks = [
        ProfileTaskSpec(architecture=tabular_model, batch_size=64, active_thread_percentage=50),
        ProfileTaskSpec(architecture="resnet18", batch_size=64, active_thread_percentage=50),
    ]
    request = _sweep(
        architectures=[tabular_model, "resnet18"],
        workloads={tabular_model: WorkloadShape(num_classes=3, input_shape=(20,))},
    )

    result = backend.profile_configuration(
        tasks, request, agent_context, config_index=0, repeat_of=None, started_at=0.0
    )

    assert result.status == "succeeded", result.error
    loads = [sim.simulation_workload(tabular_model, 3, (20,)), sim.simulation_workload("resnet18")]
    expected = sim.simulate_throughput(
        *[
            np.array([getattr(w, f) for w in loads])
            for f in ("flops_per_sample", "activation_bytes_per_sample", "param_bytes", "layers")
        ],
        [64, 64],
        [50, 50],
        TITAN_V,
        noise=sim.noise_factors(request.seed, 0, agent_context.device, range(2)),
        ops_per_step=[w.ops_per_step for w in loads],
        graphs=True,  # the sweep's execution is auto: CUDA graphs on a simulated GPU
    )
    mlp, resnet = result.measurements
    assert [mlp.throughput_sps, resnet.throughput_sps] == pytest.approx(expected.throughput_sps.tolist())
    assert mlp.throughput_sps > 10 * resnet.throughput_sps


def test_profile_configuration_out_of_memory_or_too_slow_fails_as_data(agent_context):
    tiny = SimulatedBackend(device=dataclasses.replace(TITAN_V, memory_bytes=1 * sim.GIB))
    request = _sweep(config_timeout_s=30)
    tasks = [
        ProfileTaskSpec(architecture="resnet18", batch_size=16, active_thread_percentage=50),
        ProfileTaskSpec(architecture="vgg16", batch_size=512, active_thread_percentage=50),
    ]

    oom = tiny.profile_configuration(tasks, request, agent_context, config_index=0, repeat_of=None, started_at=100.0)
    slow = SimulatedBackend(device=dataclasses.replace(TITAN_V, peak_flops=1e9)).profile_configuration(
        tasks, request, agent_context, config_index=0, repeat_of=None, started_at=100.0
    )

    assert oom.status == "failed" and oom.simulated
    assert "CUDA out of memory (simulated)" in oom.measurements[1].error
    assert oom.measurements[0].error == "not measured: another task failed"
    assert slow.status == "failed" and "config_timeout_s exceeded" in slow.error
    assert slow.finished_at - slow.started_at == request.config_timeout_s


def test_simulated_agent_serves_rounds_and_sweeps(monkeypatch, tmp_path, make_task_ref, make_assignment, make_round):
    monkeypatch.setenv(agent.ENV_DEVICE, "dev-a")
    monkeypatch.setenv(agent.ENV_BACKEND, "simulated")
    monkeypatch.setenv(agent.ENV_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.setenv("ARTIFACT_ROOT", str(tmp_path / "artifacts"))
    monkeypatch.setattr(agent, "_BACKEND_CACHE", {})
    sent = []
    monkeypatch.setattr(agent.app, "send_task", lambda name, args, **kw: sent.append((name, args)))
    task = make_task_ref(1, "resnet18")
    key = global_weights_key(1, 1, None)
    write_initial_weights("resnet18", 10, 1, LocalArtifactStore(tmp_path / "artifacts").path(key))
    request = make_round([make_assignment(task, key, assignment_id=3, offset=0)], "mps").model_copy(
        update={"backend": "simulated"}
    )

    round_result = agent.train_round(request.model_dump(mode="json"))
    summary = agent.profile_sweep(_sweep(budget_s=60).model_dump(mode="json"))

    assert round_result["status"] == "succeeded" and round_result["simulated"] is True
    assert summary["status"] == "succeeded" and summary["simulated"] is True
    records = [args[0] for name, args in sent if name == agent.TaskName.PROFILE_RECORD]
    assert len(records) == summary["configs"] > 0 and all(r["simulated"] for r in records)


@pytest.mark.integration
def test_agent_process_with_the_simulated_backend_serves_a_round(
    tmp_path, start_agent, make_task_ref, make_assignment, make_round
):
    task = make_task_ref(1, "resnet50")
    key = global_weights_key(1, 1, None)
    write_initial_weights("resnet50", 10, 1, LocalArtifactStore(tmp_path / "artifacts").path(key))
    request = make_round([make_assignment(task, key, assignment_id=3, offset=0, count=50_000)], "mps").model_copy(
        update={"device": "sim", "backend": "simulated"}
    )
    agent_process = start_agent(
        "--device", "sim", "--backend", "simulated", "--heartbeat-s", "600", MTFL_SIM_DEVICE="a100-40gb"
    )
    try:
        result = agent_process.client.send_task(
            agent.TaskName.TRAIN_ROUND, args=[request.model_dump(mode="json")], queue="device.sim"
        ).get(timeout=90)
    finally:
        agent_process.stop()

    assert result["status"] == "succeeded" and result["simulated"] is True, result
    (outcome,) = result["assignments"]
    assert outcome["samples_trained"] == 50_000 and outcome["simulated"] is True
    assert agent_process.proc.returncode == 0, agent_process.output
