"""Hydra callback: build the report when a multirun ends. A failure is reported, never raised."""
from __future__ import annotations

import logging

from hydra.experimental.callback import Callback

log = logging.getLogger("rlvr")


class ReportCallback(Callback):
    """``on_multirun_end``: ``reports.build.build(experiment, tracking uri, baseline)`` when ``report.enabled``."""

    def on_multirun_end(self, config, **kwargs) -> None:
        rep = config.get("report", {}) or {}
        if not rep.get("enabled", True):
            return
        try:
            from .build import build

            from orchestrator import callbacks

            res = build(str(config.experiment_name), str(config.tracking.uri), rep.get("baseline"), rep.get("out_dir"),
                        parent_run_id=callbacks.PARENT_RUN_ID)
            callbacks.REPORT_HTML = res["html"]  # the summary callback logs it to the sweep's parent run
            log.info("report: %s", res["html"])
        except Exception as e:  # the sweep's results are already safe in MLflow
            log.error("the sweep finished but its report could not be built: %s: %s "
                      "(rebuild with: python -m reports --experiment %s)", type(e).__name__, e, config.experiment_name)
