"""BatchNorm statistics are re-estimated over the shard after local training."""

from __future__ import annotations

import torch

from workers.training.trainer import recalibrate_batchnorm


def test_running_stats_become_the_shard_statistics():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    model[1].running_mean.fill_(100.0)  # stale statistics, as after a few noisy iterations
    model[1].running_var.fill_(100.0)
    x = torch.randn(37, 3, 8, 8) * 2 + 1
    recalibrate_batchnorm(model, x, batch_size=10)
    with torch.no_grad():
        batch_means = [model[0](x[a : a + 10]).mean(dim=(0, 2, 3)) for a in range(0, 37, 10)]
    expected_mean = torch.stack(batch_means).mean(dim=0)  # cumulative average over the batches
    torch.testing.assert_close(model[1].running_mean, expected_mean, rtol=1e-4, atol=1e-4)
    assert model[1].momentum == 0.1  # restored after the cumulative pass
    assert model.training


def test_models_without_batchnorm_and_single_samples_are_left_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    recalibrate_batchnorm(model, torch.randn(5, 4), batch_size=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    bn = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    recalibrate_batchnorm(bn, torch.randn(1, 3), batch_size=8)  # one sample: nothing to estimate
    assert torch.equal(bn[0].running_mean, torch.zeros(3))


def test_trailing_single_sample_batch_is_merged():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.BatchNorm1d(2)
    )
    recalibrate_batchnorm(model, torch.randn(11, 3, 4, 4), batch_size=5)  # 5 + 6, not 5 + 5 + 1
    assert torch.isfinite(model[3].running_var).all()
