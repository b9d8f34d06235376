"""A profiler process that crashes for ``mobilenet_v3_small`` and profiles anything else as
``workers.training.profiler`` does: run as ``python -m tests.workers.fakes.crashing_profiler
SPEC RESULT`` or forked by the fork server (``main``)."""

from __future__ import annotations

import sys

from workers.training import profiler as profiler_child

_real_profile = profiler_child.profile


def _profile(spec, protocol_out, commands, models=None):
    if spec.architecture == "mobilenet_v3_small":
        raise RuntimeError("injected crash")
    return _real_profile(spec, protocol_out, commands, models)


def main(argv=None) -> int:
    profiler_child.profile = _profile
    return profiler_child.main(argv)


if __name__ == "__main__":
    sys.exit(main())
