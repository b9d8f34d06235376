"""The ``mtfl`` console script: ``manage.py`` with the project's settings.

``mtfl demo``, ``mtfl up``, ``mtfl agent`` and every Django command (``mtfl migrate``,
``mtfl createsuperuser``, ...) are available.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Run a management command, like ``manage.py``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    from workers.lifecycle import exit_with_parent

    exit_with_parent()  # the web server child of `mtfl up` stops with it

    argv = list(sys.argv if argv is None else argv)
    argv[0] = "mtfl"
    execute_from_command_line(argv)


if __name__ == "__main__":
    main()
