"""The torch side of mtfl-lab: everything that runs on a device host, in subpackages by role.

- :mod:`workers.config` — locations and settings from the environment (the lowest module: every
  package reads it);
- :mod:`workers.protocol` — the wire protocol shared with the control plane (messages, queues);
- :mod:`workers.fl` — FL arithmetic (FedAvg) and the artifacts it reads and writes;
- :mod:`workers.registry` — models, datasets, partitioners, aggregators and backends by name,
  with entry-point plug-ins;
- :mod:`workers.training` — the model zoo, data sets, partitioning, the trainer (and the profiler
  process it also runs), workload features, evaluation and the plug-in check;
- :mod:`workers.backends` — execution backends (``cpu``, ``simulated``, ``cuda-mps``,
  ``cuda-timeslice``);
- :mod:`workers.launch` — the one spawn → barrier → watch → collect engine (with
  :mod:`workers.forkserver`);
- :mod:`workers.profiling` — sweeps, standalone measurements, host probes;
- :mod:`workers.agent` — the device agent's Celery app and CLI.

This package never imports Django or :mod:`controlplane`: a GPU host needs only the base
dependencies (``pip install 'mtfl-lab[agent]'``) and a broker URL. Importing :mod:`workers`,
:mod:`workers.protocol.messages` or the registries does not import torch; modules that need torch
import it inside their functions so the web process and Celery parent processes stay light.
"""

__version__ = "0.1.0"
