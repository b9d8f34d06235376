"""Profiling sweeps: the design, the timing window, one measured configuration with real
profiler processes, and the sweep loop (with real processes and with a fake measurement)."""

from __future__ import annotations

import itertools
import os
import shlex
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from workers import launch
from workers.backends import CpuBackend
from workers.backends.base import ExecutionBackend, TrainerResources
from workers.forkserver import ForkServerPool
from workers.profiling import sweep as profiling
from workers.profiling.sweep import (
    Iteration,
    common_window,
    measure_configuration,
    relative_spread,
    run_sweep,
    share_grid,
    sweep_design,
    window_complete,
    window_throughput,
)
from workers.protocol.messages import (
    ExecutionOptions,
    ProfileConfigResult,
    ProfileMeasurement,
    ProfileSweepRequest,
    ProfileTaskSpec,
)
from workers.training import profiler as child_module
from workers.training.profiler import ITER_PREFIX, ProfileChildSpec, next_chunk_steps

LIGHT = ["mobilenet_v3_small", "shufflenet_v2_x1_0"]
PAPER_MIX = ["resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0", "mobilenet_v3_large"]


def _request(**overrides) -> ProfileSweepRequest:
    """A quick sweep of light models on the test device."""
    fields = dict(
        sweep_id=5,
        device="dev-a",
        budget_s=5,
        architectures=LIGHT,
        batch_sizes=[8, 16],
        max_mix=2,
        warmup_iterations=1,
        min_timed_iterations=2,
        min_window_s=0.3,
        config_timeout_s=60,
        repeat_every=0,
    )
    fields.update(overrides)
    return ProfileSweepRequest(**fields)


def _task(architecture: str = "mobilenet_v3_small", batch_size: int = 8, share: int = 50):
    return ProfileTaskSpec(architecture=architecture, batch_size=batch_size, active_thread_percentage=share)


def _key(config: list[ProfileTaskSpec]) -> tuple:
    return tuple((t.architecture, t.batch_size, t.active_thread_percentage) for t in config)


# ------------------------------------------------------------------------------ design


def test_sweep_design_is_deterministic_per_seed():
    request = _request(architectures=PAPER_MIX, batch_sizes=[16, 32, 64, 128, 256], max_mix=4)

    first = [_key(c) for c in itertools.islice(sweep_design(request), 50)]
    again = [_key(c) for c in itertools.islice(sweep_design(request), 50)]
    reseeded = request.model_copy(update={"seed": 1})
    other = [_key(c) for c in itertools.islice(sweep_design(reseeded), 50)]

    assert first == again
    assert first != other


def test_sweep_design_covers_every_mix_size_early_and_is_no_grid():
    request = _request(architectures=PAPER_MIX, batch_sizes=[16, 32, 64, 128, 256], max_mix=4)

    configs = list(itertools.islice(sweep_design(request), 64))

    assert {len(c) for c in configs[:8]} == {1, 2, 3, 4}
    assert len({_key(c) for c in configs}) == 64  # no configuration twice
    assert {t.architecture for c in configs for t in c} == set(PAPER_MIX)
    assert {t.batch_size for c in configs for t in c} == {16, 32, 64, 128, 256}


def test_sweep_design_keeps_shares_on_the_grid_and_values_from_the_lists():
    request = _request(share_min=12, share_step=5, batch_sizes=[8, 16, 16], max_mix=3)

    configs = list(itertools.islice(sweep_design(request), 300))

    shares = {t.active_thread_percentage for c in configs for t in c}
    assert shares <= set(range(15, 101, 5)) and min(shares) == 15 and max(shares) == 100
    assert {t.batch_size for c in configs for t in c} == {8, 16}
    assert {t.architecture for c in configs for t in c} == set(LIGHT)
    assert all(1 <= len(c) <= 3 for c in configs)


def test_share_grid_adds_the_whole_device():
    assert share_grid(10, 20) == [20, 40, 60, 80, 100]
    assert share_grid(25, 30) == [30, 60, 90, 100]
    assert share_grid(100, 5) == [100]


