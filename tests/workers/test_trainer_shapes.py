"""Trainers on chosen positions (``ShardRef.indices``) and at a task's own input shape: a digits
round on a label-skewed shard, and a plug-in MLP on ``.npz`` feature vectors trained and
evaluated in-process."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from workers.fl.artifacts import device_weights_key, global_weights_key
from workers.protocol.indices import encode_indices
from workers.protocol.messages import AssignmentSpec, DatasetRef, OptimizerConfig, ShardRef, TaskRef
from workers.registry.models import MODEL_REGISTRY, Model
from workers.training.datasets import load_splits
from workers.training.evaluate import evaluate
from workers.training.partition import label_histogram, partition_indices
from workers.training.trainer import TrainerSpec, _load_shard, train
from workers.training.zoo import write_initial_weights

DIGITS = DatasetRef(name="digits")


def _spec(task: TaskRef, shard: ShardRef, store, *, batch_size: int = 16, epochs: int = 1) -> TrainerSpec:
    key = global_weights_key(1, task.task_id, None)
    write_initial_weights(task.architecture, task.num_classes, task.task_id, store.path(key), task.input_shape)
    assignment = AssignmentSpec(
        assignment_id=5,
        task=task,
        batch_size=batch_size,
        active_thread_percentage=100,
        shard=shard,
        local_epochs=epochs,
        global_weights=key,
        output_weights=device_weights_key(1, 0, "dev-a", task.task_id),
        seed=3,
    )
    return TrainerSpec(
        **assignment.model_dump(), artifact_root=str(store.root), threads=torch.get_num_threads(), warmup_iterations=1
    )


def _digits_task(architecture: str = "shufflenet_v2_x1_0") -> TaskRef:
    return TaskRef(
        task_id=1,
        name="digits",
        architecture=architecture,
        num_classes=10,
        dataset=DIGITS,
        optimizer=OptimizerConfig(learning_rate=0.01),
    )


def _indexed(positions: np.ndarray) -> ShardRef:
    # offset and window seed are left at values whose window would hold other samples
    return ShardRef(permutation_seed=7, offset=0, count=len(positions), indices=encode_indices(positions))


def test_a_digits_round_trains_on_the_shards_chosen_positions(store):
    labels = np.asarray(load_splits(DIGITS).y_train)
    shards = partition_indices(labels, 5, "shards", {"shards_per_device": 1}, seed=0)
    positions = shards[2][:40]
    task = _digits_task()
    spec = _spec(task, _indexed(positions), store)

    x, y = _load_shard(task, spec.shard)
    result = train(spec, io.StringIO(), io.StringIO("GO\n"))

    assert y.tolist() == labels[positions].tolist()  # those samples, in that order
    assert np.count_nonzero(label_histogram(labels, positions, 10)) <= 3  # a label-skewed shard
    assert tuple(x.shape) == (40, 3, 32, 32)
    assert result.status == "succeeded" and result.samples_trained == 40 and result.iterations == 3
    assert result.weights_sha256 == store.sha256(spec.output_weights)


def test_without_indices_the_shard_is_the_window_of_the_permutation(store):
    from workers.training.partition import shard_indices

    labels = np.asarray(load_splits(DIGITS).y_train)
    shard = ShardRef(permutation_seed=7, offset=100, count=20)

    _, y = _load_shard(_digits_task(), shard)

    assert y.tolist() == labels[shard_indices(len(labels), 7, 100, 20)].tolist()


@pytest.mark.parametrize(
    "shard,message",
    [
        (
            ShardRef(permutation_seed=0, offset=0, count=3, indices=encode_indices(np.array([1, 2]))),
            "shard.indices hold 2 positions but shard.count is 3",
        ),
        (
            ShardRef(permutation_seed=0, offset=0, count=2, indices=encode_indices(np.array([5, 1437]))),
            r"shard.indices reach position 1437, past the 1437 samples .* allowed \[0, 1437\)",
        ),
        (ShardRef(permutation_seed=0, offset=0, count=2, indices="z1:@@"), "indices are corrupt"),
        (ShardRef(permutation_seed=0, offset=1430, count=10), "exceeds the training split's 1437 samples"),
    ],
)
def test_a_shard_that_does_not_fit_the_split_is_refused(shard, message):
    with pytest.raises(ValueError, match=message):
        _load_shard(_digits_task(), shard)


def test_a_task_with_fewer_classes_than_its_labels_is_refused():
    task = _digits_task().model_copy(update={"num_classes": 5})
    labels = np.asarray(load_splits(DIGITS).y_train)
    positions = np.flatnonzero(labels == 9)[:4]

    with pytest.raises(ValueError, match=r"task.num_classes=5 but the shard has label 9"):
        _load_shard(task, _indexed(positions))


# ----------------------------------------------------------------------- tabular plug-in


class _TabularMLP(torch.nn.Module):
    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        (features,) = input_shape
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(features, 32),
            torch.nn.BatchNorm1d(32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.fixture
def tabular(tmp_path):
    """A registered MLP and an ``.npz`` data set of 20 features whose label is the arg-max of
    the first 3 (learnable in a few epochs)."""
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((n, 20)).astype(np.float32)
        return x, x[:, :3].argmax(axis=1).astype(np.int64)

    x_train, y_train = split(600)
    x_test, y_test = split(300)
    path = tmp_path / "tabular.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    MODEL_REGISTRY.register(Model("test_trainer_mlp", "test_trainer_mlp", _TabularMLP))
    task = TaskRef(
        task_id=2,
        name="tabular",
        architecture="test_trainer_mlp",
        num_classes=3,
        dataset=DatasetRef(name="npz", root=str(path)),
        optimizer=OptimizerConfig(learning_rate=0.1),
        input_shape=(20,),
    )
    yield task, y_train
    MODEL_REGISTRY.unregister("test_trainer_mlp")


def test_a_tabular_plug_in_trains_and_evaluates_at_its_input_shape(tabular, store):
    task, y_train = tabular
    positions = partition_indices(y_train, 2, "dirichlet_labels", {"alpha": 100.0}, seed=1)[0]
    spec = _spec(task, _indexed(positions), store, batch_size=32, epochs=5)

    before, _ = evaluate(task, store.path(spec.global_weights))
    result = train(spec, io.StringIO(), io.StringIO("GO\n"))
    after, loss = evaluate(task, store.path(spec.output_weights))

    assert result.status == "succeeded" and result.samples_trained == 5 * len(positions)
    assert after > 0.8 and after > before + 0.2, (before, after)
    assert loss < 1.0


def test_a_task_whose_input_shape_is_not_its_datas_is_refused(tabular, store):
    task, _ = tabular
    wrong = task.model_copy(update={"input_shape": (3, 32, 32)})

    with pytest.raises(
        ValueError, match=r"task.input_shape=\(3, 32, 32\) but the npz data set's samples have shape \(20,\)"
    ):
        _load_shard(wrong, ShardRef(permutation_seed=0, offset=0, count=4))
