"""``python -m workers.agent``: start a device agent (see :func:`workers.agent.app.main`)."""

import sys

from workers.agent.app import main

sys.exit(main())
