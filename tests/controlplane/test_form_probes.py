"""How often a refused dashboard form asks its service (:meth:`ApiCheckedForm.submit`).

A form shows every error at once by asking the service again past a refused argument, inside a
transaction that is rolled back. Each ask may run the whole service (task creation checks the
plug-in and its data in a child process), so a refused form asks at most once more, an expensive
service never to probe, and nothing a probe did survives: no rows, no work queued on commit.
"""

from __future__ import annotations

import functools

import pytest
from rest_framework import serializers

from controlplane.common.errors import ApplicationError
from controlplane.dashboard import forms, views
from controlplane.dashboard.forms import ApiCheckedForm
from controlplane.experiments.models import Comparison, Run, Task
from controlplane.experiments.services import comparison_create, task_create

pytestmark = pytest.mark.django_db


class _ThreeSerializer(serializers.Serializer):
    a = serializers.IntegerField(required=False)
    b = serializers.IntegerField(required=False)
    c = serializers.IntegerField(required=False)


class _ThreeForm(ApiCheckedForm):
    serializer_class = _ThreeSerializer
    a = forms._input(forms._number(), "A")
    b = forms._input(forms._number(), "B")
    c = forms._input(forms._number(), "C")


def _refusing_service(calls: list[dict]):
    """A service that refuses, one call at a time, every argument not at its default."""

    def service(*, a: int = 0, b: int = 0, c: int = 0) -> str:
        calls.append({"a": a, "b": b, "c": c})
        for name, value in (("a", a), ("b", b), ("c", c)):
            if value:
                raise ApplicationError(f"{name} must be 0", field=name)
        return "accepted"

    return service


def test_a_refused_form_asks_its_service_at_most_once_more():
    calls: list[dict] = []
    form = _ThreeForm({"a": "1", "b": "2", "c": "3"})

    assert form.submit(_refusing_service(calls)) is None

    assert len(calls) == 1 + ApiCheckedForm.max_probes == 2
    assert calls[1] == {"a": 0, "b": 2, "c": 3}  # the probe: past the first refusal
    assert set(form.errors) == {"a", "b"} and form.status_code == 400


def test_an_expensive_service_is_asked_once_and_not_at_all_while_the_serializer_refuses(browser_client, monkeypatch):
    calls: list[dict] = []

    @functools.wraps(task_create)
    def counted_task_create(**kwargs):
        calls.append(kwargs)
        return task_create(**kwargs)

    monkeypatch.setattr(views, "task_create", counted_task_create)
    base = {"name": "t", "architecture": "resnet18", "dataset": "digits", "optimizer": "sgd"}

    # The serializer refuses num_classes: asking task_create could only probe, in a child process.
    refused = browser_client.post("/tasks/new/", {**base, "num_classes": "1", "learning_rate": "0"})
    assert refused.status_code == 400 and calls == []

    # The service refuses learning_rate: it is not asked again past it.
    refused = browser_client.post("/tasks/new/", {**base, "learning_rate": "0", "dataset": "cifar10"})
    assert refused.status_code == 400 and len(calls) == 1
    assert not Task.objects.exists()


def test_a_refused_compare_form_queues_nothing_and_creates_no_rows(
    browser_client, make_experiment, monkeypatch, django_capture_on_commit_callbacks
):
    """The target is refused, the strategies are valid: the service is asked (a probe, which
    creates the comparison and queues its first run) and all of it is rolled back."""
    accepted: list[Comparison] = []

    @functools.wraps(comparison_create)  # the form reads the service's defaults to probe past a refusal
    def counted_comparison_create(**kwargs):
        accepted.append(comparison_create(**kwargs))
        return accepted[-1]

    monkeypatch.setattr(views, "comparison_create", counted_comparison_create)
    experiment = make_experiment()
    task = experiment.tasks.order_by("id").first()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = browser_client.post(
            f"/experiments/{experiment.id}/compare/",
            {"chosen": "1", "strategies": ["temporal", "sharing"], "repeats": "1", f"target-{task.id}": "1.5"},
        )

    assert response.status_code == 400 and 'id="field-target-' in response.content.decode()
    # The target was refused, the probe past it accepted: its comparison and queued run are gone.
    assert len(accepted) == 1
    assert callbacks == []
    assert not Comparison.objects.exists() and not Run.objects.exists()
