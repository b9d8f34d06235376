"""The round protocol, one module per step, imported in one direction only:

- :mod:`.requests` builds a device's part of a round (one builder, for the first dispatch and
  for every retry);
- :mod:`.deadlines` says how long a round waits for its devices;
- :mod:`.start` plans a round, saves its assignments and dispatches it;
- :mod:`.record` records the devices' results (and their progress) and closes the round;
- :mod:`.aggregate` turns each task's device models into the next global model through the
  aggregator registry (:data:`workers.registry.aggregators.AGGREGATOR_REGISTRY`);
- :mod:`.advance` starts the next round or ends the run.

:mod:`controlplane.experiments.services.reliability` (watchdog, retries, stragglers, resume)
is built on these and none of them imports it. This package's ``__init__`` imports none of its
modules, so importing one step never loads the others; the public names are re-exported by
:mod:`controlplane.experiments.services`.
"""