def test_sweep_request_refuses_a_batch_size_out_of_range():
    with pytest.raises(ValidationError, match=r"batch_sizes\.1"):
        _request(batch_sizes=[8, 1])


# ----------------------------------------------------------------------- timing window


def _its(*spans: tuple[float, float], samples: int = 4) -> list[Iteration]:
    return [Iteration(a, b, samples) for a, b in spans]


def test_common_window_counts_only_iterations_run_while_every_task_was_timed():
    fast = _its((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))
    slow = _its((2.5, 4.5), (4.5, 6.5))

    t_all, counted = common_window([fast, slow], until=5.0)

    assert t_all == 2.5
    assert counted == [fast[3:5], slow[:1]]  # (2, 3) started before t_all, (4.5, 6.5) after STOP
    assert window_throughput(counted[0]) == pytest.approx(8 / 2)


def test_common_window_is_empty_until_every_task_has_a_timed_iteration():
    t_all, counted = common_window([_its((0, 1)), []], until=10)

    assert t_all is None and counted == [[], []]
    assert window_throughput([]) is None


def test_window_complete_needs_both_the_duration_and_the_iterations():
    tasks = [_its((0, 1), (1, 2), (2, 3)), _its((0, 1.5), (1.5, 3))]

    assert window_complete(tasks, now=3.0, min_iterations=2, min_window_s=3.0)
    assert not window_complete(tasks, now=3.0, min_iterations=3, min_window_s=0.0)
    assert not window_complete(tasks, now=2.9, min_iterations=1, min_window_s=3.0)


def test_window_complete_counts_the_steps_of_chunks():
    tasks = [[Iteration(0, 2, 64, 4)], [Iteration(0, 1, 8, 1), Iteration(1, 2, 24, 3)]]

    assert window_complete(tasks, now=2.0, min_iterations=4, min_window_s=0.0)
    assert not window_complete(tasks, now=2.0, min_iterations=5, min_window_s=0.0)


def test_a_chunk_line_is_read_with_its_steps_and_an_old_line_as_one_step():
    child = SimpleNamespace(label="task 0")
    profiler = SimpleNamespace(iterations=[])
    on_line = profiling._record_iteration({id(child): profiler})

    on_line(child, ["ITER", "1.0", "2.5", "48", "3"])
    on_line(child, ["ITER", "2.5", "3.0", "16"])

    assert profiler.iterations == [Iteration(1.0, 2.5, 48, 3), Iteration(2.5, 3.0, 16, 1)]


@pytest.mark.parametrize(
    ("previous_steps", "previous_s", "expected"),
    [
        (1, 0.001, 4),  # fast: grows, but at most fourfold
        (4, 0.02, 16),
        (16, 0.1, 32),  # 0.2 s at this pace
        (100, 0.4, 50),  # slower than aimed: shrinks
        (1, 5.0, 1),  # never below one step
        (2, 0.0, 8),  # too fast for the clock: the most growth
    ],
)
def test_next_chunk_steps_aims_at_the_chunk_length(previous_steps, previous_s, expected):
    assert next_chunk_steps(previous_steps, previous_s) == expected


class _Commands:
    """GO at the barrier, then nothing for ``steps`` polls, then STOP."""

    def __init__(self, steps: int) -> None:
        self._polls = steps

    def wait_line(self) -> str:
        return "GO"

    def poll_line(self) -> str:
        self._polls -= 1
        return "STOP" if self._polls < 0 else ""


