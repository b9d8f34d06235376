"""The lab service: many researchers' runs on one fleet.

- :mod:`.leases` — a round's devices are leased to it (one held :class:`DeviceLease` per
  device, claimed together by one conditional insert) and released when it ends;
- :mod:`.scheduler` — waiting (``queued``) rounds, and the scheduling pass that grants free
  devices to them by the lab's policy (:mod:`controlplane.planning.scheduling`) and dispatches
  them;
- :mod:`.admin` — an admin's pause and resume of a device, device pools.

:mod:`.leases` and :mod:`.admin` import nothing of the round protocol; :mod:`.scheduler` sits on
top of :mod:`..rounds.start` (it dispatches the rounds it grants). Code below the scheduler
(run ends, round ends) asks for a pass with :func:`..dispatch.send_lab_schedule`.
"""
