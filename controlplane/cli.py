"""The ``mtfl`` console script: ``manage.py`` with the project's settings.

``mtfl demo``, ``mtfl up``, ``mtfl agent``, ``mtfl create-experiment``, ``mtfl profile``,
``mtfl fit-predictor``, ``mtfl plugins`` (what this host and each online device have installed)
and every Django command (``mtfl migrate``, ``mtfl createsuperuser``, ...)
are available. A command may be spelled with hyphens or underscores (``create-experiment`` runs
the ``create_experiment`` command module).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Run a management command, like ``manage.py``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    try:
        import django  # noqa: F401 - deferred: only to tell an agent-only install from a broken one
    except ImportError:
        # `pip install mtfl-lab[agent]` has no Django: say what to run instead of a traceback
        print(
            "mtfl: the control plane is not installed (this is an agent-only install); "
            "run the device agent with `mtfl-agent`, or install the control plane with "
            "pip install 'mtfl-lab[controlplane]'",
            file=sys.stderr,
        )
        sys.exit(2)
    # deferred: Django, once it is known to be installed (an agent-only install has none)
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from workers.agent.lifecycle import exit_with_parent  # deferred: as Django, after the check above

    exit_with_parent()  # the web server child of `mtfl up` stops with it

    try:
        settings.INSTALLED_APPS  # noqa: B018 - loads the settings: a refused start is one line, not a traceback
    except ImproperlyConfigured as exc:
        print(f"mtfl: {exc}", file=sys.stderr)
        sys.exit(2)

    argv = list(sys.argv if argv is None else argv)
    argv[0] = "mtfl"
    execute_from_command_line(command_argv(argv))


def command_argv(argv: list[str]) -> list[str]:
    """``argv`` with the command name (and the one after ``help``) spelled with underscores, as
    Django's command modules are named: ``mtfl fit-predictor`` runs ``fit_predictor``."""
    argv = list(argv)
    position = 2 if len(argv) > 2 and argv[1] == "help" else 1
    if len(argv) > position and not argv[position].startswith("-"):
        argv[position] = argv[position].replace("-", "_")
    return argv


if __name__ == "__main__":
    main()
