"""The torch side of mtfl-lab: everything that runs on a device host.

Model zoo, data sets and partitioning, the trainer process, execution backends, FedAvg on
state dicts, the artifact store, the device agent's Celery tasks and the message schemas shared
with the control plane.

This package never imports Django or :mod:`controlplane`: a GPU host needs only this package's
dependencies and a broker URL. Importing :mod:`workers` (or :mod:`workers.messages`,
:mod:`workers.queues`, :mod:`workers.partition`) does not import torch; modules that need torch
import it inside their functions so the web process and Celery parent processes stay light.
"""

__version__ = "0.1.0"
