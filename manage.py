#!/usr/bin/env python
"""Django's command-line utility; the same as the ``mtfl`` console script."""

from controlplane.cli import main

if __name__ == "__main__":
    main()
