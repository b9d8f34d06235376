"""The trainer's pieces in-process, and its command line in a subprocess."""

from __future__ import annotations

import io
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

import workers
from workers.training.trainer import (
    EXIT_BAD_SPEC,
    IterationRecord,
    TrainerSpec,
    batches_per_epoch,
    epoch_batches,
    steady_state,
    train,
    window_ends,
)

REPO = Path(workers.__file__).parents[1]


def _records(*samples: int) -> list[IterationRecord]:
    return [IterationRecord(epoch=0, samples=n, seconds=0.5) for n in samples]


def test_steady_state_skips_warmup_iterations():
    timed, throughput = steady_state(_records(16, 16, 16, 8), warmup_iterations=2)

    assert len(timed) == 2
    assert throughput == pytest.approx(24 / 1.0)


@pytest.mark.parametrize("samples,expected_timed", [((16, 16), 1), ((16,), 1), ((), 0)])
def test_steady_state_falls_back_when_run_is_short(samples, expected_timed):
    timed, throughput = steady_state(_records(*samples), warmup_iterations=5)

    assert len(timed) == expected_timed
    assert (throughput is None) == (expected_timed == 0)


def test_steady_state_times_the_windows_after_the_warm_up_steps():
    records = [
        IterationRecord(epoch=0, samples=32, seconds=9.0, iterations=2),  # warm-up and capture
        IterationRecord(epoch=0, samples=48, seconds=1.0, iterations=3),
        IterationRecord(epoch=1, samples=80, seconds=2.0, iterations=5),
    ]

    timed, throughput = steady_state(records, warmup_iterations=2)

    assert timed == records[1:]
    assert throughput == pytest.approx(128 / 3.0)


def test_steady_state_refuses_a_window_that_straddles_the_warm_up():
    with pytest.raises(ValueError, match="straddles the end of the 2 warm-up steps"):
        steady_state([IterationRecord(epoch=0, samples=48, seconds=1.0, iterations=3)], warmup_iterations=2)


@pytest.mark.parametrize(
    ("steps_per_epoch", "epochs", "warmup", "ends"),
    [
        (4, 2, 2, [2, 4, 8]),  # the warm-up's end, then each epoch's
        (4, 1, 4, [1, 4]),  # no more steps than warm-up: only the first is left out
        (1, 1, 2, [1]),  # a single step is timed
        (3, 2, 3, [3, 6]),  # warm-up ends with the first epoch
        (5, 1, 0, [5]),
        (0, 3, 2, []),
    ],
)
def test_a_trainer_synchronises_only_where_warm_up_and_epochs_end(steps_per_epoch, epochs, warmup, ends):
    assert window_ends(steps_per_epoch, epochs, warmup) == ends


@pytest.mark.parametrize(("n", "batch"), [(64, 16), (70, 16), (65, 16), (1, 16), (17, 16), (33, 32)])
def test_batches_per_epoch_counts_what_epoch_batches_cuts(n, batch):
    import torch

    assert batches_per_epoch(n, batch) == len(epoch_batches(n, batch, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    "n,batch,sizes", [(64, 16, [16] * 4), (70, 16, [16] * 4 + [6]), (65, 16, [16, 16, 16, 17]), (1, 16, [1])]
)
def test_epoch_batches_drop_nothing_and_fold_a_single_leftover(n, batch, sizes):
    import torch

    batches = epoch_batches(n, batch, torch.Generator().manual_seed(0))

    assert [len(b) for b in batches] == sizes
    assert sorted(torch.cat(batches).tolist()) == list(range(n))


def _spec(make_task_ref, make_assignment, initial_weights, store, **shard) -> TrainerSpec:
    import torch

    task = make_task_ref(1, "shufflenet_v2_x1_0")
    assignment = make_assignment(task, initial_weights(task), assignment_id=5, **shard)
    return TrainerSpec(
        **assignment.model_dump(), artifact_root=str(store.root), threads=torch.get_num_threads(), warmup_iterations=1
    )


def test_train_waits_for_go_and_reports_the_shard(make_task_ref, make_assignment, initial_weights, store):
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=33, batch_size=16)
    out = io.StringIO()

    before = time.time()
    result = train(spec, out, io.StringIO("GO\n"))

    assert out.getvalue() == "READY\n"
    assert result.status == "succeeded"
    assert (result.samples_trained, result.iterations, result.timed_iterations) == (33, 2, 1)
    assert before < result.started_at < result.finished_at
    assert result.weights_sha256 == store.sha256(spec.output_weights)


