"""Profiling at a task's own input shape: each architecture of a sweep is built and fed at its
``ProfileSweepRequest.workloads`` shape, and a profiler process trains a model on random inputs
of that shape (a plug-in MLP on feature vectors here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from workers.backends import CpuBackend
from workers.backends.base import TrainerResources
from workers.profiling.sweep import _write_specs
from workers.protocol.messages import ProfileSweepRequest, ProfileTaskSpec, WorkloadShape
from workers.training.profiler import ITER_PREFIX, STOP_LINE, ProfileChildResult, ProfileChildSpec

REPO = Path(__file__).resolve().parents[2]


def _request(**overrides) -> ProfileSweepRequest:
    fields = dict(sweep_id=1, device="dev-a", budget_s=5, architectures=["resnet18", "vgg16"], num_classes=7)
    fields.update(overrides)
    return ProfileSweepRequest(**fields)


def test_an_architecture_without_a_workload_is_profiled_at_the_request_classes_and_cifar_size():
    request = _request(workloads={"vgg16": WorkloadShape(num_classes=3, input_shape=(3, 64, 64))})

    assert request.workload_shape("resnet18") == WorkloadShape(num_classes=7, input_shape=(3, 32, 32))
    assert request.workload_shape("vgg16") == WorkloadShape(num_classes=3, input_shape=(3, 64, 64))


def test_each_profiler_spec_carries_its_architectures_shape(tmp_path):
    request = _request(workloads={"vgg16": WorkloadShape(num_classes=3, input_shape=(3, 64, 48))})
    tasks = [
        ProfileTaskSpec(architecture="resnet18", batch_size=8, active_thread_percentage=50),
        ProfileTaskSpec(architecture="vgg16", batch_size=4, active_thread_percentage=50),
    ]
    resources = [TrainerResources(threads=1, cores=None), TrainerResources(threads=1, cores=None)]

    processes = _write_specs(tasks, resources, request, tmp_path, CpuBackend())

    specs = [ProfileChildSpec.model_validate_json(Path(p.args[0]).read_text()) for p in processes]
    assert [(s.architecture, s.num_classes, s.input_shape) for s in specs] == [
        ("resnet18", 7, (3, 32, 32)),
        ("vgg16", 3, (3, 64, 48)),
    ]


# A profiler process in which a plug-in model is registered before the child's main runs, as an
# installed entry point would be; its forward refuses any input but (batch, 20).
_PLUGIN_CHILD = textwrap.dedent(
    """
    import sys

    import torch

    from workers.registry.models import MODEL_REGISTRY, Model


    class TabularMLP(torch.nn.Module):
        def __init__(self, num_classes, input_shape):
            super().__init__()
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(input_shape[0], 32), torch.nn.ReLU(), torch.nn.Linear(32, num_classes)
            )

        def forward(self, x):
            if tuple(x.shape[1:]) != (20,):
                raise ValueError(f"expected (batch, 20) features, got {tuple(x.shape)}")
            return self.layers(x)


    MODEL_REGISTRY.register(Model("test_child_mlp", "test_child_mlp", TabularMLP))

    from workers.training.profiler import main

    sys.exit(main(sys.argv[1:]))
    """
)


def test_a_profiler_process_trains_a_tabular_model_on_inputs_of_its_shape(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_PLUGIN_CHILD)
    spec = ProfileChildSpec(
        architecture="resnet18", batch_size=16, num_classes=3, input_shape=(20,), threads=1, warmup_iterations=1
    ).model_copy(update={"architecture": "test_child_mlp"})
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(spec.model_dump_json())

    proc = subprocess.Popen(
        [sys.executable, str(script), str(spec_path), str(result_path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read() if proc.stderr else ""
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        timed = [proc.stdout.readline().split() for _ in range(3)]
        proc.stdin.write(STOP_LINE + "\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()

    assert all(line[0] == ITER_PREFIX and int(line[3]) == 16 * int(line[4]) for line in timed)
    result = ProfileChildResult.model_validate(json.loads(result_path.read_text()))
    assert result.status == "succeeded" and result.iterations >= 4
