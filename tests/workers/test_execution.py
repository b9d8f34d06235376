"""The step runner (workers.training.execution): eager steps, and the graph-capture logic run on
CPU through a stand-in for CUDA graphs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workers.fl.fedprox import ProximalTerm
from workers.protocol.messages import ExecutionOptions, OptimizerConfig
from workers.training.execution import (
    BF16_NEEDS_GPU,
    GRAPH_WARMUP_STEPS,
    GRAPHS_NEED_GPU,
    StepRunner,
    resolve_execution,
)
from workers.training.trainer import build_optimizer, epoch_batches
from workers.training.zoo import build_model

CPU = torch.device("cpu")
GRAPHS = ExecutionOptions(mode="graphs")
EAGER = ExecutionOptions(mode="eager")


class _StandInGraph:
    """A "graph": the step it captured, and the addresses of the tensors the step used then. A
    real graph reads and writes those addresses forever, so a replay checks that every one of
    those tensors is still where it was (a gradient set to None and allocated anew would leave
    the real graph writing into freed memory)."""

    def __init__(self, guarded: Callable[[], list[torch.Tensor]]) -> None:
        self._guarded = guarded
        self.step: Callable[[], None] | None = None
        self.addresses: list[int] = []
        self.replays = 0

    def replay(self) -> None:
        assert self.step is not None, "replayed before capture"
        assert [t.data_ptr() for t in self._guarded()] == self.addresses, "a tensor the graph captured moved"
        self.replays += 1
        self.step()


class StandInGraphs:
    """Captures as CUDA does, on CPU: the step's Python runs once (so a host read or an error
    surfaces at capture: ``Tensor.item`` raises as it does on a capturing stream) but its
    effects on the guarded tensors and the RNG are undone (a capture executes no kernel); the
    graph keeps the step, and a replay runs it again on the static buffers it captured.

    ``refuse_host_reads=False`` lets ``Tensor.item`` through: Adam without ``capturable`` (which
    torch allows on accelerators only) reads its step counter so, a host read of a CPU tensor."""

    def __init__(self, guarded: Callable[[], list[torch.Tensor]], *, refuse_host_reads: bool = True) -> None:
        self._guarded = guarded
        self._refuse_host_reads = refuse_host_reads
        self.captures = 0
        self.side_stream_steps = 0
        self.capturing = False

    def new_graph(self) -> _StandInGraph:
        return _StandInGraph(self._guarded)

    def capture(self, graph: _StandInGraph, step: Callable[[], None]) -> None:  # type: ignore[override]
        tensors = self._guarded()
        saved = [t.detach().clone() for t in tensors]

        def refuse_host_read(tensor: torch.Tensor) -> object:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

        self.capturing = True
        try:
            item = refuse_host_read if self._refuse_host_reads else torch.Tensor.item
            with torch.random.fork_rng(), _patched(torch.Tensor, "item", item):
                step()
        finally:
            self.capturing = False
            with torch.no_grad():
                for tensor, value in zip(tensors, saved, strict=True):
                    tensor.copy_(value)
        graph.step = step
        graph.addresses = [t.data_ptr() for t in tensors]
        self.captures += 1

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        self.side_stream_steps += 1
        yield

    def synchronize(self) -> None:
        pass


@contextlib.contextmanager
def _patched(owner: object, name: str, value: object) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _guard(
    model: nn.Module, optimizer: torch.optim.Optimizer, runner: list[StepRunner]
) -> Callable[[], list[torch.Tensor]]:
    """Every tensor a step writes: parameters, buffers, gradients, optimiser state, the loss sum."""

    def tensors() -> list[torch.Tensor]:
        found = [*model.state_dict().values()]
        found += [p.grad for p in model.parameters() if p.grad is not None]
        for state in optimizer.state.values():
            found += [v for v in state.values() if isinstance(v, torch.Tensor)]
        found += [r._loss_sum for r in runner]
        return found

    return tensors


class SmallNet(nn.Module):
    """Conv + BatchNorm + dropout: buffers, randomness and a 4-D input, in a few ms a step."""

    def __init__(self, host_read_at: int | None = None, raise_at_call: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(8, 10)
        self.calls = 0
        self.host_read_at = host_read_at
        self.raise_at_call = raise_at_call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.raise_at_call is not None and self.calls == self.raise_at_call:
            raise RuntimeError("an op the graph cannot hold")
        h = F.relu(self.bn(self.conv(x)))
        if self.host_read_at is not None and h.mean().item() > -1.0:  # data-dependent control flow
            h = h * 1.0
        return self.head(self.drop(h.mean(dim=(2, 3))))


def _data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator)


def _train(
    model: nn.Module,
    options: ExecutionOptions,
    *,
    epochs: int = 2,
    batch_size: int = 12,
    graphs: bool,
    optimizer_config: OptimizerConfig | None = None,
    proximal_mu: float = 0.0,
) -> tuple[StepRunner, list[tuple[float, int]], StandInGraphs | None]:
    """Train ``model`` on :func:`_data` as a trainer does (seeded shuffles, a short last batch);
    return the runner, each epoch's ``take_loss`` and the stand-in."""
    x, y = _data()
    optimizer = build_optimizer(model, optimizer_config or OptimizerConfig())
    proximal = ProximalTerm(model, proximal_mu) if proximal_mu > 0 else None
    runners: list[StepRunner] = []
    refuse_host_reads = optimizer_config is None or optimizer_config.name != "adam"
    api = StandInGraphs(_guard(model, optimizer, runners), refuse_host_reads=refuse_host_reads) if graphs else None
    runner = StepRunner(model, optimizer, CPU, options, client_term=proximal, graph_api=api)
    runners.append(runner)
    torch.manual_seed(7)
    model.train()
    losses = []
    for epoch in range(epochs):
        for idx in epoch_batches(len(y), batch_size, torch.Generator().manual_seed(epoch)):
            runner.step(x[idx], y[idx])
        losses.append(runner.take_loss())
    runner.close()
    return runner, losses, api


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------- resolve


