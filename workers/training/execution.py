"""How a trainer runs its training step: eagerly, op by op, or as a captured CUDA graph.

One step is: zero the gradients, forward and cross-entropy loss, backward, the client term's
gradient when the task's aggregator has one (:class:`workers.registry.aggregators.ClientTerm`,
e.g. FedProx's proximal term), and the optimiser step. :class:`StepRunner` runs it in the mode
:func:`resolve_execution` chose from the task's
:class:`~workers.protocol.messages.ExecutionOptions` and the device:

- ``eager``: the step as PyTorch issues it, one kernel launch per operation from the host.
- ``graphs`` (CUDA only): the whole step is captured once per batch size as a CUDA graph and
  replayed from static input buffers (PyTorch's "whole network capture" recipe,
  https://pytorch.org/docs/stable/notes/cuda.html#whole-network-capture). A replay is one
  launch: the host no longer spends 18-25 µs per operation (issue 31: 480 to 1,397 operations
  a step for the light mix's models), so it queues work ahead of the GPU.

Neither mode reads anything back to the host inside a step: the batch's loss times its size is
added to a device-side accumulator, and :meth:`StepRunner.take_loss` reads the sum once (one
host synchronisation) when the caller wants it, once per epoch or timing window.

The CUDA calls graphs need (make a graph, capture into it, a side stream for the warm-up, a
device synchronisation) go through a small :class:`GraphApi`, so the capture logic (when to
capture, the fallback, the state restored after a failed capture) runs on CPU in the tests with
a stand-in that "captures" by recording the step and "replays" by running it again on the
static buffers. torch is imported inside functions: importing this module stays light.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from workers.protocol.messages import ExecutionOptions

if TYPE_CHECKING:
    import torch

    from workers.registry.aggregators import ClientTerm

ExecutedMode = Literal["eager", "graphs"]
"""What a step runner really runs (``ExecutionOptions.mode`` with ``auto`` resolved)."""

GRAPHS_NEED_GPU = "CUDA graphs need a GPU; ran eager on cpu"
"""The fallback reason when ``mode="graphs"`` meets a CPU trainer (the control plane refuses
such a task with a 400 before it gets here; a worker still never fails a round on it)."""

BF16_NEEDS_GPU = "bf16 autocast is GPU only; ran fp32 on cpu"
"""The note when ``precision="bf16"`` meets a CPU trainer: CPU bf16 kernels are slower than
fp32 ones on most hosts and change the numerics of a cpu round, so the option is ignored there."""

GRAPH_WARMUP_STEPS = 1
"""Eager steps a batch size runs before its graph is captured. They are real training steps on
real batches (counted as trained), run on a side stream as the recipe asks. One is enough here:
it creates the optimiser state (SGD's momentum buffers take their first value from a branch a
graph cannot hold; Adam's state), the gradient tensors the graph zeroes and accumulates into,
and the cuBLAS/cuDNN workspaces; cuDNN autotuning has already run for every batch shape of a
round before the start barrier (:func:`workers.training.trainer.warm_up_shapes`), or runs in
this step. More warm-up steps would only keep more of a short round eager."""

STEPS_BEFORE_REPLAY = GRAPH_WARMUP_STEPS + 1
"""Steps of one batch size before its graph replays: the warm-up steps and the capturing step
(which a first replay trains). A measurement leaves at least these out of its timed window."""

FALLBACK_MAX_CHARS = 200
"""A fallback reason is trimmed to this many characters (it is shown in tables)."""


def resolve_execution(options: ExecutionOptions, device: torch.device) -> tuple[ExecutedMode, str]:
    """Choose the mode a trainer runs on ``device`` for ``options``.

    ``auto`` is ``graphs`` on a CUDA device and ``eager`` elsewhere; ``eager`` is eager
    everywhere; ``graphs`` is graphs on CUDA and ``eager`` on any other device, with
    :data:`GRAPHS_NEED_GPU` as the reason.

    Args:
        options: the task's execution options.
        device: the device the trainer computes on.

    Returns:
        ``(mode, reason)``: the mode to run and why it is not what was asked (``""`` when it is,
        ``auto`` included).
    """
    if options.mode == "eager":
        return "eager", ""
    if device.type == "cuda":
        return "graphs", ""
    return "eager", GRAPHS_NEED_GPU if options.mode == "graphs" else ""


class Graph(Protocol):
    """A captured step: :meth:`replay` runs it again on whatever its static buffers hold."""

    def replay(self) -> None:
        """Run the captured work once more (asynchronously on a GPU)."""


class GraphApi(Protocol):
    """The CUDA calls graph mode needs; :class:`CudaGraphApi` on a GPU, a stand-in in tests."""

    def new_graph(self) -> Graph:
        """An empty graph to capture into."""

    def capture(self, graph: Graph, step: Callable[[], None]) -> None:
        """Capture ``step`` into ``graph`` (on a GPU nothing runs: the kernels are recorded).

        Raises:
            Exception: whatever the capture raised (an uncapturable operation, a host read).
        """

    def side_stream(self) -> contextlib.AbstractContextManager[None]:
        """A context in which work runs on a side stream that first waits for, and is then
        waited for by, the current stream (the recipe's warm-up)."""

    def synchronize(self) -> None:
        """Wait for everything queued on the device."""


class CudaGraphApi:
    """:class:`GraphApi` on the current CUDA device: :class:`torch.cuda.CUDAGraph`, captured
    with :class:`torch.cuda.graph` into one memory pool shared by the runner's graphs.

    Sharing the pool is safe here because no graph's output is read after another graph
    replays: the gradients, optimiser state, loss accumulator and static inputs a step reads
    or writes all live outside the pool (allocated before the capture), so what a graph keeps
    in the pool is its own activations and temporaries, dead between its replays. The
    short-batch graph then costs no second copy of the activations' memory, which a pinned
    MPS memory limit would have to allow.
    """

    def __init__(self) -> None:
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        self._pool = torch.cuda.graph_pool_handle()
        self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream.__new__ unannotated

    def new_graph(self) -> Graph:
        """A new, empty :class:`torch.cuda.CUDAGraph`."""
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        graph: Graph = torch.cuda.CUDAGraph()
        return graph

    def capture(self, graph: Graph, step: Callable[[], None]) -> None:
        """Capture ``step`` into ``graph`` on the side stream, into the shared pool.

        Raises:
            Exception: the step's own error when it fails under capture (not the "capture
                invalidated" error ending the capture then raises).
        """
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        assert isinstance(graph, torch.cuda.CUDAGraph)
        failure: Exception | None = None
        try:
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 - raised below, once the capture has ended
                    failure = exc
        except Exception:
            # Ending a capture the step broke fails too ("invalidated"): the step's error is the cause.
            if failure is None:
                raise
        if failure is not None:
            raise failure

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        """Run the body on the side stream, ordered after and before the current stream's work."""
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        current = torch.cuda.current_stream()
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            yield
        current.wait_stream(self._stream)

    def synchronize(self) -> None:
        """Wait for all work queued on the current CUDA device (``torch.cuda.synchronize``)."""
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        torch.cuda.synchronize()


@dataclass
class _Captured:
    """One batch size's graph and the static buffers its replays read."""

    graph: Graph
    x: torch.Tensor
    y: torch.Tensor


class StepRunner:
    """Runs a model's training steps eagerly or as CUDA graphs; sums the loss on the device.

    Graphs mode (CUDA only, :func:`resolve_execution`): a batch size's first
    :data:`GRAPH_WARMUP_STEPS` steps run eagerly on a side stream — real training steps on the
    real batches, counted like any other, so warm-up changes the training result exactly as
    eager steps would — and the next step of that size captures the whole step (zero the
    gradients in place, i.e. ``zero_grad(set_to_none=False)``, forward, loss, backward,
    client term's gradient, optimiser step, loss accumulation) into its graph and replays it; every
    later step of that size copies its batch into the graph's static buffers and replays it.
    Capturing runs nothing, so the capturing step's batch is trained once, by that first replay.
    The optimiser must not read host values inside its step: SGD (no ``capturable`` flag in
    torch 2.x; with its momentum buffers created by the warm-up step its foreach update reads
    none, and its learning rate is a constant of the job, baked in) and Adam (switched to
    ``capturable=True`` here before its state exists: its step counter then lives on the
    device). Dropout masks in a graph come from PyTorch's graph-safe Philox offsets.

    Every tensor a graph touches stays where it was captured: static buffers, gradients (never
    set to ``None`` in graphs mode, warm-up steps included), optimiser state, the loss sum.

    The epoch's short last batch (and the one of ``batch_size + 1`` when a trailing single
    sample is merged, :func:`workers.training.trainer.epoch_batches`) is a batch size of its
    own with its own graph, captured the same way: it is never dropped, because dropping would
    change ``samples_trained`` and so the FedAvg weights. It occurs once an epoch, so in a
    one-epoch round it is its warm-up step and runs eagerly; from its second occurrence it
    replays its graph.

    Fallback: if a capture or a graph's first replay raises (data-dependent control flow, a
    plug-in reading a value back with ``.item()``, an operation CUDA graphs cannot hold), the
    graphs are freed, the model's parameters and buffers and the optimiser's state are put back
    as they were before that capture, the step is run eagerly, the runner stays eager for the
    rest of its life and :attr:`fallback` says why in one line. A round never fails for it.

    ``precision="bf16"``: forward and loss under ``torch.autocast("cuda", torch.bfloat16)``
    (autocast's weight cache off, which graph capture requires); on CPU the option is ignored
    (:data:`BF16_NEEDS_GPU`). ``channels_last``: the model is converted to
    ``torch.channels_last`` here (its 4-D weights) and 4-D inputs are too; :meth:`close` puts
    the model back in contiguous format (a warm trainer keeps it, and weights are saved from it).

    Args:
        model: in training mode, on ``device``.
        optimizer: over ``model``'s parameters, with no state yet when graphs may run (an Adam
            with state keeps ``capturable=False``, and its capture then falls back).
        device: where the model is.
        options: the task's execution options.
        client_term: the aggregator's client term (its gradient is added after the backward
            pass, inside the captured graph in graphs mode), or ``None``.
        graph_api: the CUDA calls (default :class:`CudaGraphApi` when graphs run); tests pass a
            stand-in, and with one graphs run on any device.

    Attributes:
        mode: what runs now, ``"eager"`` or ``"graphs"`` (``"eager"`` after a fallback).
        fallback: why ``mode`` is not what was asked, ``""`` if it is.
        steps: steps run so far.
        captures: graphs captured so far.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        options: ExecutionOptions,
        *,
        client_term: ClientTerm | None = None,
        graph_api: GraphApi | None = None,
    ) -> None:
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.client_term = client_term
        notes: list[str] = []
        if graph_api is not None and options.mode != "eager":
            mode: ExecutedMode = "graphs"
        else:
            mode, reason = resolve_execution(options, device)
            if reason:
                notes.append(reason)
        self._bf16 = options.precision == "bf16" and device.type == "cuda"
        if options.precision == "bf16" and not self._bf16:
            notes.append(BF16_NEEDS_GPU)
        self._channels_last = options.channels_last
        if self._channels_last:
            model.to(memory_format=torch.channels_last)
        self.mode: ExecutedMode = mode
        self.fallback = "; ".join(notes)
        self.steps = 0
        self.captures = 0
        self._graph_api = graph_api
        if mode == "graphs":
            if self._graph_api is None:
                self._graph_api = CudaGraphApi()
            if device.type == "cuda":  # torch allows capturable optimisers on accelerators only
                _make_capturable(optimizer)
        self._graphs: dict[int, _Captured] = {}
        self._seen: dict[int, int] = {}
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self._samples = 0

    # ------------------------------------------------------------------ the step

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Run one training step on the batch ``(x (N, *input_shape) float32, y (N,) int64)``.

        Queues the work and returns without waiting for it (on a GPU) and without reading
        anything back; the batch's ``loss · N`` joins the device-side sum :meth:`take_loss`
        reads.

        Raises:
            Exception: an error of the eager step (a failed capture never raises: it falls back).
        """
        size = int(y.shape[0])
        self.steps += 1
        self._samples += size
        if self.mode == "eager":
            self._eager_step(x, y)
            return
        captured = self._graphs.get(size)
        if captured is not None:
            captured.x.copy_(x)
            captured.y.copy_(y)
            captured.graph.replay()
            return
        seen = self._seen.get(size, 0)
        self._seen[size] = seen + 1
        if seen < GRAPH_WARMUP_STEPS:
            assert self._graph_api is not None
            with self._graph_api.side_stream():
                self._eager_step(x, y)
            return
        self._capture_and_replay(x, y)

    def _body(self, x: torch.Tensor, y: torch.Tensor, size: int) -> None:
        """The step itself, as captured or run eagerly after ``zero_grad``: forward, loss,
        backward, client term's gradient, optimiser step, loss accumulation."""
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch
        import torch.nn.functional as F

        if self._channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._bf16, cache_enabled=False):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if self.client_term is not None:
            self.client_term.add_gradient()
        self.optimizer.step()
        # float64: the sum over an epoch of fp32 losses keeps the digits a host-side sum did.
        self._loss_sum.add_(loss.detach().to(torch.float64), alpha=size)

    def _eager_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        # In graphs mode the gradients are zeroed in place, never dropped: a graph captured for
        # another batch size reads and writes these very tensors, and a gradient allocated anew
        # would leave it writing into freed memory. Eager mode drops them (less memory between
        # steps); 0 + g is g exactly, so both give the same weights.
        self.optimizer.zero_grad(set_to_none=self.mode == "eager")
        self._body(x, y, int(y.shape[0]))

    def _graph_body(self, captured: _Captured, size: int) -> None:
        # In place: the graph writes into the gradient tensors the warm-up step created,
        # which live outside the graph's pool and which the captured optimiser step reads.
        self.optimizer.zero_grad(set_to_none=False)
        self._body(captured.x, captured.y, size)

    def _capture_and_replay(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Capture the step for ``x``'s batch size and replay it once on ``(x, y)``; on any
        error put the state back, fall back to eager and run the step eagerly."""
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        api = self._graph_api
        assert api is not None
        size = int(y.shape[0])
        saved = _snapshot(self.model, self.optimizer, self._loss_sum)
        layout = torch.channels_last if self._channels_last and x.dim() == 4 else torch.contiguous_format
        captured = _Captured(
            graph=api.new_graph(),
            x=torch.empty_like(x, memory_format=layout),
            y=torch.empty_like(y),
        )
        # The batch goes into the static buffers first: a capture reads them as a step would.
        captured.x.copy_(x)
        captured.y.copy_(y)
        try:
            api.synchronize()
            api.capture(captured.graph, lambda: self._graph_body(captured, size))
            captured.graph.replay()
            api.synchronize()  # the first replay's errors surface here, not in a later step
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eager
            self._fall_back(exc, saved)
            self._eager_step(x, y)
            return
        self._graphs[size] = captured
        self.captures += 1

    def _fall_back(self, exc: BaseException, saved: _Snapshot) -> None:
        """Free the graphs, restore the state saved before the capture, and go eager."""
        with contextlib.suppress(Exception):
            # A capture that failed leaves its stream's error for the next call: take it here.
            assert self._graph_api is not None
            self._graph_api.synchronize()
        self._graphs.clear()
        _restore(self.model, self.optimizer, self._loss_sum, saved)
        reason = f"graph capture failed, ran eager: {type(exc).__name__}: {exc}"
        reason = " ".join(reason.split())
        if len(reason) > FALLBACK_MAX_CHARS:
            reason = reason[: FALLBACK_MAX_CHARS - 1] + "…"
        self.fallback = "; ".join(part for part in (self.fallback, reason) if part)
        self.mode = "eager"

    # ------------------------------------------------------------------ the loss

    def take_loss(self) -> tuple[float, int]:
        """Read the loss summed since the last call, and reset it.

        One host synchronisation (the read of one device scalar).

        Returns:
            ``(Σ_batches loss_b · N_b, Σ_batches N_b)``: the sample-weighted loss sum (mean
            cross-entropy of each batch times its size, without the client term) and the
            samples it covers; divide for the mean. ``(0.0, 0)`` when no step ran.

        Raises:
            FloatingPointError: if the sum is not finite (a batch's loss diverged): the message
                says to lower ``optimizer.learning_rate``.
        """
        total = float(self._loss_sum)
        samples = self._samples
        self._loss_sum.zero_()
        self._samples = 0
        if not math.isfinite(total):
            raise FloatingPointError(f"training loss is {total}; lower optimizer.learning_rate")
        return total, samples

    def close(self) -> None:
        """Free the graphs (their memory pool goes back to the caching allocator once no
        graph holds it) and put a ``channels_last`` model back in contiguous format."""
        # deferred: torch (importing this module stays light; see the module docstring)
        import torch

        self._graphs.clear()
        if self._channels_last:
            self.model.to(memory_format=torch.contiguous_format)


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Set ``capturable=True`` on the optimiser's groups that have the flag (Adam, AdamW) while
    it has no state yet (its step counters are then created on the device); SGD has no flag
    and needs none (see :class:`StepRunner`)."""
    if optimizer.state:
        return
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True


@dataclass(frozen=True)
class _Snapshot:
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    loss_sum: torch.Tensor


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_sum: torch.Tensor) -> _Snapshot:
    """Copies of the model's parameters and buffers, the optimiser's state and the loss sum."""
    return _Snapshot(
        model={name: value.detach().clone() for name, value in model.state_dict().items()},
        optimizer=copy.deepcopy(optimizer.state_dict()),
        loss_sum=loss_sum.detach().clone(),
    )


def _restore(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_sum: torch.Tensor, saved: _Snapshot
) -> None:
    """Put back what :func:`_snapshot` copied, in place for the model (parameters keep their
    identity, which the optimiser and the client term hold) and the loss sum."""
    # deferred: torch (importing this module stays light; see the module docstring)
    import torch

    with torch.no_grad():
        model.load_state_dict(saved.model, strict=True)
        loss_sum.copy_(saved.loss_sum)
    optimizer.load_state_dict(saved.optimizer)
    optimizer.zero_grad(set_to_none=True)