def test_the_profiler_reports_chunks_of_steps_with_its_mode_and_host_time(monkeypatch):
    import io

    import torch

    from workers.training import runtime, zoo

    monkeypatch.setattr(zoo, "build_model", lambda *args: torch.nn.Sequential(torch.nn.Linear(20, 3)))
    monkeypatch.setattr(runtime, "apply_resources", lambda threads, cores: None)  # keep the test process's threads
    spec = ProfileChildSpec(
        architecture="resnet18", batch_size=8, num_classes=3, input_shape=(20,), threads=1, warmup_iterations=2
    )
    out = io.StringIO()

    run = child_module.profile(spec, out, _Commands(steps=40))

    lines = [line.split() for line in out.getvalue().splitlines()]
    assert lines[0] == ["READY"]
    chunks = lines[1:]
    assert chunks and all(words[0] == ITER_PREFIX and len(words) == 5 for words in chunks)
    steps = [int(words[4]) for words in chunks]
    assert all(int(words[3]) == 8 * n for words, n in zip(chunks, steps, strict=True))
    assert steps[0] == 1 and all(b <= 4 * a for a, b in itertools.pairwise(steps))
    spans = [(float(words[1]), float(words[2])) for words in chunks]
    assert all(start < end for start, end in spans)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))  # one after the other
    assert 2 + sum(steps) <= run.iterations == 40  # warm-up, the chunks, an unfinished one
    assert (run.execution_mode, run.execution_fallback) == ("eager", "")
    assert run.host_step_s is not None and run.host_step_s > 0


def test_the_profiler_runs_eager_on_cpu_when_graphs_are_asked_and_says_why(monkeypatch):
    import io

    import torch

    from workers.training import runtime, zoo
    from workers.training.execution import GRAPHS_NEED_GPU

    monkeypatch.setattr(zoo, "build_model", lambda *args: torch.nn.Sequential(torch.nn.Linear(20, 3)))
    monkeypatch.setattr(runtime, "apply_resources", lambda threads, cores: None)  # keep the test process's threads
    spec = ProfileChildSpec(
        architecture="resnet18",
        batch_size=8,
        num_classes=3,
        input_shape=(20,),
        threads=1,
        warmup_iterations=0,
        execution=ExecutionOptions(mode="graphs"),
    )

    run = child_module.profile(spec, io.StringIO(), _Commands(steps=3))

    assert (run.execution_mode, run.execution_fallback, run.iterations) == ("eager", GRAPHS_NEED_GPU, 3)


def test_relative_spread_is_the_largest_relative_difference():
    assert relative_spread([100.0, 50.0], [110.0, 50.0]) == pytest.approx(10 / 105)
    assert relative_spread([100.0], [None]) is None
    assert relative_spread([100.0], [100.0, 1.0]) is None


# ------------------------------------------------------------- one real configuration


def test_two_task_configuration_is_measured_while_both_train(agent_context, monkeypatch):
    windows = []

    def recording_window(iterations, until):
        windows.append(([list(its) for its in iterations], until))
        return common_window(iterations, until)

    monkeypatch.setattr(profiling, "common_window", recording_window)
    tasks = [_task("mobilenet_v3_small", 16, 50), _task("shufflenet_v2_x1_0", 8, 100)]
    request = _request(min_timed_iterations=3)

    result = measure_configuration(tasks, request, agent_context, CpuBackend(), config_index=3)

    assert result.status == "succeeded", result.error
    assert (result.config_index, result.repeat_of, result.tasks) == (3, None, tasks)
    for measurement, task in zip(result.measurements, tasks, strict=True):
        assert measurement.architecture == task.architecture
        assert measurement.throughput_sps > 0 and measurement.timed_iterations >= 3
        assert measurement.peak_memory_bytes > 50 * 2**20  # torch alone is bigger than that
        assert measurement.standalone_sps is None and not measurement.error
        assert measurement.speed_index > 0  # the cpu backend probes its cores' speed
        assert measurement.execution_mode == "eager" and measurement.host_step_s > 0
    one_core, whole_device = result.measurements
    assert one_core.cross_core_rtt_ns is None  # a task on one core has no link to wait on
    if len(agent_context.cores) > 1:
        assert whole_device.cross_core_rtt_ns > 0  # the link between the task's cores, probed
    iterations, stop = windows[-1]
    counted = [[it for it in its if it.end <= stop] for its in iterations]
    first, second = counted
    assert first[0].start < second[-1].end and second[0].start < first[-1].end  # overlap
    assert launch.live_children() == []
    assert not (agent_context.state_dir / "work" / "sweep-5" / "config-3").exists()


_NEEDS_TWO_CORES = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="a link needs 2 cores (CI and the lab machines have them)"
)


