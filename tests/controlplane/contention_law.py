"""A known contention law for predictor and planner tests: synthetic profile samples whose
truth is a formula, so accuracy and plan quality can be checked exactly (no Django, no torch)."""

from __future__ import annotations

import math

import numpy as np

from controlplane.planning.predictor import LEGACY_MAX_MIX, MixTask, ModelWorkload, ProfiledTask

WORKLOADS = {
    "resnet18": ModelWorkload(1.1e8, 2.0e6, 11_200_000, 44_800_000),
    "mobilenet_v3_small": ModelWorkload(1.2e7, 8.0e5, 1_530_000, 6_100_000),
    "shufflenet_v2_x1_0": ModelWorkload(9.0e6, 6.0e5, 1_260_000, 5_000_000),
    "mobilenet_v3_large": ModelWorkload(4.0e7, 1.5e6, 4_210_000, 16_800_000),
}
ARCHS = sorted(WORKLOADS)


def alone(arch: str, batch: int) -> float:
    return 2e10 / WORKLOADS[arch].train_flops_per_sample * batch / (batch + 16)


def law(mix: tuple[MixTask, ...], j: int) -> float:
    """A sub-linear share effect and a super-linear slow-down past 100 % (what a baseline
    that scales linearly gets wrong)."""
    total = sum(t.share for t in mix)
    t = mix[j]
    return alone(t.architecture, t.batch_size) * min(1.0, t.share / 100) ** 0.6 / max(1.0, total / 100) ** 1.3


def synthetic(n: int, seed: int = 0, noise: float = 0.02, max_mix: int = LEGACY_MAX_MIX) -> list[ProfiledTask]:
    """``n`` configurations of 1 to ``max_mix`` tasks (4 by default: the tests written when the
    predictor encoded at most 4 keep the samples they were written for)."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        k = int(rng.integers(1, max_mix + 1))
        mix = tuple(
            MixTask(
                ARCHS[rng.integers(len(ARCHS))],
                int(rng.choice([16, 32, 64, 128, 256])),
                int(rng.choice(range(10, 101, 5))),
            )
            for _ in range(k)
        )
        for j, t in enumerate(mix):
            p = law(mix, j) * math.exp(rng.normal(0, noise))
            memory = int(3e8 + 4 * WORKLOADS[t.architecture].param_bytes + 1.5e6 * t.batch_size)
            samples.append(ProfiledTask(f"c{i}", mix, j, p, alone(t.architecture, t.batch_size), memory))
    return samples


def store_synthetic_samples(device, n: int = 120, backend: str = "cpu", device_class: str = "cpu-2cores") -> None:
    """Store ``n`` synthetic configurations' samples (and the models' workloads) as if a sweep
    on ``device`` (of ``backend`` and ``device_class``) had measured them."""
    from controlplane.profiling.models import ModelWorkload as ModelWorkloadRow
    from controlplane.profiling.models import ProfileSample

    for arch, w in WORKLOADS.items():
        ModelWorkloadRow.objects.get_or_create(
            architecture=arch,
            num_classes=10,
            defaults=dict(
                input_shape=[3, 32, 32],
                forward_flops_per_sample=w.train_flops_per_sample / 3,
                train_flops_per_sample=w.train_flops_per_sample,
                params=w.params,
                param_bytes=w.param_bytes,
                activation_bytes_per_sample=w.activation_bytes_per_sample,
            ),
        )
    ProfileSample.objects.bulk_create(
        ProfileSample(
            source="sweep",
            device=device,
            backend=backend,
            device_class=device_class,
            config_key=s.config_key,
            configuration=[
                {"architecture": t.architecture, "batch_size": t.batch_size, "active_thread_percentage": t.share}
                for t in s.mix
            ],
            mix_size=len(s.mix),
            task_index=s.task_index,
            architecture=s.mix[s.task_index].architecture,
            batch_size=s.mix[s.task_index].batch_size,
            active_thread_percentage=s.mix[s.task_index].share,
            throughput_sps=s.throughput_sps,
            standalone_sps=s.standalone_sps,
            peak_memory_bytes=s.peak_memory_bytes,
        )
        for s in synthetic(n)
    )
