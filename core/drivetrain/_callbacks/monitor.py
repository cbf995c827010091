"""Finding the monitored value (``monitor="acc"``) in evaluation results."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._common import ConfigurationError, did_you_mean, stands_for


def result_key_parts(key: str) -> list[str]:
    """``"acc#acc#dev"`` -> ``["acc", "acc", "dev"]`` (result name, metric name, dataloader name)."""
    return key.split("#")


def find_monitor_value(results: Mapping[str, float], monitor: str | Callable[[Mapping[str, float]], float]) -> float:
    """Return the value ``monitor`` names: an exact key, else the one key whose result or metric name matches.

    A name without its dataloader part (``"acc"``, ``"acc#acc"``) that matches results of
    several evaluate dataloaders takes the first dataloader in the order they were given
    (results keep that order): the rule docs/user-guide/evaluation-and-metrics.md states.
    """
    if callable(monitor):
        return float(monitor(results))
    if monitor in results:
        return float(results[monitor])
    wanted = result_key_parts(monitor)
    by_result = [k for k in results if result_key_parts(k)[:len(wanted)] == wanted]
    by_metric = [k for k in results if len(wanted) == 1 and result_key_parts(k)[1:2] == wanted]
    for matches in (by_result, by_metric):
        if matches:
            first_loader = _loader_of(matches[0])
            same_loader = [k for k in matches if _loader_of(k) == first_loader]
            if len(same_loader) == 1:
                return float(results[same_loader[0]])
            raise ConfigurationError(
                f"monitor={monitor!r} is ambiguous: it matches {same_loader}. Pass one of these keys; a full key "
                f"'result#metric#dataloader' such as {same_loader[0]!r} names the result, the metric and the "
                "dataloader. Or pass a function(results) -> float."
            )
    raise ConfigurationError(
        f"monitor={monitor!r} matches no evaluation result; results are {list(results)}."
        f"{_closest_key(monitor, list(results))} Pass one of these keys ('result#metric#dataloader'), a result or "
        "metric name (with several dataloaders, the first one given is used), or a function(results) -> float."
    )


def _loader_of(key: str) -> str:
    parts = result_key_parts(key)
    return parts[2] if len(parts) > 2 else ""


def validate_monitor(monitor: Any, metrics: Mapping[str, Any] | None,
                     dataloader_names: Sequence[str] | None = None) -> None:
    """Check at construction that ``monitor`` can name something the metrics will produce.

    ``dataloader_names``: the evaluation dataloaders' names (``[""]`` for a single unnamed one), which the
    third part of a full key (``"acc#acc#dev"``) must name; None when they are not known yet.
    """
    if monitor is None or callable(monitor):
        return
    if not isinstance(monitor, str):
        raise ConfigurationError(f"monitor={monitor!r} must be a result name (str), a function(results) -> float, or None.")
    if not metrics:
        raise ConfigurationError(
            f"monitor={monitor!r} was given but there are no metrics to monitor; pass metrics= and evaluate_dataloaders=."
        )
    wanted = result_key_parts(monitor)
    if dataloader_names is not None:
        _check_dataloader_part(monitor, wanted, dataloader_names)
    accepted: set[str] = set()
    for metric_name, metric in metrics.items():
        result_names = getattr(metric, "result_names", None)
        if result_names is None:
            return  # a metric whose result names are only known at run time: checked at the first evaluation
        accepted.update(result_names)
        accepted.update(f"{r}#{metric_name}" for r in result_names)
        if len(result_names) == 1:
            accepted.add(metric_name)  # the metric's name stands for its only result
    if "#".join(wanted[:2]) not in accepted:
        raise ConfigurationError(
            f"monitor={monitor!r} names no single metric result; it can be one of {sorted(accepted)} "
            "(optionally followed by '#<dataloader name>'), or a function(results) -> float."
            f"{_closest_key(monitor, _full_keys(metrics, dataloader_names))}"
        )


def _full_keys(metrics: Mapping[str, Any], dataloader_names: Sequence[str] | None) -> list[str]:
    """The result keys evaluation will produce (``"acc#acc#dev"``), as far as they are known before it runs."""
    loaders = [name for name in dataloader_names or () if name] or [""]
    return [f"{result}#{metric_name}" + (f"#{loader}" if loader else "")
            for loader in loaders for metric_name, metric in metrics.items()
            for result in getattr(metric, "result_names", None) or ()]


def _closest_key(monitor: str, keys: Sequence[str]) -> str:
    """" Did you mean 'acc#acc#dev'?": the full key closest to ``monitor``, also when ``monitor`` is another
    library's name for a result or metric (``"accuracy"`` for ``acc``); ``""`` when none is close."""
    close = did_you_mean(monitor, keys)
    if close:
        return close
    first = result_key_parts(monitor)[0]
    for key in keys:
        if stands_for(first, result_key_parts(key)[:2]):
            return f" Did you mean {key!r}?"
    return ""


def _check_dataloader_part(monitor: str, wanted: list[str], dataloader_names: Sequence[str]) -> None:
    """The third part of ``monitor`` names one of the evaluation dataloaders; nothing comes after it."""
    if len(wanted) < 3:
        return
    head = "#".join(wanted[:2])
    named = [name for name in dataloader_names if name]
    if not named:
        raise ConfigurationError(
            f"monitor={monitor!r} names the dataloader {wanted[2]!r}, but evaluate_dataloaders is a single "
            f"dataloader without a name, so result keys have no dataloader part: pass monitor={head!r}, or name "
            f"the dataloader: evaluate_dataloaders={{{wanted[2]!r}: dataloader}}."
        )
    if len(wanted) > 3 or wanted[2] not in named:
        loader = "#".join(wanted[2:])
        raise ConfigurationError(
            f"monitor={monitor!r} names the dataloader {loader!r}, which is not one of evaluate_dataloaders "
            f"{named}.{did_you_mean(loader, named)} A full key is 'result#metric#dataloader', e.g. "
            f"{head + '#' + named[0]!r}."
        )