def _late_link_probe(monkeypatch, delay_s: float) -> None:
    """Start the core link probe's process ``delay_s`` late, as a loaded host can."""
    command = profiling.CoreLinkProbe.command
    monkeypatch.setattr(
        profiling.CoreLinkProbe,
        "command",
        lambda self: ["sh", "-c", f"sleep {delay_s}; exec {shlex.join(command(self))}"],
    )


@_NEEDS_TWO_CORES
def test_a_short_window_waits_for_the_first_link_reading_of_a_multicore_task(agent_context, monkeypatch):
    # Forked profilers train within a fraction of a second of launch (new interpreters spend
    # seconds importing torch first, by when the probe has long been reading).
    backend, pool = CpuBackend(), ForkServerPool(agent_context.state_dir / "servers")
    try:
        pool.server_for(backend.trainer_env(backend.standalone_resources(agent_context)))
        _late_link_probe(monkeypatch, 1.5)
        started = time.monotonic()
        result = measure_configuration(
            [_task(share=100)], _request(), agent_context, backend, config_index=0, launcher=pool
        )
    finally:
        pool.close()
    assert result.status == "succeeded", result.error
    assert result.measurements[0].cross_core_rtt_ns > 0
    assert time.monotonic() - started > 1.5  # it trained on until the probe read


@_NEEDS_TWO_CORES
def test_a_link_probe_that_never_reads_delays_a_configuration_by_a_bounded_time(agent_context, monkeypatch):
    _late_link_probe(monkeypatch, 60)
    monkeypatch.setattr(profiling, "_LINK_WAIT_S", 0.5)
    result = measure_configuration([_task(share=100)], _request(), agent_context, CpuBackend(), config_index=0)
    assert result.status == "succeeded", result.error
    assert result.measurements[0].throughput_sps > 0 and result.measurements[0].cross_core_rtt_ns is None


class _BadCoreBackend(CpuBackend):
    """Pins the second process to a CPU that does not exist, so it crashes at start."""

    def resources_for_shares(self, shares, partitioning, ctx):
        resources = super().resources_for_shares(shares, partitioning, ctx)
        if len(resources) > 1:
            resources[1] = TrainerResources(threads=1, cores=[99_999])
        return resources


def test_crashing_profiler_fails_the_configuration_and_kills_the_others(agent_context):
    tasks = [_task(share=50), _task("shufflenet_v2_x1_0", share=50)]

    result = measure_configuration(tasks, _request(), agent_context, _BadCoreBackend(), config_index=0)

    assert result.status == "failed"
    assert "task 1 (shufflenet_v2_x1_0, batch 8, 50 %)" in result.error
    first, second = result.measurements
    assert "OSError" in second.error and second.throughput_sps is None
    assert first.throughput_sps is None and first.error
    assert launch.live_children() == []
    kept = agent_context.state_dir / "work" / "sweep-5" / "config-0"
    assert (kept / "task-1.stderr.log").exists()  # a failed configuration's files stay


def test_configuration_past_its_timeout_fails_and_is_killed(agent_context):
    result = measure_configuration([_task()], _request(config_timeout_s=1), agent_context, CpuBackend(), config_index=0)

    assert result.status == "failed" and "config_timeout_s" in result.error
    assert launch.live_children() == []


def test_configuration_with_a_share_out_of_range_fails_as_data(agent_context):
    task = ProfileTaskSpec.model_construct(architecture="mobilenet_v3_small", batch_size=8, active_thread_percentage=0)

    result = measure_configuration([task], _request(), agent_context, CpuBackend(), config_index=0)

    assert result.status == "failed" and "shares[0]" in result.error