def test_train_on_empty_shard_keeps_global_weights(make_task_ref, make_assignment, initial_weights, store):
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=0)

    result = train(spec, io.StringIO(), io.StringIO("GO\n"))

    assert result.status == "succeeded"
    assert result.samples_trained == 0 and result.throughput_sps is None
    assert store.sha256(spec.output_weights) == store.sha256(spec.global_weights)


def test_train_aborts_without_go(make_task_ref, make_assignment, initial_weights, store):
    from workers.training.trainer import BarrierAborted

    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=16)

    with pytest.raises(BarrierAborted):
        train(spec, io.StringIO(), io.StringIO(""))


def test_bad_spec_exits_2_with_a_failed_result(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"assignment_id": 1}))
    result = tmp_path / "result.json"

    proc = subprocess.run(
        [sys.executable, "-m", "workers.training.trainer", "train", str(spec), str(result)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert proc.returncode == EXIT_BAD_SPEC
    assert proc.stdout == ""
    payload = json.loads(result.read_text())
    assert payload["status"] == "failed" and "bad spec" in payload["error"]


def test_a_spec_naming_an_unknown_model_is_a_bad_spec(make_task_ref, make_assignment, initial_weights, store, tmp_path):
    """The trainer checks its spec's registry names (the agent did too; a spec written by hand or an
    older agent may not have been): exit 2 naming the field, not a training error later."""
    good = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=8).model_dump(mode="json")
    good["task"]["architecture"] = "no-such-model"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(good))
    result = tmp_path / "result.json"

    proc = subprocess.run(
        [sys.executable, "-m", "workers.training.trainer", "train", str(spec), str(result)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == EXIT_BAD_SPEC, proc.stderr
    error = json.loads(result.read_text())["error"]
    assert "bad spec" in error and "architecture" in error and "no-such-model" in error


_LOCK_SCRIPT = """
import sys, time
from workers.training.trainer import IterationLock
lock, start = IterationLock(sys.argv[1]), float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
for _ in range(6):
    with lock:
        print(time.time(), flush=True)
        busy = time.perf_counter()
        while time.perf_counter() - busy < 0.01:
            pass
"""


def test_iteration_lock_makes_trainers_take_turns(tmp_path):
    start = time.time() + 8.0  # both must be waiting on the lock by then, even on a loaded machine
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOCK_SCRIPT, str(tmp_path / "device.lock"), str(start)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    stamps = [[float(line) for line in proc.communicate(timeout=60)[0].split()] for proc in procs]

    turns = sorted((t, who) for who, times in enumerate(stamps) for t in times)
    owners = [who for _, who in turns]
    switches = sum(1 for a, b in itertools.pairwise(owners) if a != b)
    assert switches >= 8  # alternating gives 11; a bare flock typically gives 1


# ----------------------------------------------------------------------------- FedProx


def _tiny_linear():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
        model[0].bias.copy_(torch.tensor([0.0, 0.5]))
    model[1].bias.requires_grad_(False)  # frozen: not a trainable parameter, not in the term
    return model


def test_proximal_term_is_half_mu_times_the_squared_distance_to_the_start():
    import torch

    from workers.fl.fedprox import ProximalTerm

    model = _tiny_linear()
    term = ProximalTerm(model, mu=0.5)
    with torch.no_grad():
        model[0].weight += torch.tensor([[0.5, -1.0], [0.0, 0.0]])
        model[0].bias += torch.tensor([0.0, 0.5])
        model[1].weight += torch.tensor([1.0, 0.0])
        model[1].bias += 100.0  # frozen: ignored
        model[1].running_mean += 100.0  # a buffer: ignored

    value = term()
    value.backward()

    # ||w − w0||² = 0.5² + 1² + 0.5² + 1² = 2.5; μ/2 · 2.5 = 0.625
    assert float(value.detach()) == pytest.approx(0.625, abs=1e-7)
    # its gradient is μ (w − w0)
    assert model[0].weight.grad.tolist() == [[0.25, -0.5], [0.0, 0.0]]
    assert model[0].bias.grad.tolist() == [0.0, 0.25]
    assert model[1].weight.grad.tolist() == [0.5, 0.0]


def test_a_step_with_the_proximal_term_steps_along_both_gradients():
    import torch
    import torch.nn.functional as F

    from workers.fl.fedprox import ProximalTerm
    from workers.protocol.messages import ExecutionOptions
    from workers.training.execution import StepRunner

    model = _tiny_linear()
    term = ProximalTerm(model, mu=2.0)
    with torch.no_grad():
        model[0].weight += 0.25  # away from w0, so the term has a gradient
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    reference = _tiny_linear()
    reference.load_state_dict(model.state_dict())
    reference_loss = F.cross_entropy(reference(x), y)
    reference_loss.backward()
    before = model[0].weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)

    runner = StepRunner(model, optimizer, torch.device("cpu"), ExecutionOptions(), client_term=term)
    runner.step(x, y)
    total, samples = runner.take_loss()
    loss = total / samples

    # w1 = w − lr (∇CE + μ (w − w0)), with w − w0 = 0.25 everywhere in the first weight
    expected = before - 0.1 * (reference[0].weight.grad + 2.0 * 0.25)
    assert torch.allclose(model[0].weight, expected, atol=1e-7)
    assert loss == pytest.approx(float(reference_loss.detach()), abs=1e-6)  # the term is not reported


def _trainable_distance(spec, store) -> float:
    """||w − w_global|| over the trainable parameters of the trained model."""
    import torch

    from workers.fl.fedavg import load_state
    from workers.training.zoo import build_model

    names = {name for name, _ in build_model(spec.task.architecture, 10, 0, spec.task.input_shape).named_parameters()}
    trained, start = load_state(store.path(spec.output_weights)), load_state(store.path(spec.global_weights))
    return math.sqrt(sum(float(torch.sum(torch.from_numpy(trained[k] - start[k]) ** 2)) for k in names))


def test_fedprox_keeps_the_trained_weights_closer_to_the_global_model(
    make_task_ref, make_assignment, initial_weights, store
):
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=96, batch_size=16)

    distances = {}
    for mu in (0.0, 10.0):
        result = train(
            spec.model_copy(update={"aggregator": "fedprox", "client_options": {"mu": mu}}),
            io.StringIO(),
            io.StringIO("GO\n"),
        )
        assert result.status == "succeeded" and result.samples_trained == 96
        distances[mu] = _trainable_distance(spec, store)

    assert 0 < distances[10.0] < 0.9 * distances[0.0]


