"""How the learning rate follows the batch size: one rule per experiment, applied the same way to
every strategy's assignments.

The planners change batch sizes (``vres_greedy`` sizes them to the data, ``vres_sync`` gives
early devices smaller batches), while the baselines train at :data:`REFERENCE_BATCH_SIZE`. With a
fixed learning rate, a planned run then takes more or fewer, larger or smaller optimizer steps
than the baseline's, and its accuracy per round differs for that reason alone. An experiment
therefore chooses a rule (``Experiment.lr_scaling``) and the learning rate sent for an
assignment of batch size ``B`` is

    ``lr(B) = task.learning_rate × f(B / REFERENCE_BATCH_SIZE)``

with ``f`` one of:

* ``none``: ``f(x) = 1`` (the task's learning rate at every batch size; the default);
* ``linear``: ``f(x) = x``, the linear scaling rule of Goyal et al. 2017, "Accurate, Large
  Minibatch SGD: Training ImageNet in 1 Hour" (arXiv:1706.02677), §2.1;
* ``sqrt``: ``f(x) = √x``, the square-root rule of Krizhevsky 2014, "One weird trick for
  parallelizing convolutional neural networks" (arXiv:1404.5997), argued from the variance of the
  gradient estimate by Hoffer et al. 2017, "Train longer, generalize better" (NeurIPS).

Pure Python: no Django, no torch.
"""

from __future__ import annotations

import math

REFERENCE_BATCH_SIZE = 128
"""The batch size at which a task's ``learning_rate`` applies unchanged: the paper's baselines
train at 128 (Yu et al. 2022, §5), so a baseline run's learning rate is the task's under every
rule."""

LR_SCALING_RULES = ("none", "linear", "sqrt")
"""The rules an experiment may choose (module docstring)."""

DEFAULT_LR_SCALING = "none"


def lr_scaling_check(rule: object, *, field: str = "lr_scaling") -> str:
    """``rule`` if it is one of :data:`LR_SCALING_RULES`.

    Raises:
        ValueError: another value; the message names ``field`` and the allowed rules.
    """
    if not isinstance(rule, str) or rule not in LR_SCALING_RULES:
        raise ValueError(f"{field}: {rule!r} is not allowed; allowed: {', '.join(LR_SCALING_RULES)}")
    return rule


def lr_factor(batch_size: int, rule: str) -> float:
    """``f(batch_size / REFERENCE_BATCH_SIZE)`` of the rule (module docstring), dimensionless.

    Raises:
        ValueError: ``batch_size`` not positive, or an unknown rule.
    """
    lr_scaling_check(rule)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    ratio = batch_size / REFERENCE_BATCH_SIZE
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    return 1.0


def scaled_learning_rate(learning_rate: float, batch_size: int, rule: str) -> float:
    """The learning rate of an assignment: ``learning_rate × f(batch_size / 128)``.

    Args:
        learning_rate: the task's learning rate (at the reference batch size).
        batch_size: the assignment's batch size, ``>= 1``.
        rule: one of :data:`LR_SCALING_RULES`.

    Raises:
        ValueError: as :func:`lr_factor`.
    """
    return learning_rate * lr_factor(batch_size, rule)
