"""The round protocol, one module per step, imported in one direction only. A round goes
through six steps, each a function named after it (and each Celery task after the step it calls):

1. enqueue — :func:`.enqueue.round_enqueue` (task ``ROUND_ENQUEUE``): the round is created
   ``queued`` and a lab scheduling pass runs, which leases its devices;
2. dispatch — :func:`.dispatch.round_dispatch` (called by the scheduling pass once the devices
   are leased): plan, save the assignments, measure ``P_alone`` if needed, send the training;
3. settle — :func:`.settle.round_settle` (task ``ROUND_SETTLE``, the chord's callback, and the
   round watchdog): decide each device's outcome (answered, lost, retried, straggler);
4. record — :func:`.record.round_record`: the devices' results become assignment rows and the
   round's metrics (per device and per round, :mod:`controlplane.planning.metrics`);
5. aggregate — :func:`.aggregate.round_aggregate`: each task's device models become the next
   global model through the aggregator registry
   (:data:`workers.registry.aggregators.AGGREGATOR_REGISTRY`);
6. advance — :func:`.advance.round_advance`: enqueue the next round or end the run.

Beside them: :mod:`.requests` builds a device's part of a round (one builder, for the first
dispatch and for every retry), :mod:`.deadlines` says how long a round waits for its devices,
:mod:`.alone` asks the devices for ``P_alone``.

:mod:`controlplane.experiments.services.reliability` (the watchdog, resume, liveness)
is built on these and none of them imports it. This package's ``__init__`` imports none of its
modules, so importing one step never loads the others; the public names are re-exported by
:mod:`controlplane.experiments.services`.
"""
