"""Finding the monitored value (``monitor="acc"``) in evaluation results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._errors import ConfigurationError


def result_key_parts(key: str) -> list[str]:
    """``"acc#acc#dev"`` -> ``["acc", "acc", "dev"]`` (result name, metric name, dataloader name)."""
    return key.split("#")


def find_monitor_value(results: Mapping[str, float], monitor: str | Callable[[Mapping[str, float]], float]) -> float:
    """Return the value ``monitor`` names: an exact key, else the one key whose result or metric name matches."""
    if callable(monitor):
        return float(monitor(results))
    if monitor in results:
        return float(results[monitor])
    matches = [k for k in results if monitor in result_key_parts(k)[:2]]
    if len(matches) == 1:
        return float(results[matches[0]])
    if len(matches) > 1:
        # The result name wins over the metric name when both appear.
        by_result = [k for k in matches if result_key_parts(k)[0] == monitor]
        if len(by_result) >= 1:
            return float(results[sorted(by_result)[0]])
    raise ConfigurationError(
        f"monitor={monitor!r} matches no evaluation result; results are {sorted(results)}. "
        "Pass one of these keys, a result/metric name, or a function(results) -> float."
    )


def validate_monitor(monitor: Any, metrics: Mapping[str, Any] | None) -> None:
    """Check at construction that ``monitor`` can name something the metrics will produce."""
    if monitor is None or callable(monitor):
        return
    if not isinstance(monitor, str):
        raise ConfigurationError(f"monitor={monitor!r} must be a result name (str), a function(results) -> float, or None.")
    if not metrics:
        raise ConfigurationError(
            f"monitor={monitor!r} was given but there are no metrics to monitor; pass metrics= and evaluate_dataloaders=."
        )
    names: set[str] = set()
    for metric_name, metric in metrics.items():
        names.add(metric_name)
        result_names = getattr(metric, "result_names", None)
        if result_names is None:
            return  # a metric whose result names are only known at run time: checked at the first evaluation
        names.update(result_names)
    first = monitor.split("#")[0]
    if first not in names and monitor not in names:
        raise ConfigurationError(
            f"monitor={monitor!r} names no metric; the metrics produce {sorted(names)}. "
            "Use one of them (e.g. monitor='acc') or a function(results) -> float."
        )
