"""Each user-facing numeric field's allowed range, declared once.

The model validators, the API serializers (their ``minimum``/``maximum`` and help texts), the
dashboard forms (their inputs' ``min``/``max``), the CLI's help and the services' checks and
messages all read the bounds from here, so a range is changed in one place and every layer
agrees (``tests/controlplane/test_limits.py`` checks that they do, and that no bound of a field
declared here is written as a literal elsewhere).

Pure Python (no Django): :mod:`controlplane.planning` reads it too. The two bounds a message to
an agent also carries (batch size, MPS share) come from the wire schema, so both ends agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.protocol.messages import MAX_ACTIVE_THREAD_PERCENTAGE, MAX_BATCH_SIZE


def bound_text(x: float) -> str:
    """A bound as the messages write it: ``10000`` for ``10_000`` or ``10000.0``, ``0.5``."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Limit:
    """One field's allowed values: the numbers from ``low`` to ``high``, each end closed unless
    ``low_open``/``high_open``.

    Attributes:
        name: the field's name in the API and the models (``rounds``).
        low: the smallest allowed value (or the excluded lower end when ``low_open``); an ``int``
            for an integer field, a ``float`` otherwise.
        high: the largest allowed value (or the excluded upper end when ``high_open``).
        unit: what the number counts, for help texts (``"rounds"``, ``"%"``; may be empty).
        help: what the field means, in a few words (the CLI's and the forms' help start with it).
        low_open: ``low`` itself is not allowed.
        high_open: ``high`` itself is not allowed.
    """

    name: str
    low: int | float
    high: int | float
    unit: str = ""
    help: str = ""
    low_open: bool = False
    high_open: bool = False

    @property
    def span(self) -> str:
        """``"1 to 10000"``: the closed range as the help texts write it."""
        return f"{bound_text(self.low)} to {bound_text(self.high)}"

    @property
    def interval(self) -> str:
        """``"[1, 10000]"``, ``"(0, 1]"``: the range in interval notation, as the services' messages
        write it."""
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"{left}{bound_text(self.low)}, {bound_text(self.high)}{right}"

    def contains(self, value: float) -> bool:
        """``value`` (a finite number) lies in the range."""
        low_ok = value > self.low if self.low_open else value >= self.low
        high_ok = value < self.high if self.high_open else value <= self.high
        return low_ok and high_ok


# --- experiments --------------------------------------------------------------------------------
ROUNDS = Limit("rounds", 1, 10_000, "rounds", "FL rounds")
LOCAL_EPOCHS = Limit("local_epochs", 1, 1000, "epochs", "local epochs per round")
SEED = Limit("seed", 0, 2**31 - 1, "", "seed of the partition")
DIRICHLET_ALPHA = Limit(
    "dirichlet_alpha", 0.0, 1000.0, "", "Dirichlet concentration of the data volumes", low_open=True
)
DEVICE_RETRIES = Limit("device_retries", 0, 10, "retries", "re-sends of a device's part of a round")
DEADLINE_FACTOR = Limit("deadline_factor", 1.0, 100.0, "× the predicted round time", "a round's deadline")
CLIENT_FRACTION = Limit("client_fraction", 0.0, 1.0, "", "the fraction of the devices trained per round", low_open=True)
KEEP_LAST_CHECKPOINTS = Limit(
    "keep_last_checkpoints", 1, 10_000, "checkpoints", "global checkpoints kept per run and task"
)

# --- tasks --------------------------------------------------------------------------------------
NUM_CLASSES = Limit("num_classes", 2, 100_000, "classes", "the task's class count")
LEARNING_RATE = Limit("learning_rate", 0.0, 10.0, "", "the task's learning rate", low_open=True)
MOMENTUM = Limit("momentum", 0.0, 1.0, "", "SGD momentum", high_open=True)
WEIGHT_DECAY = Limit("weight_decay", 0.0, 1.0, "", "L2 weight decay")

# --- runs, comparisons, assignments -------------------------------------------------------------
PRIORITY = Limit("priority", -10, 10, "", "a run's priority in the lab's queue, higher first")
REPEATS = Limit("repeats", 1, 10, "repeats", "how many times every strategy of a comparison runs")
TARGET_ACCURACY = Limit(
    "target_accuracy", 0.0, 1.0, "", "test accuracy a task must reach for its time to accuracy", low_open=True
)
BATCH_SIZE = Limit(
    "batch_size",
    2,  # training-mode BatchNorm needs at least two samples per batch at the zoo's 1×1 activations
    MAX_BATCH_SIZE,
    "samples",
    "samples per training step",
)
ACTIVE_THREAD_PERCENTAGE = Limit(
    "active_thread_percentage",
    1,
    MAX_ACTIVE_THREAD_PERCENTAGE,
    "%",
    "a trainer's share of the device (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)",
)

# --- profiling ----------------------------------------------------------------------------------
SWEEP_BUDGET = Limit("budget_s", 5.0, 7 * 24 * 3600.0, "s", "seconds a profiling sweep measures")
"""A sweep's budget as lab staff and the operator's CLI may give it: a device being profiled gets
no round (the lab scheduler), so a week-long sweep is an admin's decision, like a pause."""
SWEEP_BUDGET_SELF_SERVE = Limit(
    "budget_s",
    SWEEP_BUDGET.low,
    30 * 60.0,
    "s",
    "seconds a profiling sweep measures when a researcher without staff rights starts it",
)
"""The same field for a researcher who is not lab staff (dashboard, API): long enough for the
README's session (a 300 s sweep) and a thorough profile, short enough that one researcher cannot
hold a shared device from everyone's rounds. Not in :data:`LIMITS`: it narrows ``budget_s`` by
role, :data:`SWEEP_BUDGET` is the field's range."""

# --- the lab ------------------------------------------------------------------------------------
SHARE_WEIGHT = Limit("weight", 0.01, 100.0, "", "a user's weight under the fair scheduling policy")

LIMITS: dict[str, Limit] = {
    limit.name: limit
    for limit in (
        ROUNDS,
        LOCAL_EPOCHS,
        SEED,
        DIRICHLET_ALPHA,
        DEVICE_RETRIES,
        DEADLINE_FACTOR,
        CLIENT_FRACTION,
        KEEP_LAST_CHECKPOINTS,
        NUM_CLASSES,
        LEARNING_RATE,
        MOMENTUM,
        WEIGHT_DECAY,
        PRIORITY,
        REPEATS,
        TARGET_ACCURACY,
        BATCH_SIZE,
        ACTIVE_THREAD_PERCENTAGE,
        SWEEP_BUDGET,
        SHARE_WEIGHT,
    )
}
"""Every declared limit by field name."""
