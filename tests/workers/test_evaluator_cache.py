"""The evaluator keeps its models and test tensors between calls (issue 30): what the control
worker evaluates every round reuses the model built for the task and the digits test split,
and gives exactly the numbers of an evaluation from scratch, whatever was loaded before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import workers.training.evaluate as evaluator
from workers.fl.fedavg import load_state, save_state
from workers.training.evaluate import evaluate, evaluator_cache_clear, evaluator_cache_info


@pytest.fixture(autouse=True)
def _cold_cache():
    evaluator_cache_clear()
    yield
    evaluator_cache_clear()


def _moved(path: Path, out: Path, seed: int) -> Path:
    """A copy of the weights at ``path`` with every floating tensor moved by seeded noise
    (BatchNorm's running statistics included), as after a round of training."""
    rng = np.random.default_rng(seed)
    state = load_state(path)
    moved = {}
    for key, value in state.items():
        if value.dtype.kind != "f":
            moved[key] = value
        elif key.endswith("running_var"):
            moved[key] = (value * rng.uniform(0.5, 2.0, value.shape)).astype(value.dtype)
        else:
            moved[key] = (value + rng.normal(0.0, 0.05, value.shape)).astype(value.dtype)
    save_state(moved, out)
    return out


def test_the_evaluator_reuses_its_model_and_test_data_and_gives_the_numbers_of_a_fresh_one(
    make_task_ref, initial_weights, store
):
    task = make_task_ref(1, "mobilenet_v3_small")
    first = store.path(initial_weights(task))
    second = _moved(first, first.with_name("round-00000.safetensors"), seed=1)
    third = _moved(first, first.with_name("round-00001.safetensors"), seed=2)
    fresh = {p: evaluate(task, p, cached=False) for p in (first, second, third)}
    assert len(set(fresh.values())) == 3  # three different models
    assert evaluator_cache_info().model_builds == 3 and evaluator_cache_info().model_reuses == 0

    evaluator_cache_clear()
    # a round after another, and back to the first weights: nothing of the previous model stays
    cached = [(p, evaluate(task, p)) for p in (first, second, third, first)]

    assert all(result == fresh[p] for p, result in cached)
    info = evaluator_cache_info()
    assert (info.model_builds, info.model_reuses) == (1, 3)
    assert (info.data_loads, info.data_reuses) == (1, 3)


def test_tasks_on_the_same_data_share_its_test_tensors_and_the_kept_models_are_bounded(
    make_task_ref, initial_weights, store, monkeypatch
):
    monkeypatch.setattr(evaluator, "MODEL_CACHE_SIZE", 1)
    mobilenet, shufflenet = make_task_ref(1, "mobilenet_v3_small"), make_task_ref(2, "shufflenet_v2_x1_0")
    weights = {t.task_id: store.path(initial_weights(t)) for t in (mobilenet, shufflenet)}

    for task in (mobilenet, shufflenet, mobilenet):
        assert evaluate(task, weights[task.task_id]) == evaluate(task, weights[task.task_id], cached=False)

    info = evaluator_cache_info()
    # one kept model: each architecture built again when the other took its place (plus the
    # uncached builds); one test split for both tasks
    assert (info.model_builds, info.model_reuses) == (6, 0)
    assert (info.data_loads, info.data_reuses) == (1 + 3, 2)
    assert len(evaluator._models) == 1


def test_weights_that_do_not_fit_are_refused_and_the_kept_model_is_not_used_again(
    make_task_ref, initial_weights, store
):
    mobilenet, shufflenet = make_task_ref(1, "mobilenet_v3_small"), make_task_ref(2, "shufflenet_v2_x1_0")
    good = store.path(initial_weights(mobilenet))
    expected = evaluate(mobilenet, good)

    with pytest.raises(RuntimeError):
        evaluate(mobilenet, store.path(initial_weights(shufflenet)))

    assert evaluate(mobilenet, good) == expected
    assert evaluator_cache_info().model_builds == 2  # the one a failed load may have touched went
