"""`EvaluationConnector`: one run's evaluations at the step boundary and the best-metric judgement after each.

When to evaluate is the flow callbacks' decision (`control.should_evaluate`); this connector runs the facade's
overridable `_evaluate` and `_determine_best_metric` with the run's trial and ignored keys, and applies
`save_strategy="best"` (save only on a new best).
"""

from __future__ import annotations

from hf_lightning.core.enums import enum_value
from hf_lightning.core.protocols import RunLike, TrainerLike


class EvaluationConnector:
    """Evaluates during one run; judges each result against the best so far."""

    def __init__(self, facade: TrainerLike, run: RunLike):
        self._facade = facade
        self._run = run

    def evaluate(self) -> dict[str, float]:
        """Evaluate, record a new best metric, and under `save_strategy="best"` save only on a new best."""
        facade, run = self._facade, self._run
        metrics = facade._evaluate(run.trial, run.ignore_keys_for_eval)
        is_new_best_metric = facade._determine_best_metric(metrics=metrics, trial=run.trial)
        if enum_value(facade.args.save_strategy) == "best":
            facade.control.should_save = is_new_best_metric
        return metrics

    def evaluate_on_start(self) -> dict[str, float]:
        """`eval_on_start`: one evaluation before the first step, leaving the LR scheduler alone."""
        run = self._run
        return self._facade._evaluate(run.trial, run.ignore_keys_for_eval, skip_scheduler=True)
