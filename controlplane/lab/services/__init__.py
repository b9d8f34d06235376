"""The lab's services: many researchers' runs on one fleet.

- :mod:`.leases` — a round's devices are leased to it (one held
  :class:`~controlplane.lab.models.DeviceLease` per device, claimed together by one conditional
  insert) and released when it ends;
- :mod:`.scheduler` — waiting (``queued``) rounds, and the scheduling pass that grants free
  devices to them by the lab's policy (:mod:`controlplane.planning.scheduling`) and dispatches
  them;
- :mod:`.admin` — an admin's pause and resume of a device, device pools.

:mod:`.leases` and :mod:`.admin` import nothing of the round protocol; :mod:`.scheduler` sits on
top of :mod:`controlplane.experiments.services.rounds.dispatch` (it dispatches the rounds it
grants). The experiments app, below the lab, never calls it: a round enqueued or a round's or
run's end is a signal (:mod:`controlplane.experiments.signals`) the lab's receivers answer, or a
``LAB_SCHEDULE`` message (:func:`controlplane.experiments.services.dispatch.send_lab_schedule`).
"""