class _RecordingBackend(CpuBackend):
    """Records the partitioning it is asked for; with ``refuse``, allocates nothing."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.allocated: list[str] = []
        self.dispatched: list[str] = []
        self.locks: list[object] = []

    def resources_for_shares(self, shares, partitioning, ctx):
        self.allocated.append(partitioning)
        if self.refuse:
            raise ValueError("refused by the test backend")
        resources = super().resources_for_shares(shares, partitioning, ctx)
        self.locks += [r.lock_path for r in resources]
        return resources

    def prepare_dispatch(self, partitioning, ctx):
        self.dispatched.append(partitioning)


def test_configuration_is_measured_under_mps_partitioning_by_default(agent_context):
    backend = _RecordingBackend(refuse=True)

    result = measure_configuration([_task()], _request(), agent_context, backend, config_index=0)

    assert backend.allocated == ["mps"]
    assert result.status == "failed" and "refused by the test backend" in result.error


def test_configuration_with_an_unknown_partitioning_fails_as_data(agent_context):
    result = measure_configuration(
        [_task()], _request(), agent_context, CpuBackend(), config_index=0, partitioning="mig"
    )

    assert result.status == "failed" and "partitioning 'mig' is unknown" in result.error


def test_time_sliced_configuration_takes_turns_on_the_whole_device(agent_context):
    backend = _RecordingBackend()
    tasks = [_task("mobilenet_v3_small", 8, 30), _task("shufflenet_v2_x1_0", 8, 30)]

    result = measure_configuration(tasks, _request(), agent_context, backend, config_index=0, partitioning="timeslice")

    assert result.status == "succeeded", result.error
    assert backend.allocated == backend.dispatched == ["timeslice"]
    lock = agent_context.state_dir / "device.lock"
    assert backend.locks == [lock, lock]  # both took turns holding the device's lock
    assert all(m.throughput_sps > 0 for m in result.measurements)
    assert [m.active_thread_percentage for m in result.measurements] == [30, 30]
    assert launch.live_children() == []


# -------------------------------------------------------------------- real sweeps


def test_sweep_emits_results_with_standalone_throughput_and_a_repeat(agent_context):
    emitted: list[ProfileConfigResult] = []
    # Two configurations, the second the repeat, then stop: a configuration takes 3 to 6 s
    # (process start, torch import) on an idle 2-core machine and up to 25 s on a heavily loaded
    # one, so a budget short enough for a quick test could end the sweep after the first.
    request = _request(architectures=["mobilenet_v3_small"], batch_sizes=[8], budget_s=300, repeat_every=2)

    summary = run_sweep(request, agent_context, CpuBackend(), emitted.append, should_stop=lambda: len(emitted) >= 2)

    assert "stopped after 2 configurations" in summary.error
    assert summary.configs == len(emitted) == 2
    assert [r.config_index for r in emitted] == list(range(len(emitted)))
    alone = emitted[0]
    assert alone.tasks == [_task(share=100)] and alone.status == "succeeded"
    sps = alone.measurements[0].throughput_sps
    assert alone.measurements[0].standalone_sps == sps > 0
    assert emitted[1].repeat_of == 0
    assert len(summary.repeat_spread) >= 1 and summary.repeat_spread[0] >= 0
    for result in emitted:
        assert all(m.standalone_sps == sps for m in result.measurements)
    assert summary.samples == sum(len(r.measurements) for r in emitted if r.status == "succeeded")
    print(f"\nrepeat spread observed: {summary.repeat_spread}")


@pytest.mark.parametrize("fork_server", [False, True], ids=["new-interpreters", "fork-server"])
def test_sweep_goes_on_after_a_crashing_profiler(agent_context, monkeypatch, fork_server):
    crashing = "tests.workers.fakes.crashing_profiler"
    monkeypatch.setattr(profiling, "PROFILER_COMMAND", [sys.executable, "-m", crashing])
    monkeypatch.setattr(profiling, "PROFILER_MODULE", crashing)
    emitted: list[ProfileConfigResult] = []
    # seed 5 opens with [mobilenet 30 %, shufflenet 100 %]: mobilenet alone, then shufflenet.
    # The crash comes first and fast, so the budget is never spent before the sweep goes on,
    # however slow the machine.
    request = _request(batch_sizes=[8], budget_s=6, seed=5)

    summary = run_sweep(request, agent_context, CpuBackend(), emitted.append, fork_server=fork_server)

    assert summary.status == "succeeded", summary.error
    failed = [r for r in emitted if r.status == "failed"]
    assert failed and all("injected crash" in r.error for r in failed)
    assert any(r.status == "succeeded" for r in emitted)
    assert all(any(t.architecture == "mobilenet_v3_small" for t in r.tasks) for r in failed)
    assert launch.live_children() == []


def test_agent_shutdown_stops_a_running_sweep(agent_context):
    outcome = {}
    request = _request(architectures=["mobilenet_v3_small"], batch_sizes=[8], budget_s=600)
    runner = threading.Thread(
        target=lambda: outcome.update(summary=run_sweep(request, agent_context, CpuBackend(), lambda r: None))
    )
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while not launch.live_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        launch.request_shutdown()
        runner.join(timeout=30)
    finally:
        launch.clear_shutdown()

    summary = outcome["summary"]
    assert summary.status == "failed" and "agent shutting down" in summary.error
    assert summary.configs == 1 and summary.samples == 0
    assert launch.live_children() == []


# ------------------------------------------------------------ sweep logic, faked device


class _FakeDevice:
    """Stands in for the profiler processes: each configuration takes ``seconds`` of a fake
    clock; a task's throughput is ``100 · share / 100 / tasks`` (×1.1 on a repeat)."""

    def __init__(self, seconds: float = 1.0, fail=lambda tasks: False):
        self.now = 0.0
        self.seconds = seconds
        self.fail = fail
        self.calls: list[tuple[list[ProfileTaskSpec], int, int | None]] = []

    def clock(self) -> float:
        return self.now

    def measure(self, tasks, request, ctx, backend, *, config_index, repeat_of=None, should_stop=None, launcher=None):
        assert launcher is None  # the fixture turns the fork server off: nothing real runs
        self.calls.append((list(tasks), config_index, repeat_of))
        start = self.now
        self.now += self.seconds
        failed = self.fail(tasks)
        factor = 1.1 if repeat_of is not None else 1.0
        return ProfileConfigResult(
            sweep_id=request.sweep_id,
            device=ctx.device,
            config_index=config_index,
            repeat_of=repeat_of,
            tasks=list(tasks),
            started_at=start,
            finished_at=self.now,
            status="failed" if failed else "succeeded",
            error="boom" if failed else "",
            measurements=[
                ProfileMeasurement(
                    task_index=k,
                    architecture=t.architecture,
                    batch_size=t.batch_size,
                    active_thread_percentage=t.active_thread_percentage,
                    throughput_sps=None if failed else factor * t.active_thread_percentage / len(tasks),
                    error="boom" if failed else "",
                )
                for k, t in enumerate(tasks)
            ],
        )