@pytest.mark.parametrize(
    ("mode", "device", "expected"),
    [
        ("auto", "cpu", ("eager", "")),
        ("auto", "cuda", ("graphs", "")),
        ("eager", "cuda", ("eager", "")),
        ("eager", "cpu", ("eager", "")),
        ("graphs", "cuda", ("graphs", "")),
        ("graphs", "cpu", ("eager", GRAPHS_NEED_GPU)),
    ],
)
def test_resolve_execution_picks_graphs_on_cuda_only(mode, device, expected):
    assert resolve_execution(ExecutionOptions(mode=mode), torch.device(device)) == expected


def test_graphs_asked_on_cpu_run_eager_and_say_why():
    runner, losses, _ = _train(SmallNet(), GRAPHS, graphs=False, epochs=1)

    assert runner.mode == "eager" and runner.fallback == GRAPHS_NEED_GPU
    assert losses[0][1] == 40


def test_bf16_on_cpu_is_ignored_with_a_note_and_trains_as_fp32():
    torch.manual_seed(0)
    fp32 = SmallNet()
    bf16 = SmallNet()
    bf16.load_state_dict(fp32.state_dict())

    _train(fp32, EAGER, graphs=False)
    runner, _, _ = _train(bf16, ExecutionOptions(mode="eager", precision="bf16"), graphs=False)

    assert runner.fallback == BF16_NEEDS_GPU
    assert _same(_weights(fp32), _weights(bf16))


# ---------------------------------------------------------------------------- the loss


def test_take_loss_sums_each_batch_loss_times_its_size_and_resets():
    torch.manual_seed(0)
    model = SmallNet()
    model.drop.p = 0.0  # deterministic forward, so the reference below sees the same losses
    x, y = _data(10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # no update: losses are recomputable
    runner = StepRunner(model, optimizer, CPU, EAGER)

    runner.step(x[:6], y[:6])
    runner.step(x[6:], y[6:])
    total, samples = runner.take_loss()

    expected = 6 * F.cross_entropy(model(x[:6]), y[:6]).item() + 4 * F.cross_entropy(model(x[6:]), y[6:]).item()
    assert samples == 10
    assert total == pytest.approx(expected, rel=1e-6)
    assert runner.take_loss() == (0.0, 0)


def test_a_non_finite_loss_raises_at_take_loss_not_in_the_step():
    model = SmallNet()
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    runner = StepRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), CPU, EAGER)
    x, y = _data(8)

    runner.step(x, y)  # no host read: the step cannot see the NaN

    with pytest.raises(FloatingPointError, match="lower optimizer.learning_rate"):
        runner.take_loss()


# ---------------------------------------------------------------------------- graphs


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_stand_in_graphs_train_the_same_weights_as_eager(optimizer):
    config = OptimizerConfig(name=optimizer, learning_rate=0.01)
    torch.manual_seed(0)
    eager_model = SmallNet()
    graph_model = SmallNet()
    graph_model.load_state_dict(eager_model.state_dict())

    _, eager_losses, _ = _train(eager_model, EAGER, graphs=False, optimizer_config=config)
    runner, graph_losses, api = _train(graph_model, GRAPHS, graphs=True, optimizer_config=config)

    assert runner.mode == "graphs" and runner.fallback == ""
    # 40 samples in batches of 12: sizes 12, 12, 12, 4 each epoch, so two graphs: 12 after its
    # warm-up step, and the short last batch's, captured at its second occurrence (epoch 2).
    assert api is not None and api.captures == runner.captures == 2
    assert api.side_stream_steps == 2 * GRAPH_WARMUP_STEPS
    assert _same(_weights(eager_model), _weights(graph_model))
    assert [s for _, s in graph_losses] == [40, 40]
    assert graph_losses == eager_losses


