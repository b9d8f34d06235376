"""The planner check a researcher reads before launching a ``vres_*`` run: what the planner's
guard would say (:func:`.planning.predictor_guard`, then the devices it finds host-bound,
:func:`controlplane.profiling.selectors.experiment_regime_warnings`), what the experiment does about it, and the
threshold in force. The API (``GET /api/experiments/{id}/planner-check/``) and the experiment
page show it; it writes nothing.
"""

from __future__ import annotations

from typing import Any

from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Experiment
from controlplane.experiments.services.planning import predictor_guard
from controlplane.profiling.selectors import experiment_regime_warnings


def planner_check(experiment: Experiment) -> dict[str, Any]:
    """The guard's verdict on ``experiment`` as a predictor-driven run would meet it now.

    A device without a fitted predictor is not an error here: its message (with the commands
    that make one) is answered as a warning and ``predictors_ready`` is false, since a
    ``vres_*`` run would be refused with that message (400) until then.

    Returns:
        ``{"untrusted_predictor": "plan"|"baseline"|"measure", "warnings": [sentence, ...],
        "max_rmsle": MTFL_PREDICTOR_MAX_RMSLE (float), "predictors_ready": bool}``; ``warnings``
        is empty when every device's predictor is trusted and no device is host-bound (that
        warning is advice: it does not make a run fall back to a baseline).
    """
    try:
        warnings, ready = predictor_guard(experiment), True
    except ApplicationError as exc:
        warnings, ready = [exc.message], False
    return {
        "untrusted_predictor": experiment.untrusted_predictor,
        "warnings": [*warnings, *experiment_regime_warnings(experiment)],
        "max_rmsle": float(mtfl_setting("PREDICTOR_MAX_RMSLE")),
        "predictors_ready": ready,
    }
