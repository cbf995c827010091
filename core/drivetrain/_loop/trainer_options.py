"""The Trainer's arguments checked and grouped before anything is built.

``Trainer.__init__`` takes fastNLP's flat argument list (users know it); this module
turns it into a few checked groups — how long to train, what to evaluate, how
batches and outputs are mapped — so the constructor reads as a list of steps and
every wrong argument fails here, by name, before a driver or dataloader exists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._callbacks import validate_monitor
from .._common import ConfigurationError, check_int, check_optional_callable, close_matches
from ..backend import ArgumentNames, Driver
from .evaluator import normalise_metrics

RESUME_LATEST = "latest"
"""``run(resume_from="latest")``: the newest checkpoint of the trainer's CheckpointCallback(s), or a fresh start."""


def check_resume_from(resume_from: Any) -> str | os.PathLike | None:
    """``run(resume_from=...)`` as a folder, ``"latest"`` or None: the Hugging Face Trainer's ``True`` means
    ``"latest"`` (and ``False`` no resume); Lightning's ``"last"``, not a folder here, gets the keyword named."""
    if isinstance(resume_from, bool):
        return RESUME_LATEST if resume_from else None
    if resume_from is not None and not isinstance(resume_from, (str, os.PathLike)):
        raise ConfigurationError(
            f"resume_from={resume_from!r} is not accepted; pass a checkpoint folder, a folder of checkpoints, "
            f"{RESUME_LATEST!r} (or True) for the newest checkpoint of the CheckpointCallback(s), or None.")
    if (isinstance(resume_from, str) and resume_from != RESUME_LATEST and not os.path.exists(resume_from)
            and close_matches(resume_from, [RESUME_LATEST])):
        raise ConfigurationError(
            f"resume_from={resume_from!r} is not a folder here ({os.path.abspath(resume_from)} does not exist). Did "
            f"you mean resume_from={RESUME_LATEST!r}? It resumes from the newest training checkpoint of the trainer's "
            "CheckpointCallback(s), and starts fresh when there is none yet.")
    return resume_from


@dataclass(frozen=True)
class Mappings:
    """The input/output mappings of training and of evaluation, and their names for error messages."""

    train_input: Any
    train_output: Any
    evaluate_input: Any
    evaluate_output: Any
    evaluate_names: ArgumentNames

    @classmethod
    def resolve(cls, input_mapping: Any, output_mapping: Any, train_input_mapping: Any, train_output_mapping: Any,
                evaluate_input_mapping: Any, evaluate_output_mapping: Any) -> Mappings:
        """The general ``input_mapping``/``output_mapping`` serve both sides unless a side has its own (not both)."""
        return cls(
            _exclusive(input_mapping, train_input_mapping, "input_mapping", "train_input_mapping"),
            _exclusive(output_mapping, train_output_mapping, "output_mapping", "train_output_mapping"),
            _exclusive(input_mapping, evaluate_input_mapping, "input_mapping", "evaluate_input_mapping"),
            _exclusive(output_mapping, evaluate_output_mapping, "output_mapping", "evaluate_output_mapping"),
            # an error about evaluation suggests the argument the user can add without a conflict
            ArgumentNames("input_mapping" if input_mapping is not None else "evaluate_input_mapping",
                          "output_mapping" if output_mapping is not None else "evaluate_output_mapping"),
        )


def check_loop_arguments(*, train_dataloader: Any, n_epochs: Any, n_batches: Any, accumulation_steps: Any,
                         overfit_batches: Any, nproc: Any, evaluate_every: Any, larger_better: Any) -> None:
    """How long and how to train: every number and flag of the loop."""
    if train_dataloader is None:
        raise ConfigurationError("train_dataloader=None: pass the dataloader (any iterable of batches) to train on.")
    check_int(n_epochs, "n_epochs", minimum=1)
    check_int(accumulation_steps, "accumulation_steps", minimum=1)
    check_int(n_batches, "n_batches", minimum=1, allowed=(-1,))
    check_int(overfit_batches, "overfit_batches", minimum=0, allowed=(-1,))
    if nproc is not None:
        check_int(nproc, "nproc", minimum=1)
    if not isinstance(larger_better, bool):
        raise ConfigurationError(f"larger_better={larger_better!r} must be True or False.")
    _check_evaluate_every(evaluate_every)


