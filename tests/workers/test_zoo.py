from __future__ import annotations

import pytest

from workers.registry.models import MODEL_REGISTRY
from workers.training.zoo import build_model

ARCHITECTURES = MODEL_REGISTRY.names()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_architecture_maps_32x32_batch_to_logits(architecture):
    import torch

    model = build_model(architecture, 7, seed=0).eval()

    with torch.no_grad():
        logits = model(torch.randn(2, 3, 32, 32))

    assert logits.shape == (2, 7)


def test_same_seed_gives_same_weights_and_leaves_global_rng_alone():
    import torch

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("mobilenet_v3_small", 10, seed=5)
    b = build_model("mobilenet_v3_small", 10, seed=5)
    c = build_model("mobilenet_v3_small", 10, seed=6)

    assert torch.rand(1) == before
    w = "classifier.3.weight"
    assert torch.equal(a.state_dict()[w], b.state_dict()[w])
    assert not torch.equal(a.state_dict()[w], c.state_dict()[w])


def test_unknown_architecture_lists_allowed_ones():
    with pytest.raises(ValueError, match="resnet18"):
        build_model("alexnet", 10, 0)


def test_num_classes_below_two_is_rejected():
    with pytest.raises(ValueError, match="num_classes"):
        build_model("resnet18", 1, 0)
