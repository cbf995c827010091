"""The Evaluator: runs a model over one or more dataloaders and computes metrics.

Used standalone (``Evaluator(model, dataloaders, metrics, driver="torch").run()``)
or built by the Trainer around the Trainer's own driver. Framework tensors reach
metrics as numpy arrays, converted by the driver; metric state is aggregated
across processes through the driver's ``all_reduce``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ._driver import Driver
from ._errors import BatchMismatchError, ConfigurationError
from ._metrics import Metric
from ._options import (
    build_driver,
    check_int,
    check_optional_callable,
    resolve_precision,
    split_backend_kwargs,
)
from ._param_matching import as_dict, make_mapping_fn
from ._seed import capture_host_rng, restore_host_rng


def _normalise_dataloaders(dataloaders: Any, argument: str) -> dict[str, Any]:
    if dataloaders is None:
        raise ConfigurationError(f"{argument}=None: pass a dataloader or a dict {{name: dataloader}}.")
    if isinstance(dataloaders, Mapping):
        if not dataloaders:
            raise ConfigurationError(f"{argument}={{}} is empty; pass at least one dataloader.")
        for name in dataloaders:
            if not isinstance(name, str) or "#" in name:
                raise ConfigurationError(f"{argument} key {name!r} must be a str without '#'.")
        return dict(dataloaders)
    return {"": dataloaders}


def normalise_metrics(metrics: Any) -> dict[str, Metric]:
    if not isinstance(metrics, Mapping) or not metrics:
        raise ConfigurationError(
            f"metrics={metrics!r} is not accepted; pass a non-empty dict such as {{'acc': Accuracy()}}."
        )
    for name, metric in metrics.items():
        if not isinstance(name, str) or "#" in name:
            raise ConfigurationError(f"metrics key {name!r} must be a str without '#'.")
        if not isinstance(metric, Metric):
            raise ConfigurationError(
                f"metrics[{name!r}]={type(metric).__name__} is not a drivetrain Metric; subclass drivetrain.Metric "
                "(update / get_metric / reset) or use Accuracy / ClassifyFPreRecMetric."
            )
    return dict(metrics)


class _MetricFeeder:
    """Calls ``metric.update`` with the (numpy) values its parameters name, taken from batch + outputs."""

    def __init__(self, metric: Metric, metric_name: str, driver: Driver) -> None:
        params = inspect.signature(metric.update).parameters.values()
        self.metric = metric
        self.metric_name = metric_name
        self.names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.required = [p.name for p in params
                         if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty]
        self.driver = driver

    def __call__(self, data: Mapping[str, Any]) -> None:
        missing = [n for n in self.required if n not in data]
        if missing:
            raise BatchMismatchError(
                f"metrics[{self.metric_name!r}].update() needs {missing} but the batch and model outputs have "
                f"{sorted(data)}; return them from the evaluate function or rename with "
                "evaluate_output_mapping / evaluate_input_mapping."
            )
        to_numpy = self.driver.tensor_to_numpy
        is_tensor = self.driver.is_tensor
        kwargs = {}
        for name in self.names:
            if name in data:
                value = data[name]
                kwargs[name] = to_numpy(value) if is_tensor(value) else value
        self.metric.update(**kwargs)


class Evaluator:
    """Evaluate ``model`` on ``dataloaders`` with ``metrics``; :meth:`run` returns ``{"acc#acc#dev": 0.97}``.

    Result keys are ``result#metric#dataloader`` (the dataloader part is omitted
    for a single unnamed dataloader).
    """

    def __init__(
        self,
        model: Any,
        dataloaders: Any,
        metrics: Mapping[str, Metric],
        *,
        driver: str | Driver = "auto",
        device: Any = "cpu",
        evaluate_batch_step_fn: Callable[[Evaluator, Any], None] | None = None,
        evaluate_fn: str | None = None,
        input_mapping: Any = None,
        output_mapping: Any = None,
        model_wo_auto_param_call: bool = False,
        fp16: bool = False,
        precision: str | None = None,
        verbose: int = 1,
        use_dist_sampler: bool = True,
        **kwargs: Any,
    ) -> None:
        self.dataloaders = _normalise_dataloaders(dataloaders, "dataloaders")
        self.metrics = normalise_metrics(metrics)
        check_optional_callable(evaluate_batch_step_fn, "evaluate_batch_step_fn", "(evaluator, batch)")
        if evaluate_fn is not None and not isinstance(evaluate_fn, str):
            raise ConfigurationError(f"evaluate_fn={evaluate_fn!r} must be a method name (str) or None.")
        check_int(verbose, "verbose", minimum=0)
        backend_kwargs, unknown = split_backend_kwargs(kwargs)
        if unknown:
            raise ConfigurationError(
                f"Evaluator got unexpected argument(s) {sorted(unknown)}; framework options go in '<driver>_kwargs' "
                "(e.g. torch_kwargs={...})."
            )
        self.verbose = verbose
        self._input_fn = make_mapping_fn(input_mapping, "input_mapping")
        self._output_fn = make_mapping_fn(output_mapping, "output_mapping")
        if isinstance(driver, Driver):
            self.driver = driver
            self._owns_driver = False
        else:
            self.driver = build_driver(
                driver, model, device, precision=resolve_precision(fp16, precision),
                model_wo_auto_param_call=model_wo_auto_param_call, backend_kwargs=backend_kwargs,
            )
            self.driver.setup()
            self._owns_driver = True
        split = "eval" if self.driver.is_distributed() and use_dist_sampler else None
        for name, dl in self.dataloaders.items():
            self.driver.check_dataloader_legality(dl, argument=f"evaluate_dataloaders[{name!r}]" if name else "dataloaders")
            self.dataloaders[name] = self.driver.set_dist_repro_dataloader(dl, dist=split, reproducible=False)
        self.evaluate_batch_step_fn = evaluate_batch_step_fn or _default_evaluate_batch_step
        self._eval_fn, self._eval_sig = self.driver.get_model_call_fn(evaluate_fn, default="evaluate_step")
        self._feeders = [_MetricFeeder(m, name, self.driver) for name, m in self.metrics.items()]

    def evaluate_step(self, batch: Any) -> Any:
        """Run the evaluate function on one batch (mapped, in the driver's precision) and map its outputs."""
        if self._input_fn is not None:
            batch = self._input_fn(batch)
        with self.driver.auto_cast():
            outputs = self.driver.model_call(batch, self._eval_fn, self._eval_sig)
        if self._output_fn is not None:
            outputs = self._output_fn(outputs)
        return outputs

    def update_metrics(self, batch: Any, outputs: Any) -> None:
        """Feed every metric from the batch and the outputs (outputs win on a shared key)."""
        batch = as_dict(batch)
        outputs = as_dict(outputs)
        if not isinstance(outputs, Mapping):
            raise BatchMismatchError(
                f"the evaluate function returned {type(outputs).__name__}; metrics need a dict such as "
                "{'pred': ..., 'target': ...}. Return a dict or pass evaluate_output_mapping=fn."
            )
        data = {**batch, **outputs} if isinstance(batch, Mapping) else outputs
        for feed in self._feeders:
            feed(data)

    def run(self, num_eval_batch_per_dl: int = -1) -> dict[str, float]:
        """Evaluate every dataloader (at most ``num_eval_batch_per_dl`` batches each; -1 = all)."""
        check_int(num_eval_batch_per_dl, "num_eval_batch_per_dl", minimum=1, allowed=(-1,))
        driver = self.driver
        driver.set_model_mode("eval")
        results: dict[str, float] = {}
        # Evaluating must not shift the random streams training draws from (shuffling, dropout),
        # or a resumed run that skips an evaluation would diverge from an uninterrupted one.
        host_rng, framework_rng = capture_host_rng(), driver.rng_state()
        with driver.no_grad():
            for dl_name, dataloader in self.dataloaders.items():
                for metric in self.metrics.values():
                    metric.reset()
                for i, batch in enumerate(dataloader):
                    if i == num_eval_batch_per_dl:
                        break
                    self.evaluate_batch_step_fn(self, driver.move_data_to_device(batch))
                for metric_name, metric in self.metrics.items():
                    metric.aggregate(driver.all_reduce)
                    for key, value in metric.get_metric().items():
                        full = f"{key}#{metric_name}" + (f"#{dl_name}" if dl_name else "")
                        results[full] = value
                    metric.reset()
        restore_host_rng(host_rng)
        driver.load_rng_state(framework_rng)
        if self._owns_driver and self.verbose and driver.is_global_zero:
            print(_format_results(results), flush=True)
        return results


def _default_evaluate_batch_step(evaluator: Evaluator, batch: Any) -> None:
    evaluator.update_metrics(batch, evaluator.evaluate_step(batch))


def _format_results(results: Mapping[str, float]) -> str:
    return "evaluate: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items())
