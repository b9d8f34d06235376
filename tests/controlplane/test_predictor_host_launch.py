"""The predictor's host launch term (issue 31 item 3): each slot's ``log_host_launch_s`` is
``log(ops_per_step × host seconds per operation)``, the host time per operation measured on the
device class (median of ``host_step_s / ops_per_step``) or the H200's default; a predictor
fitted before the term keeps its design matrix. No Django, no torch."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import pytest

import controlplane.planning.predictor.fit as fit_module
from controlplane.planning.predictor import (
    DEFAULT_HOST_S_PER_OP,
    LEGACY_SLOT_FEATURES,
    MIX_FEATURES,
    SLOT_FEATURES,
    MixTask,
    ProfiledTask,
    encode_mixes,
    fit_family,
    host_seconds_per_op,
)
from tests.controlplane.contention_law import ARCHS, WORKLOADS, synthetic

OPS = {"resnet18": 435, "mobilenet_v3_small": 900, "shufflenet_v2_x1_0": 1187, "mobilenet_v3_large": 1218}
COUNTED = {a: replace(w, ops_per_step=OPS[a]) for a, w in WORKLOADS.items()}


def _with_host_time(samples: list[ProfiledTask], s_per_op: float) -> list[ProfiledTask]:
    return [replace(s, host_step_s=OPS[s.mix[s.task_index].architecture] * s_per_op) for s in samples]


@pytest.fixture(scope="module")
def fitted():
    return fit_family(_with_host_time(synthetic(200), 25e-6), COUNTED, cores=100, family="extra_trees")


def test_host_seconds_per_op_is_the_median_over_samples_with_a_host_time():
    mix = (MixTask("resnet18", 32, 100),)
    samples = [
        ProfiledTask("a", mix, 0, 3200.0, host_step_s=435 * 18e-6),
        ProfiledTask("b", mix, 0, 3200.0, host_step_s=435 * 20e-6),
        ProfiledTask("c", mix, 0, 3200.0, host_step_s=435 * 40e-6),
        ProfiledTask("d", mix, 0, 3200.0),  # not measured: left out
    ]

    assert host_seconds_per_op(samples, COUNTED) == pytest.approx(20e-6)
    assert host_seconds_per_op(samples[3:], COUNTED) == DEFAULT_HOST_S_PER_OP == 20e-6
    assert host_seconds_per_op(samples, WORKLOADS) == DEFAULT_HOST_S_PER_OP  # operations never counted


def test_the_host_launch_term_is_a_column_of_every_slot(fitted):
    space = fitted.space
    mixes = [(MixTask("resnet18", 64, 50), MixTask("mobilenet_v3_large", 32, 80))]

    X, order, _ = space.features(encode_mixes(mixes, space.architectures, width=2))

    assert space.host_s_per_op == pytest.approx(25e-6)
    assert SLOT_FEATURES[-1] == "log_host_launch_s" and space.slot_features == SLOT_FEATURES
    assert space.spec()["slot_features"] == list(SLOT_FEATURES)
    assert space.spec()["host_s_per_op"] == pytest.approx(25e-6)
    width = len(SLOT_FEATURES)
    assert X.shape == (1, space.slots * width + len(MIX_FEATURES))
    launch = [X[0, s * width + width - 1] for s in range(2)]
    expected = [math.log(OPS[mixes[0][int(i)].architecture] * 25e-6) for i in order[0]]
    assert launch == pytest.approx(expected)
    assert X[0, 2 * width + width - 1] == 0.0  # an empty slot


def test_without_host_times_the_term_uses_the_default_per_operation():
    predictor = fit_family(synthetic(120), COUNTED, cores=100, family="random_forest")

    assert predictor.space.host_s_per_op == DEFAULT_HOST_S_PER_OP


def test_a_model_whose_operations_were_not_counted_gets_0_in_the_column(fitted):
    space = replace(fitted.space, workloads={**COUNTED, "resnet18": WORKLOADS["resnet18"]})

    X, _, _ = space.features(encode_mixes([(MixTask("resnet18", 64, 50),)], space.architectures, width=1))

    assert X[0, len(SLOT_FEATURES) - 1] == 0.0


def test_a_predictor_fitted_before_the_term_loads_and_predicts_from_its_old_columns(monkeypatch):
    monkeypatch.setattr(fit_module, "host_seconds_per_op", lambda samples, workloads: None)
    fitted = fit_family(synthetic(150), WORKLOADS, cores=100, family="extra_trees")
    old = pickle.loads(pickle.dumps(fitted))
    del old.space.__dict__["host_s_per_op"]  # a pickle from before issue 31 has no such field
    old = pickle.loads(pickle.dumps(old))
    mixes = [tuple(MixTask(ARCHS[(i + j) % 4], 32 * (1 + j), 25 + 5 * j) for j in range(1 + i % 3)) for i in range(40)]

    X, _, _ = old.space.features(encode_mixes(mixes, old.space.architectures, width=old.space.slots))

    assert old.space.slot_features == LEGACY_SLOT_FEATURES and old.space.spec()["host_s_per_op"] is None
    assert "log_host_launch_s" not in old.space.spec()["slot_features"]
    assert X.shape[1] == old.space.slots * len(LEGACY_SLOT_FEATURES) + len(MIX_FEATURES)
    assert old.predict(mixes) == fitted.predict(mixes)  # the same model, the same answers