def test_proximal_mu_zero_trains_exactly_as_plain_sgd_steps(make_task_ref, make_assignment, initial_weights, store):
    import torch

    from workers.fl.artifacts import load_model_weights
    from workers.fl.fedavg import load_state
    from workers.training.trainer import (
        _load_shard,
        assignment_optimizer,
        build_optimizer,
        recalibrate_batchnorm,
    )
    from workers.training.zoo import build_model

    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=48, batch_size=16)
    assert spec.aggregator is None and spec.client_options == {}

    train(spec, io.StringIO(), io.StringIO("GO\n"))
    trained = load_state(store.path(spec.output_weights))

    # The same round by hand: the plain cross-entropy step, no proximal term anywhere.
    x, y = _load_shard(spec.task, spec.shard)
    model = build_model(spec.task.architecture, spec.task.num_classes, spec.seed, spec.task.input_shape)
    load_model_weights(model, store.path(spec.global_weights))
    optimizer = build_optimizer(model, assignment_optimizer(spec))
    torch.manual_seed(spec.seed)
    model.train()
    for idx in epoch_batches(len(y), spec.batch_size, torch.Generator().manual_seed(spec.seed)):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    recalibrate_batchnorm(model, x, spec.batch_size)

    by_hand = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert set(by_hand) == set(trained)
    assert all((by_hand[k] == trained[k]).all() for k in trained)


DECAY_PLUGIN = """
import torch

from workers.fl.fedavg import FedAvgAccumulator
from workers.registry.aggregators import Aggregator
from workers.registry.base import Parameter

CALLS = []


class Decay:
    \"\"\"A client-side term of its own: weight decay, grad += lam * w.\"\"\"

    def __init__(self, model, lam):
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.lam = lam

    def add_gradient(self):
        CALLS.append(self.lam)
        with torch.no_grad():
            for p in self.parameters:
                if p.grad is not None:
                    p.grad.add_(p, alpha=self.lam)


def decay_term(model, options):
    return Decay(model, float(options["lam"])) if options["lam"] else None


decay_avg = Aggregator(
    "decay_avg",
    "FedAvg with weight decay in every trainer",
    lambda ctx: FedAvgAccumulator(),
    parameters=(Parameter("lam", "weight decay", "float", 0.0, 10.0, default=0.1),),
    trainer_options=lambda params: {"lam": float(params["lam"])},
    client_term=decay_term,
)
"""