def check_step_functions(*, batch_step_fn: Any, evaluate_batch_step_fn: Any, loss_fn: Any, train_fn: Any,
                         evaluate_fn: Any, marker: Any) -> None:
    """The functions that replace parts of a step, and the names that select them."""
    check_optional_callable(batch_step_fn, "batch_step_fn", "(trainer, batch)")
    check_optional_callable(evaluate_batch_step_fn, "evaluate_batch_step_fn", "(evaluator, batch)")
    check_optional_callable(loss_fn, "loss_fn", "(outputs, batch) -> loss")
    for name, value in (("train_fn", train_fn), ("evaluate_fn", evaluate_fn), ("marker", marker)):
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(f"{name}={value!r} must be a str or None.")


def check_evaluation(metrics: Any, evaluate_dataloaders: Any, overfit_batches: int, monitor: Any) -> dict | None:
    """Metrics and evaluation dataloaders come together; ``monitor`` must name something they produce."""
    if metrics is not None:
        metrics = normalise_metrics(metrics)
        if evaluate_dataloaders is None and overfit_batches == 0:
            raise ConfigurationError(
                "metrics were given but evaluate_dataloaders=None; pass evaluate_dataloaders= "
                "(a dataloader or {name: dataloader}) or drop metrics."
            )
    elif evaluate_dataloaders is not None:
        raise ConfigurationError(
            "evaluate_dataloaders were given but metrics=None; pass metrics={'acc': Accuracy()} or drop "
            "evaluate_dataloaders."
        )
    if metrics is not None and isinstance(evaluate_dataloaders, Mapping) and not overfit_batches:
        dataloader_names = list(evaluate_dataloaders)
    else:  # one unnamed dataloader (overfit_batches evaluates on the training batches)
        dataloader_names = [""]
    validate_monitor(monitor, metrics, dataloader_names)
    return metrics


def check_driver_instance(driver: Driver, model: Any, **given: tuple[Any, Any]) -> None:
    """With a ready Driver, options that configure a driver would be ignored: refuse them; the model must match."""
    ignored = sorted(name for name, (value, default) in given.items() if value != default)
    if ignored:
        raise ConfigurationError(
            f"driver= is a Driver instance, so {ignored} would be ignored; pass these options to the driver "
            "when you build it, or pass driver='<name>' and let the Trainer build it."
        )
    if driver.unwrap_model() is not model:
        raise ConfigurationError("driver= is a Driver built for another model than model=; pass the same model to both.")


def _exclusive(general: Any, specific: Any, general_name: str, specific_name: str) -> Any:
    if general is not None and specific is not None:
        raise ConfigurationError(f"{general_name} and {specific_name} were both given; pass only one of them.")
    return specific if specific is not None else general


def _check_evaluate_every(evaluate_every: Any) -> None:
    if callable(evaluate_every):
        return
    if isinstance(evaluate_every, int) and not isinstance(evaluate_every, bool) and evaluate_every != 0:
        return
    raise ConfigurationError(
        f"evaluate_every={evaluate_every!r} is not accepted; use an int > 0 (every n batches), an int < 0 "
        "(every -n epochs) or a function(trainer) -> bool called after each batch."
    )



@dataclass(frozen=True)
class Records:
    """What the run records: the loggers, the window length in batches, and the run folder."""

    loggers: list[Any]
    every: int | None
    run_dir: str | None

    @classmethod
    def resolve(cls, loggers: Any, log_every_n_steps: Any, run_dir: Any) -> Records:
        """``log_every_n_steps`` defaults to 50 when loggers are given; without both, only evaluations are kept."""
        from .._records import DEFAULT_EVERY, make_loggers

        if log_every_n_steps is not None:
            check_int(log_every_n_steps, "log_every_n_steps", minimum=1)
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
            raise ConfigurationError(
                f"run_dir={run_dir!r} is not accepted; pass the folder string-named loggers write to (str or "
                "os.PathLike), or None for runs/<date>-<time>."
            )
        made = make_loggers(loggers)
        every = log_every_n_steps if log_every_n_steps is not None else (DEFAULT_EVERY if made else None)
        return cls(made, every, None if run_dir is None else os.fspath(run_dir))