@pytest.fixture
def fake_device(monkeypatch):
    device = _FakeDevice()
    monkeypatch.setenv(profiling.FORK_SERVER_ENV, "0")
    monkeypatch.setattr(profiling, "measure_configuration", device.measure)
    monkeypatch.setattr(profiling, "time", SimpleNamespace(monotonic=device.clock, time=device.clock))
    return device


def test_sweep_measures_each_pair_alone_before_it_is_needed(fake_device, agent_context):
    emitted: list[ProfileConfigResult] = []
    request = _request(budget_s=40, max_mix=3, batch_sizes=[8, 16, 32])

    summary = run_sweep(request, agent_context, CpuBackend(), emitted.append)

    assert summary.status == "succeeded" and summary.configs == len(emitted) == 40
    assert summary.elapsed_s == 40
    seen_alone = set()
    for result in emitted:
        pairs = {(t.architecture, t.batch_size) for t in result.tasks}
        single_full = len(result.tasks) == 1 and result.tasks[0].active_thread_percentage == 100
        if single_full:
            seen_alone |= pairs
        assert pairs <= seen_alone, f"config {result.config_index} ran before its P_alone"
        for m in result.measurements:
            assert m.standalone_sps == 100.0  # share 100, alone
    # The design's configurations come in order, standalone ones slotted in between; the last
    # design configuration may still have been waiting for its standalone measurements.
    measured = [_key(r.tasks) for r in emitted if r.repeat_of is None]
    design = [_key(c) for c in itertools.islice(sweep_design(request), 40)]
    done = [key for key in design if key in measured]
    assert done == design[: len(done)] and len(done) >= 10
    assert _is_subsequence(done, measured)


