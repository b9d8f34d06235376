"""Workload features: FLOPs against published counts, parameters, saved activations."""

from __future__ import annotations

import pytest

from workers.profiling.features import workload_features
from workers.registry.models import MODEL_REGISTRY

ARCHITECTURES = MODEL_REGISTRY.names()

IMAGENET = (3, 224, 224)


@pytest.mark.parametrize("architecture,gmacs", [("resnet18", 1.82), ("vgg16", 15.5)])
def test_forward_flops_match_published_gmacs_at_imagenet_size(architecture, gmacs):
    features = workload_features(architecture, num_classes=1000, input_shape=IMAGENET)

    measured = features.forward_flops_per_sample / 2 / 1e9
    assert measured == pytest.approx(gmacs, rel=0.05)


@pytest.mark.parametrize("architecture,params", [("resnet18", 11_689_512), ("vgg16", 138_357_544)])
def test_parameter_count_matches_torchvision_at_imagenet_size(architecture, params):
    features = workload_features(architecture, num_classes=1000, input_shape=IMAGENET)

    assert features.params == params and features.param_bytes == 4 * params


@pytest.mark.parametrize("architecture", ["resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0"])
def test_training_costs_about_three_forwards(architecture):
    # mobilenet and shufflenet have depthwise convolutions, whose backward torch's own
    # formula overcounts by the channel count.
    features = workload_features(architecture)

    ratio = features.train_flops_per_sample / features.forward_flops_per_sample
    assert 2.5 <= ratio <= 3.5


def test_activation_bytes_grow_with_input_size():
    small = workload_features("resnet18", input_shape=(3, 32, 32))
    large = workload_features("resnet18", input_shape=(3, 64, 64))

    assert large.activation_bytes_per_sample > 3 * small.activation_bytes_per_sample
    assert large.params == small.params


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_architecture_has_positive_features_at_cifar_size(architecture):
    features = workload_features(architecture)

    assert features.architecture == architecture and features.input_shape == (3, 32, 32)
    assert features.forward_flops_per_sample > 0
    assert features.train_flops_per_sample > features.forward_flops_per_sample
    assert features.params > 0 and features.param_bytes > 0
    assert features.activation_bytes_per_sample > 0


def test_features_are_cached():
    assert workload_features("resnet18") is workload_features("resnet18", 10, [3, 32, 32])


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"architecture": "alexnet"}, "architecture"),
        ({"architecture": "resnet18", "num_classes": 1}, "num_classes"),
        ({"architecture": "resnet18", "input_shape": (1, 32, 32)}, "input_shape"),
        ({"architecture": "resnet18", "input_shape": (3, 16, 16)}, r"\[32, 1024\]"),
        ({"architecture": "resnet18", "input_shape": (3, 32)}, "input_shape"),
    ],
)
def test_bad_input_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        workload_features(**kwargs)
