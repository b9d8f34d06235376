"""The repeatability diagnostic's configuration syntax and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmarks import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "profile_repeatability.py"


def test_a_configuration_is_parsed_into_task_specs():
    tasks = load_benchmark("profile_repeatability").parse_configuration("resnet18/32/50+mobilenet_v3_small/128/100")
    assert [(t.architecture, t.batch_size, t.active_thread_percentage) for t in tasks] == [
        ("resnet18", 32, 50),
        ("mobilenet_v3_small", 128, 100),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "resnet18/32"], "error: 'resnet18/32' is not model/batch_size/share, e.g. resnet18/32/50"),
        (["--config", "resnet18/x/50"], "error: 'resnet18/x/50': batch_size and share must be whole numbers"),
        (
            ["--config", "resnet18/32/500"],
            "error: 'resnet18/32/500': active_thread_percentage: Input should be less than or equal to 100",
        ),
        (["--after", "foo/32/50"], "error: 'foo/32/50': architecture: 'foo' is not allowed; allowed: resnet18, "),
        (["--repeats", "1"], "error: --repeats must be at least 2, got 1"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_before_anything_runs(args, message):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)