def _is_subsequence(short: list, long: list) -> bool:
    rest = iter(long)
    return all(item in rest for item in short)


def test_sweep_repeats_every_nth_configuration_and_reports_the_spread(fake_device, agent_context):
    emitted: list[ProfileConfigResult] = []

    summary = run_sweep(_request(budget_s=12, repeat_every=4), agent_context, CpuBackend(), emitted.append)

    repeats = [r for r in emitted if r.repeat_of is not None]
    assert [r.config_index for r in repeats] == [3, 7, 11]
    for repeat in repeats:
        original = emitted[repeat.repeat_of]
        assert original.repeat_of is None and original.tasks == repeat.tasks
    assert len({r.repeat_of for r in repeats}) == 3  # the least repeated is chosen
    assert summary.repeat_spread == pytest.approx([0.1 / 1.05] * 3)


def test_sweep_continues_after_failed_configurations(monkeypatch, agent_context):
    device = _FakeDevice(fail=lambda tasks: len(tasks) == 2)
    monkeypatch.setenv(profiling.FORK_SERVER_ENV, "0")
    monkeypatch.setattr(profiling, "measure_configuration", device.measure)
    monkeypatch.setattr(profiling, "time", SimpleNamespace(monotonic=device.clock, time=device.clock))
    emitted: list[ProfileConfigResult] = []

    summary = run_sweep(_request(budget_s=20), agent_context, CpuBackend(), emitted.append)

    assert summary.status == "succeeded" and summary.configs == 20
    assert {r.status for r in emitted} == {"failed", "succeeded"}
    assert summary.samples == sum(len(r.tasks) for r in emitted if r.status == "succeeded")


def test_sweep_whose_configurations_all_fail_is_failed(monkeypatch, agent_context):
    device = _FakeDevice(fail=lambda tasks: True)
    monkeypatch.setenv(profiling.FORK_SERVER_ENV, "0")
    monkeypatch.setattr(profiling, "measure_configuration", device.measure)
    monkeypatch.setattr(profiling, "time", SimpleNamespace(monotonic=device.clock, time=device.clock))

    summary = run_sweep(_request(budget_s=5), agent_context, CpuBackend(), lambda r: None)

    assert summary.status == "failed" and "all 5 configurations failed" in summary.error
    assert "boom" in summary.error


def test_sweep_survives_an_emit_that_raises(fake_device, agent_context):
    def emit(result):
        raise ConnectionError("broker down")

    summary = run_sweep(_request(budget_s=5), agent_context, CpuBackend(), emit)

    assert summary.status == "succeeded" and summary.configs == 5


def test_sweep_stops_when_asked(fake_device, agent_context):
    emitted: list[ProfileConfigResult] = []

    summary = run_sweep(
        _request(budget_s=100), agent_context, CpuBackend(), emitted.append, should_stop=lambda: len(emitted) >= 2
    )

    assert summary.status == "failed" and "stopped after 2 configurations" in summary.error
    assert summary.configs == 2


def test_sweep_for_another_device_is_refused_as_data(fake_device, agent_context):
    summary = run_sweep(_request(device="other"), agent_context, CpuBackend(), lambda r: None)

    assert summary.status == "failed" and "'other'" in summary.error
    assert summary.configs == 0 and fake_device.calls == []


class _NoProcessBackend(ExecutionBackend):
    """A backend without profiler processes (like a future simulated one)."""

    name = "none"

    def check_available(self):
        pass

    def run_round(self, request, ctx):
        raise NotImplementedError

    def measure_standalone(self, request, ctx):
        raise NotImplementedError


def test_sweep_on_a_backend_without_processes_is_refused_as_data(fake_device, agent_context):
    summary = run_sweep(_request(), agent_context, _NoProcessBackend(), lambda r: None)

    assert summary.status == "failed" and "'none' cannot run profiling sweeps" in summary.error
    assert fake_device.calls == []
