"""Every worked example of docs/extending.md runs against the current code: each is executed as
its own module, its record registered in the registry it names, used as the project uses it, and
unregistered again."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
EXAMPLE = re.compile(r"<!-- example: (\w+) -->\n```python\n(.*?)```", re.DOTALL)


def _examples() -> dict[str, str]:
    return dict(EXAMPLE.findall(DOC.read_text()))


def _module(kind: str) -> types.ModuleType:
    module = types.ModuleType(f"mtfl_docs_example_{kind}")
    exec(compile(_examples()[kind], f"{DOC}:{kind}", "exec"), module.__dict__)  # noqa: S102 - our own docs
    return module


@pytest.fixture
def register():
    """Register records for one test and take them out again, whatever happens."""
    added = []

    def add(registry, record):
        registry.register(record)
        added.append((registry, record.name))
        return record

    yield add
    for registry, name in added:
        registry.unregister(name)


def test_the_page_has_one_example_per_kind():
    assert sorted(_examples()) == ["aggregator", "backend", "dataset", "model", "partitioner", "strategy"]


def test_the_strategy_example_plans_through_make_plan(register):
    from controlplane.planning.strategies import STRATEGY_REGISTRY, make_plan
    from controlplane.planning.types import PlanningInput

    register(STRATEGY_REGISTRY, _module("strategy").HALF)
    spec = PlanningInput(device_ids=(1, 2), task_ids=(10, 11), samples={(1, 10): 100, (1, 11): 30, (2, 10): 80})

    plan = make_plan("half", spec)

    assert plan.partitioning == "mps"
    assert [(a.device_id, a.task_id, a.batch_size, a.active_thread_percentage) for a in plan.assignments] == [
        (1, 10, 64, 50),
        (1, 11, 30, 50),
        (2, 10, 64, 50),
    ]


def test_the_model_example_builds_through_build_model_and_has_workload_features(register):
    import torch

    from workers.registry.models import MODEL_REGISTRY, model_from_entry_point
    from workers.training.features import workload_features
    from workers.training.zoo import build_model

    record = register(
        MODEL_REGISTRY, model_from_entry_point("tiny_cnn", _module("model").build_tiny_cnn, "mtfl-tiny 1")
    )

    model = build_model("tiny_cnn", 10, seed=0, input_shape=(1, 28, 28))
    logits = model(torch.zeros(2, 1, 28, 28))

    assert tuple(logits.shape) == (2, 10)
    assert record.label == "tiny_cnn — One convolution and a linear head, for quick experiments."
    assert workload_features("tiny_cnn", 10, (3, 32, 32)).train_flops_per_sample > 0
    with pytest.raises(ValueError, match=r"input_shape: tiny_cnn takes images"):
        build_model("tiny_cnn", 10, seed=0, input_shape=(20,))


def test_the_dataset_example_loads_through_load_split(register):
    from workers.protocol.messages import DatasetRef
    from workers.registry.datasets import DATASET_REGISTRY, dataset_from_entry_point
    from workers.training.datasets import load_split

    record = register(
        DATASET_REGISTRY, dataset_from_entry_point("noise", _module("dataset").load_noise, "mtfl-noise 1")
    )

    x, y = load_split(DatasetRef(name="noise"), "train", np.array([0, 5, 999]))
    again, _ = load_split(DatasetRef(name="noise"), "train", np.array([5]))
    test_x, _ = load_split(DatasetRef(name="noise"), "test")

    assert (record.input_shape, record.num_classes, record.needs_root) == ((64,), 10, False)
    assert tuple(x.shape) == (3, 64) and str(x.dtype) == "torch.float32"
    assert tuple(y.shape) == (3,) and str(y.dtype) == "torch.int64" and int(y.min()) >= 0 and int(y.max()) < 10
    assert bool((again[0] == x[1]).all())
    assert tuple(test_x.shape) == (200, 64)


def test_the_partitioner_example_splits_through_partition_indices(register):
    from workers.registry.partitioners import PARTITIONER_REGISTRY, partitioner_from_entry_point
    from workers.training.partition import partition_indices

    module = _module("partitioner")
    register(PARTITIONER_REGISTRY, partitioner_from_entry_point("by_label", module.by_label, "mtfl-by-label 1"))
    labels = np.repeat(np.arange(6), 10)  # 6 classes of 10 samples

    shards = partition_indices(labels, 3, "by_label", {"fraction": 0.5}, seed=0)
    again = partition_indices(labels, 3, "by_label", {"fraction": 0.5}, seed=0)

    assert [sorted(set(labels[s].tolist())) for s in shards] == [[0, 3], [1, 4], [2, 5]]
    assert [len(s) for s in shards] == [10, 10, 10]
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    with pytest.raises(ValueError, match=r"partition_params\.fraction must be a number in \(0, 1\]"):
        partition_indices(labels, 3, "by_label", {"fraction": 0.0}, seed=0)


def test_the_aggregator_example_averages_devices_alike(register):
    from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext

    register(AGGREGATOR_REGISTRY, _module("aggregator").UNIFORM)
    aggregation = AGGREGATOR_REGISTRY.get("uniform").start(AggregationContext(previous=dict, options={}))

    aggregation.add({"w": np.array([1.0, 3.0], dtype=np.float32), "n": np.array(3, dtype=np.int64)}, 10)
    aggregation.add({"w": np.array([3.0, 5.0], dtype=np.float32), "n": np.array(4, dtype=np.int64)}, 1000)
    aggregation.add({"w": np.array([9.0, 9.0], dtype=np.float32), "n": np.array(9, dtype=np.int64)}, 0)
    result = aggregation.result()

    assert result["w"].tolist() == [2.0, 4.0] and result["w"].dtype == np.float32
    assert int(result["n"]) == 4 and result["n"].dtype == np.int64


def test_the_stateful_aggregator_example_steps_and_carries_its_state(register):
    from workers.registry.aggregators import AGGREGATOR_REGISTRY, AggregationContext

    register(AGGREGATOR_REGISTRY, _module("aggregator").FEDSIGN)
    record = AGGREGATOR_REGISTRY.get("fedsign")
    params = record.check_params({"server_learning_rate": 0.125, "beta": 0.5})
    w0 = {"w": np.array([1.0, 2.0], dtype=np.float32), "n": np.array(3, dtype=np.int64)}

    first = record.start(AggregationContext(previous=lambda: w0, options=params))
    first.add({"w": np.array([1.5, 1.0], dtype=np.float32), "n": np.array(5, dtype=np.int64)}, 3)
    first.add({"w": np.array([0.5, 3.0], dtype=np.float32), "n": np.array(9, dtype=np.int64)}, 1)
    w1, state1 = first.result(), first.server_state()
    # Δ = [1.25, 1.5] − [1, 2] = [0.25, −0.5]; m = 0.5 Δ; W = W + 0.125 sign(m)
    assert w1["w"].tolist() == [1.125, 1.875] and w1["w"].dtype == np.float32
    assert int(w1["n"]) == 6 and w1["n"].dtype == np.int64  # (15 + 9)/4, as FedAvg
    assert state1["m/w"].tolist() == [0.125, -0.25] and set(state1) == {"m/w"}

    second = record.start(AggregationContext(previous=lambda: w1, options=params, state=lambda: state1))
    second.add({"w": np.array([1.125, 1.75], dtype=np.float32), "n": np.array(6, dtype=np.int64)}, 2)
    w2 = second.result()
    # Δ = [0, −0.125]; m = [0.0625, −0.1875]: the momentum keeps the first tensor moving
    assert w2["w"].tolist() == [1.25, 1.75]
    assert second.server_state()["m/w"].tolist() == [0.0625, -0.1875]
    with pytest.raises(ValueError, match=r"aggregation_params\.beta must be a number in \[0, 0\.999\]"):
        record.check_params({"beta": 1})


def test_the_client_term_example_reaches_the_trainer_through_the_registry(register):
    import torch

    from workers.registry.aggregators import AGGREGATOR_REGISTRY, build_client_term

    register(AGGREGATOR_REGISTRY, _module("aggregator").DECAY)
    record = AGGREGATOR_REGISTRY.get("fedavg_decay")
    fields = record.assignment_options(record.check_params({"weight_decay": 0.5}))
    assert fields == {"aggregator": "fedavg_decay", "client_options": {"weight_decay": 0.5}}

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.fill_(4.0)
    model(torch.ones(1, 2)).sum().backward()  # ∂/∂w = [1, 1], ∂/∂b = 1
    term = build_client_term(fields["aggregator"], fields["client_options"], model)
    term.add_gradient()

    assert model.weight.grad.tolist() == [[1.5, 0.0]] and model.bias.grad.tolist() == [3.0]
    assert build_client_term("fedavg_decay", {"weight_decay": 0.0}, model) is None


def test_the_predictor_driven_strategy_example_declares_how_it_is_replanned(register):
    from controlplane.planning.strategies import STRATEGY_REGISTRY, make_plan
    from controlplane.planning.types import PlanningError, PlanningInput

    register(STRATEGY_REGISTRY, _module("strategy").HALF_PREDICTED)
    record = STRATEGY_REGISTRY.get("half_predicted")
    spec = PlanningInput(device_ids=(1,), task_ids=(10,), samples={(1, 10): 100})

    assert (record.needs_predictor, record.clock, record.slack) == (True, "throughput", False)
    with pytest.raises(PlanningError, match="needs a fitted throughput predictor"):
        make_plan("half_predicted", spec)


def test_the_backend_example_maps_shares_and_refuses_timeslice(register, tmp_path):
    from workers.backends.base import AgentContext
    from workers.registry.backends import BACKEND_REGISTRY, get_backend

    register(BACKEND_REGISTRY, _module("backend").UNPINNED)
    ctx = AgentContext(device="d", cores=[0, 1, 2, 3], state_dir=tmp_path, artifact_root=tmp_path)

    backend = get_backend("cpu-unpinned")
    backend.check_available()
    resources = backend.resources_for_shares([50, 100], "mps", ctx)

    assert [(r.threads, r.cores) for r in resources] == [(2, [0, 1, 2, 3]), (4, [0, 1, 2, 3])]
    assert BACKEND_REGISTRY.get("cpu-unpinned").partitionings == ("mps",)
    with pytest.raises(ValueError, match="partitioning: 'timeslice' is not allowed"):
        backend.resources_for_shares([50], "timeslice", ctx)
