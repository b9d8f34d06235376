"""The GPU path's pieces that need no GPU to test: the trainer's shape warm-up (cuDNN autotuning
kept out of timed iterations), its GPU peak memory (reserved memory plus the CUDA context), and
the launch engine's hook before it kills children (``terminate_client`` under MPS)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from workers import launch
from workers.training import runtime, trainer


class _Counting(torch.nn.Module):
    """A small BatchNorm model that records the batch sizes it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 10)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(len(x))
        return self.head(self.bn(self.conv(x)).mean(dim=(2, 3)))


def test_warm_up_shapes_runs_each_batch_size_once_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = _Counting().train()
    x, y = torch.randn(37, 3, 8, 8), torch.randint(0, 10, (37,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sizes = [len(b) for b in trainer.epoch_batches(37, 16, torch.Generator().manual_seed(0))]

    warmed = trainer.warm_up_shapes(model, x, y, sizes)

    assert sizes == [16, 16, 5] and warmed == [5, 16] and model.seen == [5, 16]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights and BatchNorm statistics
    assert all(p.grad is None for p in model.parameters())


def test_warm_up_shapes_ignores_sizes_the_shard_cannot_fill():
    model = _Counting().train()

    assert trainer.warm_up_shapes(model, torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long), [0, 8, 4]) == [4]


def _fake_nvml(processes: list[tuple[int, int]], mps: list[tuple[int, int]] | None = None) -> types.ModuleType:
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def entries(pairs):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in pairs]

    module.NVMLError = NVMLError
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetHandleByUUID = lambda uuid: uuid
    module.nvmlDeviceGetComputeRunningProcesses = lambda handle: entries(processes)
    module.nvmlDeviceGetMPSComputeRunningProcesses = lambda handle: entries(mps or [])
    return module


@pytest.fixture
def on_gpu(monkeypatch):
    """The process as a trainer on a GPU named by UUID, with 3 GiB reserved (peak 5 GiB)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f2c0a1e-7b3d-4c2a-9e61-0123456789ab")
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 4 * 2**30)
    return torch.device("cuda", 0)


def test_gpu_peak_memory_is_peak_reserved_plus_the_context_nvml_attributes_to_the_process(on_gpu, monkeypatch):
    import os

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([(1, 10 * 2**30), (os.getpid(), 3 * 2**30 + 600 * 2**20)]))

    assert runtime.cuda_context_bytes(on_gpu) == 600 * 2**20
    assert runtime.peak_memory(on_gpu) == 5 * 2**30 + 600 * 2**20  # not max_memory_allocated's 4 GiB


def test_an_mps_client_is_found_among_nvmls_mps_processes(on_gpu, monkeypatch):
    import os

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([], mps=[(os.getpid(), 3 * 2**30 + 300 * 2**20)]))

    assert runtime.cuda_context_bytes(on_gpu) == 300 * 2**20


@pytest.mark.parametrize("visible", ["GPU-5f2c0a1e-7b3d-4c2a-9e61-0123456789ab", "0"])
def test_without_nvmls_answer_the_context_is_the_assumed_one(on_gpu, monkeypatch, visible):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([(1, 10 * 2**30)]))  # another pid (a PID namespace)

    assert runtime.cuda_context_bytes(on_gpu) == runtime.CUDA_CONTEXT_FALLBACK_BYTES
    assert runtime.peak_memory(on_gpu) == 5 * 2**30 + runtime.CUDA_CONTEXT_FALLBACK_BYTES


def _sleepers(tmp_path, count: int) -> list[launch.ProcessSpec]:
    return [
        launch.ProcessSpec(
            command=[sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))"],
            args=[seconds],
            env={},
            stderr_path=tmp_path / f"child-{k}.log",
            label=f"child {k}",
        )
        for k, seconds in enumerate(["0", "60"][:count])
    ]


def test_close_calls_before_kill_with_the_children_still_running_then_kills_them(tmp_path):
    seen: list[list[int]] = []
    with launch.ProcessGroup(_sleepers(tmp_path, 2), barrier=False, before_kill=seen.append) as group:
        group.launch()
        quick, slow = group.children
        quick.proc.wait()

    assert seen == [[slow.proc.pid]]
    assert slow.returncode == -9 and launch.live_children() == []


def test_a_failing_before_kill_hook_is_logged_and_the_children_are_killed_anyway(tmp_path, caplog):
    def hook(pids: list[int]) -> None:
        raise RuntimeError("daemon gone")

    with caplog.at_level(logging.WARNING, logger="workers.launch"):
        with launch.ProcessGroup(_sleepers(tmp_path, 2)[1:], barrier=False, before_kill=hook) as group:
            group.launch()

    assert group.children[0].returncode == -9
    assert "before_kill hook failed" in caplog.text


def test_no_hook_is_called_when_every_child_has_exited(tmp_path):
    seen: list[list[int]] = []
    with launch.ProcessGroup(_sleepers(tmp_path, 1), barrier=False, before_kill=seen.append) as group:
        group.launch()
        group.children[0].proc.wait()

    assert seen == []
