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

from .._common import (
    BatchMismatchError,
    ConfigurationError,
    check_int,
    check_optional_callable,
    parameter_names,
    resolve_precision,
    split_backend_kwargs,
    unknown_arguments_error,
)
from .._mapping import METRIC_ALIASES, named_outputs, resolve_metric_inputs
from .._metrics import Metric
from .._progress import LoopDisplay, choose_loop_display
from ..backend import ArgumentNames, Driver, ModelStep, build_driver
from .inference import batch_dict, call_with_rng_kept, iterate_batches


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
    """Calls ``metric.update`` with the (numpy) values its parameters name, taken from batch + outputs.

    A parameter missing by its own name is looked up under its aliases (``pred`` <- ``logits``,
    ``target`` <- ``labels``, ...: :data:`drivetrain._mapping.outputs.METRIC_ALIASES`), so metrics read
    the outputs and batches of ecosystem models unchanged.
    """

    def __init__(self, metric: Metric, metric_name: str, driver: Driver, names: ArgumentNames,
                 model_parameters: tuple[str, ...] = ()) -> None:
        params = inspect.signature(metric.update).parameters.values()
        self.metric = metric
        self.metric_name = metric_name
        self.names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.required = [p.name for p in params
                         if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty]
        self.driver = driver
        self.argument_names = names
        self.model_parameters = model_parameters  # batch keys the model takes are not what a metric misses

    def __call__(self, data: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        sources = resolve_metric_inputs(data, self.names)
        missing = [n for n in self.required if n not in sources]
        if missing:
            raise BatchMismatchError(self._missing_message(missing, data, outputs))
        to_numpy = self.driver.tensor_to_numpy
        is_tensor = self.driver.is_tensor
        kwargs = {}
        for name, key in sources.items():
            value = data[key]
            kwargs[name] = to_numpy(value) if is_tensor(value) else value
        self.metric.update(**kwargs)

    def _missing_message(self, missing: list[str], data: Mapping[str, Any], outputs: Mapping[str, Any]) -> str:
        looked = [f"{n!r} (or {', '.join(map(repr, METRIC_ALIASES[n]))})" if n in METRIC_ALIASES else repr(n)
                  for n in missing]
        name = missing[0]
        batch_keys = [k for k in data if k not in outputs]
        spare_keys = [k for k in batch_keys if k not in self.model_parameters]  # the model did not take these
        unused_outputs = [k for k in outputs if k not in self.names and k != "loss"]
        fixes = []
        if unused_outputs:
            fixes.append(f"{self.argument_names.output_mapping}={{{unused_outputs[0]!r}: {name!r}}} to rename an output")
        if spare_keys:
            fixes.append(f"{self.argument_names.input_mapping}={{{spare_keys[0]!r}: {name!r}}} to rename a batch key")
        fixes.append(f"or return {name!r} from the evaluate function")
        return (
            f"metrics[{self.metric_name!r}].update() needs {', '.join(looked)} but the batch has {batch_keys} and the "
            f"model's outputs have {list(outputs)}; pass {', '.join(fixes)}."
        )


class Evaluator:
    """Evaluate ``model`` on ``dataloaders`` with ``metrics``; :meth:`run` returns ``{"acc#acc#dev": 0.97}``.

    Result keys are ``result#metric#dataloader`` (the dataloader part is omitted
    for a single unnamed dataloader). ``input_mapping`` is applied to each batch
    once: the evaluate function and the metrics both see the mapped batch;
    ``output_mapping`` is applied to the function's outputs before the metrics see
    them. ``progress_bar`` takes the Trainer's values (``"auto"``, ``"rich"``,
    ``"tqdm"``, ``"raw"``, ``None``). Framework options go in ``<driver>_kwargs`` dicts
    (e.g. ``torch_kwargs={...}``); any other unknown keyword is reported as a misspelt argument.
    ``_argument_names`` is internal: the Trainer passes the names its users know the
    mappings by (``evaluate_input_mapping``, ...), so that error messages use them.

    Args:
        model: the model, an object of your framework.
        dataloaders: one dataloader or ``{name: dataloader}``; the names end the result keys.
        metrics: ``{name: Metric}``, e.g. ``{"acc": Accuracy()}``.
        driver: ``"auto"``, a driver name, or a `Driver` to share (the Trainer passes its own).
        device: where the model runs, in the driver's terms (as for the `Trainer`).
        evaluate_batch_step_fn: ``fn(evaluator, batch)`` replacing the evaluation of one batch (default:
            ``evaluator.update_metrics(batch, evaluator.evaluate_step(batch))``).
        evaluate_fn: name of the model method to call (default: ``evaluate_step``, else forward).
        input_mapping: a dict renaming batch keys or a function of the batch, applied once per batch.
        output_mapping: the same for the evaluate function's outputs.
        model_wo_auto_param_call: True passes the whole batch as one argument.
        fp16: shorthand for ``precision="fp16"``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        verbose: 0 does not print the results line an evaluator with its own driver prints after ``run()``.
        use_dist_sampler: in distributed evaluation, shard each dataloader across the processes.
        progress_bar: ``"auto"``, ``"rich"``, ``"tqdm"``, ``"raw"`` or None.
        **kwargs: ``<driver>_kwargs`` dicts of framework options.

    Raises:
        ConfigurationError: an argument is wrong (a misspelt keyword gets the closest accepted name).
        DriverNotFoundError: the driver is unknown or not installed.
        DriverError: the driver rejects the device, the model or a dataloader.
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
        progress_bar: Any = "auto",
        _argument_names: ArgumentNames | None = None,
        **kwargs: Any,
    ) -> None:
        self.dataloaders = _normalise_dataloaders(dataloaders, "dataloaders")
        self.metrics = normalise_metrics(metrics)
        check_optional_callable(evaluate_batch_step_fn, "evaluate_batch_step_fn", "(evaluator, batch)")
        if evaluate_fn is not None and not isinstance(evaluate_fn, str):
            raise ConfigurationError(f"evaluate_fn={evaluate_fn!r} must be a method name (str) or None.")
        check_int(verbose, "verbose", minimum=0)
        names = ArgumentNames() if _argument_names is None else _argument_names
        backend_kwargs, unknown = split_backend_kwargs(kwargs)
        if unknown:
            public = [name for name in parameter_names(Evaluator.__init__) if not name.startswith("_")]
            raise unknown_arguments_error(
                "Evaluator", unknown, public,
                "Framework options go in '<driver>_kwargs' (e.g. torch_kwargs={...}).")
        self.verbose = verbose
        self._display = choose_loop_display(progress_bar)
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
        self._step = ModelStep(self.driver, evaluate_fn, "evaluate_step", input_mapping, output_mapping, names,
                               "evaluate function")
        taken = tuple(parameter_names(self._step.signature_fn)) if callable(self._step.signature_fn) else ()
        self._feeders = [_MetricFeeder(m, name, self.driver, names, taken) for name, m in self.metrics.items()]

    def evaluate_step(self, batch: Any) -> Any:
        """Run the evaluate function on one (already mapped) batch in the driver's precision; map its outputs.

        Args:
            batch: the batch, on the device.

        Returns:
            The function's outputs after ``output_mapping``.
        """
        return self._step.call(batch)

    def update_metrics(self, batch: Any, outputs: Any) -> None:
        """Feed every metric from the batch and the outputs (outputs win on a shared key).

        Args:
            batch: the batch the outputs were computed from.
            outputs: what ``evaluate_step`` returned.

        Raises:
            BatchMismatchError: a metric's ``update`` needs a value neither holds (the message lists both).
        """
        outputs = named_outputs(outputs, "evaluate function")
        data = {**batch_dict(batch), **outputs}
        for feed in self._feeders:
            feed(data, outputs)

    def run(self, num_eval_batch_per_dl: int = -1) -> dict[str, float]:
        """Evaluate every dataloader.

        Args:
            num_eval_batch_per_dl: evaluate at most this many batches of each (-1: all).

        Returns:
            ``{"result#metric#dataloader": value}``, e.g. ``{"acc#acc#dev": 0.97}``.
        """
        check_int(num_eval_batch_per_dl, "num_eval_batch_per_dl", minimum=1, allowed=(-1,))
        driver = self.driver
        driver.set_model_mode("eval")
        # Evaluating must not shift the random streams training draws from (shuffling, dropout),
        # or a resumed run that skips an evaluation would diverge from an uninterrupted one.
        results = call_with_rng_kept(driver, lambda: self._run_all(num_eval_batch_per_dl))
        if self._owns_driver and self.verbose and driver.is_global_zero:
            print(_format_results(results), flush=True)
        return results

    def _run_all(self, limit: int) -> dict[str, float]:
        driver = self.driver
        display = self._display if driver.is_global_zero else LoopDisplay()
        results: dict[str, float] = {}
        prepare = self._step.prepare
        with driver.no_grad():
            for dl_name, dataloader in self.dataloaders.items():
                for metric in self.metrics.values():
                    metric.reset()
                description = f"evaluate {dl_name}" if dl_name else "evaluate"
                for batch in iterate_batches(dataloader, limit, display, description):
                    self.evaluate_batch_step_fn(self, prepare(batch))
                for metric_name, metric in self.metrics.items():
                    metric.aggregate(driver.all_reduce)
                    for key, value in metric.get_metric().items():
                        full = f"{key}#{metric_name}" + (f"#{dl_name}" if dl_name else "")
                        results[full] = value
                    metric.reset()
        return results


def _default_evaluate_batch_step(evaluator: Evaluator, batch: Any) -> None:
    evaluator.update_metrics(batch, evaluator.evaluate_step(batch))


def _format_results(results: Mapping[str, float]) -> str:
    return "evaluate: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items())