def test_a_plugin_aggregators_client_term_is_applied_by_the_trainer(
    tmp_path, make_task_ref, make_assignment, initial_weights, store
):
    from tests.plugin_dist import installed_distribution
    from workers.fl.fedavg import load_state
    from workers.registry.aggregators import AGGREGATOR_REGISTRY

    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=48, batch_size=16)
    train(spec, io.StringIO(), io.StringIO("GO\n"))
    plain = load_state(store.path(spec.output_weights))
    with installed_distribution(
        tmp_path,
        "mtfl-decay",
        "0.1",
        {"mtfl_decay": DECAY_PLUGIN},
        "[mtfl.aggregators]\ndecay_avg = mtfl_decay:decay_avg\n",
        registries=(AGGREGATOR_REGISTRY,),
    ):
        record = AGGREGATOR_REGISTRY.get("decay_avg")
        fields = record.assignment_options(record.check_params({"lam": 0.5}))
        assert fields == {"aggregator": "decay_avg", "client_options": {"lam": 0.5}}
        # what the control plane sends passes the wire (and the trainer's spec file) as it is
        sent = TrainerSpec.model_validate_json(TrainerSpec(**{**spec.model_dump(), **fields}).model_dump_json())
        assert (sent.aggregator, sent.client_options) == ("decay_avg", {"lam": 0.5})

        result = train(sent, io.StringIO(), io.StringIO("GO\n"))
        calls = sys.modules["mtfl_decay"].CALLS

    assert result.status == "succeeded", result.error
    # once per training step, with the option the record declared
    assert calls == [0.5] * result.iterations
    decayed = load_state(store.path(spec.output_weights))
    assert any(not (decayed[k] == plain[k]).all() for k in plain)


def test_an_old_message_with_proximal_mu_is_read_as_fedprox(make_task_ref, make_assignment, initial_weights, store):
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=48, batch_size=16)
    old = {k: v for k, v in spec.model_dump().items() if k not in ("aggregator", "client_options")}

    fedprox = TrainerSpec.model_validate({**old, "proximal_mu": 0.25})
    plain = TrainerSpec.model_validate({**old, "proximal_mu": 0.0})

    assert (fedprox.aggregator, fedprox.client_options) == ("fedprox", {"mu": 0.25})
    assert (plain.aggregator, plain.client_options) == (None, {})
    for bad in (-0.1, 1000.5, "0.1", True):  # the old field's bounds still hold
        with pytest.raises(ValidationError, match="proximal_mu must be a number from 0 to 1000"):
            TrainerSpec.model_validate({**old, "proximal_mu": bad})


def test_an_older_plugins_trainer_options_still_ask_for_fedproxs_term(
    make_task_ref, make_assignment, initial_weights, store
):
    """A plug-in written before client terms: its trainer_options gave AssignmentSpec fields."""
    from workers.fl.fedavg import FedAvgAccumulator
    from workers.registry.aggregators import Aggregator

    old = Aggregator("old_prox", "old", lambda ctx: FedAvgAccumulator(), trainer_options=lambda p: {"proximal_mu": 0.5})
    fields = old.assignment_options({})
    spec = _spec(make_task_ref, make_assignment, initial_weights, store, offset=0, count=48, batch_size=16)

    sent = TrainerSpec(**{**spec.model_dump(exclude={"aggregator", "client_options"}), **fields})

    assert fields == {"proximal_mu": 0.5}
    assert (sent.aggregator, sent.client_options) == ("fedprox", {"mu": 0.5})


def test_the_proximal_gradient_is_the_gradient_of_the_term():
    import torch

    from workers.fl.fedprox import ProximalTerm

    model = _tiny_linear()
    term = ProximalTerm(model, mu=3.0)
    with torch.no_grad():
        for p in model.parameters():
            p += torch.linspace(-1.0, 1.0, p.numel()).reshape(p.shape)
    term().backward()
    by_autograd = [p.grad.clone() for p in term.parameters]
    model.zero_grad(set_to_none=True)

    term.add_gradient()

    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(term.parameters, by_autograd, strict=True))


def test_a_warm_trainer_hands_cached_gpu_memory_back_between_jobs(monkeypatch):
    import sys
    import types

    from workers.training import trainer as trainer_module

    emptied: list[bool] = []

    def fake_torch(initialized: bool) -> types.SimpleNamespace:
        cuda = types.SimpleNamespace(is_initialized=lambda: initialized, empty_cache=lambda: emptied.append(True))
        return types.SimpleNamespace(cuda=cuda)

    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    trainer_module._release_cached_device_memory()
    assert emptied == []  # cpu, or CUDA never used: nothing to hand back
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True))
    trainer_module._release_cached_device_memory()
    assert emptied == [True]
