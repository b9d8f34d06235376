from __future__ import annotations

import pytest

from workers.training.evaluate import evaluate


def test_evaluate_returns_accuracy_and_loss(make_task_ref, initial_weights, store):
    task = make_task_ref(1, "shufflenet_v2_x1_0")
    key = initial_weights(task)

    accuracy, loss = evaluate(task, store.path(key), batch_size=128)

    assert 0.0 <= accuracy <= 1.0
    assert loss > 0


def test_evaluate_rejects_bad_batch_size(make_task_ref, store):
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(make_task_ref(1, "shufflenet_v2_x1_0"), store.path("x"), batch_size=0)


def test_evaluate_missing_weights_names_the_path(make_task_ref, store):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        evaluate(make_task_ref(1, "shufflenet_v2_x1_0"), store.path("nope.safetensors"))
