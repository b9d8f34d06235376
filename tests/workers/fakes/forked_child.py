"""A child for the fork server's tests: ``main([mode, *args])`` does one small thing.

Modes: ``echo`` (copy stdin lines to stdout, upper-cased, until end of file), ``exit N``,
``env NAME`` (print the variable), ``sleep S``, ``raise`` (an uncaught exception), ``stderr
TEXT`` (write TEXT to stderr), ``pid`` (print its pid and its parent's), ``sysexit TEXT``.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "echo":
        for line in sys.stdin:
            sys.stdout.write(line.upper())
            sys.stdout.flush()
        return 0
    if mode == "exit":
        return int(args[0])
    if mode == "env":
        print(os.environ.get(args[0], "<unset>"), flush=True)
        return 0
    if mode == "sleep":
        print("sleeping", flush=True)
        time.sleep(float(args[0]))
        return 0
    if mode == "raise":
        raise RuntimeError("injected failure in a forked child")
    if mode == "stderr":
        print(args[0], file=sys.stderr, flush=True)
        return 0
    if mode == "pid":
        print(os.getpid(), os.getppid(), flush=True)
        time.sleep(float(args[0]) if args else 0)
        return 0
    if mode == "sysexit":
        sys.exit(args[0])
    raise SystemExit(f"unknown mode {mode!r}")