def test_stand_in_graphs_with_the_proximal_term_train_as_eager():
    torch.manual_seed(0)
    eager_model = SmallNet()
    graph_model = SmallNet()
    graph_model.load_state_dict(eager_model.state_dict())

    _train(eager_model, EAGER, graphs=False, proximal_mu=0.5)
    runner, _, _ = _train(graph_model, GRAPHS, graphs=True, proximal_mu=0.5)

    assert runner.captures == 2
    assert _same(_weights(eager_model), _weights(graph_model))


def test_a_short_last_batch_gets_a_graph_of_its_own_and_is_never_dropped():
    runner, losses, api = _train(SmallNet(), GRAPHS, graphs=True, epochs=3, batch_size=16)

    # 40 = 16 + 16 + 8 each epoch: every sample trained in every epoch.
    assert [s for _, s in losses] == [40, 40, 40]
    assert runner.steps == 9 and runner.captures == 2


def test_the_zoo_model_trains_the_same_through_stand_in_graphs():
    config = OptimizerConfig(learning_rate=0.01)
    eager_model = build_model("mobilenet_v3_small", 10, 0)
    graph_model = build_model("mobilenet_v3_small", 10, 0)
    x = torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (12,), generator=torch.Generator().manual_seed(2))

    results = []
    for model, options, graphs in ((eager_model, EAGER, False), (graph_model, GRAPHS, True)):
        optimizer = build_optimizer(model, config)
        runners: list[StepRunner] = []
        api = StandInGraphs(_guard(model, optimizer, runners)) if graphs else None
        runner = StepRunner(model, optimizer, CPU, options, graph_api=api)
        runners.append(runner)
        torch.manual_seed(3)
        for _ in range(3):
            runner.step(x[:4], y[:4])
        results.append((runner.captures, runner.take_loss()))

    assert results[1][0] == 1
    assert results[0][1] == results[1][1]
    assert _same(_weights(eager_model), _weights(graph_model))


def test_a_forward_that_reads_the_host_falls_back_to_eager_and_still_trains():
    torch.manual_seed(0)
    eager_model = SmallNet(host_read_at=0)
    graph_model = SmallNet(host_read_at=0)
    graph_model.load_state_dict(eager_model.state_dict())

    _, eager_losses, _ = _train(eager_model, EAGER, graphs=False)
    runner, graph_losses, _ = _train(graph_model, GRAPHS, graphs=True)

    assert runner.mode == "eager"
    assert runner.fallback.startswith("graph capture failed, ran eager: RuntimeError: ")
    assert "not permitted when stream is capturing" in runner.fallback
    assert "\n" not in runner.fallback
    assert runner.captures == 0
    assert _same(_weights(eager_model), _weights(graph_model))
    assert graph_losses == eager_losses


def test_a_first_replay_that_fails_restores_the_state_and_runs_the_step_eagerly():
    torch.manual_seed(0)
    # Calls: 1 warm-up (eager), 2 capture, 3 the first replay: it raises. The step is then
    # run again eagerly (call 4) from the state before the capture.
    eager_model = SmallNet()
    graph_model = SmallNet(raise_at_call=GRAPH_WARMUP_STEPS + 2)
    graph_model.load_state_dict(eager_model.state_dict())

    _, eager_losses, _ = _train(eager_model, EAGER, graphs=False)
    runner, graph_losses, _ = _train(graph_model, GRAPHS, graphs=True)

    assert runner.mode == "eager" and "an op the graph cannot hold" in runner.fallback
    assert _same(_weights(eager_model), _weights(graph_model))
    assert graph_losses == eager_losses


def test_eager_mode_never_touches_the_graph_api():
    api = StandInGraphs(list)
    model = SmallNet()
    runner = StepRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), CPU, EAGER, graph_api=api)
    x, y = _data(8)

    runner.step(x, y)
    runner.step(x, y)

    assert runner.mode == "eager" and api.captures == 0 and api.side_stream_steps == 0


def test_channels_last_converts_the_model_for_the_job_and_back():
    model = SmallNet()
    runner = StepRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), CPU, ExecutionOptions(channels_last=True))
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    x, y = _data(8)

    runner.step(x, y)
    runner.close()

    assert model.conv.weight.is_contiguous()
    assert runner.take_loss()[1] == 8


# ---------------------------------------------------------------------------- the CUDA api


class _FakeCapture:
    """torch.cuda.graph's stand-in: its exit fails as ending an invalidated capture does."""

    def __init__(self, graph: object, pool: object = None, stream: object = None) -> None:
        pass

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc_info: object) -> None:
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")


def test_a_failed_capture_reports_the_step_error_not_the_capture_end(monkeypatch):
    from workers.training import execution

    class FakeGraph:
        pass

    monkeypatch.setattr(torch.cuda, "graph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    api = execution.CudaGraphApi.__new__(execution.CudaGraphApi)  # no GPU here: skip its stream and pool
    api._pool, api._stream = None, None

    def step() -> None:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        api.capture(FakeGraph(), step)
    with pytest.raises(RuntimeError, match="previous error during capture"):
        api.capture(FakeGraph(), lambda: None)  # a step that passed: the end's own error stands
