"""The Trainer: the one training loop, written once for every framework.

Everything framework-specific goes through ``self.driver``; the loop owns the
order of events (see ``_events.EVENT_ARGS``), gradient accumulation, evaluation
scheduling and the bookkeeping callbacks read (``cur_epoch_idx``,
``batch_idx_in_epoch``, ``global_forward_batches``, ...).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from .._callbacks import (
    Callback,
    CallbackManager,
    Event,
    PreemptionCallback,
    find_monitor_value,
    normalise_callbacks,
    preemption_for,
)
from .._checkpoint import (
    HostBuffers,
    PendingSave,
    TrainerState,
    load_trainer,
    load_weights_into,
    save_model,
    save_trainer,
    start_trainer_save,
)
from .._common import (
    ConfigurationError,
    EarlyStopException,
    MissingAttribute,
    Preempted,
    check_int,
    check_log_level,
    logger,
    parameter_names,
    resolve_precision,
    split_backend_kwargs,
    unknown_arguments_error,
)
from .._common import configure as configure_logging
from .._data import (
    AccumulationCycle,
    LoopLength,
    OverfitLoader,
    Position,
    ReproducibleBatchSampler,
    ResumedFrom,
    TruncatedLoader,
    find_reproducible_sampler,
    loader_length,
    plan_length,
    restore_loader_position,
)
from .._format import CheckpointError, FolderLock, newest_over_folders, resolve_resume_folder
from .._progress import choose_progress
from .._records import HistoryRecorder, RunRecorder
from ..backend import ArgumentNames, Driver, ModelStep, build_driver
from .evaluator import Evaluator
from .signals import end_quietly, stop_signals_raise
from .trainer_options import (
    RESUME_LATEST,
    Mappings,
    Records,
    check_driver_instance,
    check_evaluation,
    check_loop_arguments,
    check_resume_from,
    check_step_functions,
)

_SAME_AS_TRAINER: Any = type("SameAsTrainer", (), {"__repr__": lambda self: "<the trainer's progress_bar>"})()


def _default_batch_step(trainer: Trainer, batch: Any) -> None:
    trainer.forward_backward(batch)
    trainer.step()
    trainer.zero_grad()


def _separate_step(trainer: Trainer, batch: Any) -> None:
    """The batch step of a Trainer subclass that overrides ``train_step`` or ``backward`` (fastNLP's habit)."""
    context = None if trainer.accumulation_steps == 1 else trainer.get_no_sync_context()
    if context is None or type(context) is contextlib.nullcontext:  # the usual batch: nothing to enter
        trainer.backward(trainer.train_step(batch))
    else:
        with context:
            trainer.backward(trainer.train_step(batch))
    trainer.step()
    trainer.zero_grad()


class Trainer:
    """Train ``model`` on ``train_dataloader`` with ``optimizers`` through the driver of its framework.

    The arguments and their meaning follow fastNLP's Trainer; [the Trainer guide](../user-guide/trainer.md)
    shows each one at work. Every argument is checked here, before any batch is touched; ``run()`` trains.

    Args:
        model: the model, an object of your framework (a ``torch.nn.Module`` for the torch driver).
        train_dataloader: anything iterable yielding batches (a ``DataLoader``, a list of dicts). With a
            ``len()`` the Trainer knows the epoch length; without one an epoch ends when it is exhausted. The
            data themselves (an array, a tensor, a dict of arrays) are refused, naming the dataloader to use.
        optimizers: one optimizer or a list, stepped together; None only with a ``batch_step_fn`` that
            updates the model itself.
        driver: ``"auto"`` (the backend that recognises the model's class), a driver name (``"torch"``,
            ``"torch_ddp"``, ``"paddle"``...) or a ready `Driver`.
        device: where the model runs, in the driver's terms: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, an int, a
            list of GPUs for a distributed driver, or None to leave the model where it is.
        n_epochs: passes over ``train_dataloader``.
        evaluate_dataloaders: one dataloader or ``{name: dataloader}``; the names appear in result keys
            (``acc#acc#dev``). Needs ``metrics``.
        batch_step_fn: ``fn(trainer, batch)`` replacing what happens with each batch (default: forward,
            backward, step, zero_grad; see ``train_step``).
        evaluate_batch_step_fn: ``fn(evaluator, batch)`` replacing the evaluation of one batch.
        train_fn: name of the model method training calls (default: ``train_step`` if the model has
            one, else the model itself).
        evaluate_fn: name of the model method evaluation calls (default: ``evaluate_step``, else forward).
        callbacks: one `Callback` or a list, run at the events they override.
        metrics: ``{name: Metric}`` computed on ``evaluate_dataloaders``, e.g. ``{"acc": Accuracy()}``.
        evaluate_every: when to evaluate while training: ``-n`` after every n-th epoch (default: each
            epoch), ``n`` after every n-th batch of the run, or ``fn(trainer) -> bool`` asked after each batch.
        input_mapping: a dict renaming batch keys (``{"features": "x"}``) or a function of the batch,
            applied before the model call, in training and evaluation.
        output_mapping: the same for what the model returns, before the loss, metrics and callbacks see it.
        model_wo_auto_param_call: True passes the whole batch as one argument instead of matching a dict
            batch's keys to the model function's parameter names.
        accumulation_steps: backpropagate every batch but step the optimizers every this many batches,
            each loss divided so a step sees the mean gradient.
        fp16: shorthand for ``precision="fp16"``.
        monitor: the evaluation result that counts as the score (``"acc"``, ``"acc#acc#dev"``, or
            ``fn(results) -> float``), read by early stopping and top-k checkpoints.
        larger_better: whether a larger ``monitor`` value is better.
        n_batches: train exactly this many batches in all instead of ``n_epochs`` (-1: use ``n_epochs``).
        overfit_batches: debugging: train (and evaluate) on the first n batches only, every epoch (-1:
            all of them held in memory; 0: off).
        marker: a label; functions registered with ``Trainer.on(event, marker=...)`` attach to every
            Trainer with this marker.
        progress_bar: ``"auto"``, ``"rich"``, ``"raw"``, ``"tqdm"``, None, or a progress callback.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``, as the driver supports it (Lightning's
            ``"bf16-mixed"``, ``"16-mixed"`` and ``"32-true"`` are the same).
        grad_clip: clip gradients before each optimizer step at this value (None: no clipping).
        grad_clip_type: ``"norm"`` rescales all gradients to a global norm of at most ``grad_clip``;
            ``"value"`` clamps each element into ``[-grad_clip, grad_clip]``.
        nproc: processes to train with, for a distributed driver (None: one, or what a launcher started).
        loss_fn: ``loss_fn(outputs, batch) -> loss`` for a model that returns no loss (logits only).
        train_input_mapping: like ``input_mapping``, for training only.
        train_output_mapping: like ``output_mapping``, for training only.
        evaluate_input_mapping: like ``input_mapping``, for evaluation only.
        evaluate_output_mapping: like ``output_mapping``, for evaluation only.
        check_dataloader_legality: let the driver check ``train_dataloader`` now (False skips the check).
        reproducible_sampler: let the driver install a `ReproducibleBatchSampler`, so a run resumed in
            the middle of an epoch continues with exactly the next samples.
        use_dist_sampler: in distributed training, shard ``train_dataloader`` across the processes
            (False: your dataloaders already give each process its share).
        evaluate_use_dist_sampler: the same for the evaluation dataloaders (default: ``use_dist_sampler``).
        loggers: the run record: logger names (``"csv"``, ``"jsonl"``, ``"tensorboard"``...) or
            ``drivetrain.loggers`` objects.
        log_every_n_steps: batches one logged window spans (default 50 with loggers).
        run_dir: the folder name-given loggers write to (default ``runs/<date>-<time>``).
        log_level: level of drivetrain's own messages (``"debug"``... or a ``logging`` number; default
            ``"info"`` on the global-zero process, ``"warning"`` on the others).
        **kwargs: ``<driver>_kwargs`` dicts of options for one framework's driver
            (``torch_kwargs={"set_to_none": False}``); only the chosen driver's is used.

    Raises:
        ConfigurationError: an argument is wrong (the message names it and the fix; a misspelt keyword
            gets the closest accepted name).
        DriverNotFoundError: the driver is unknown or its backend or framework is not installed.
        DriverError: the driver rejects the device, an optimizer, the precision or the model.
    """

    _registered_fns: ClassVar[dict[str | None, list[tuple[Event, Callable]]]] = defaultdict(list)
    _HABITS: ClassVar[dict[str, str]] = dict.fromkeys(
        ("fit", "train"), "drivetrain's Trainer trains with trainer.run() (Lightning's fit(), the Hugging Face "
        "Trainer's train()), and evaluates with trainer.evaluate().")
    """What other libraries' Trainers are asked for, and the Trainer's own word for it."""

    def __init__(
        self, model: Any, train_dataloader: Any, optimizers: Any = None, driver: str | Driver = "auto",
        device: Any = "cpu", n_epochs: int = 20, evaluate_dataloaders: Any = None,
        batch_step_fn: Callable[[Trainer, Any], None] | None = None,
        evaluate_batch_step_fn: Callable[[Evaluator, Any], None] | None = None, train_fn: str | None = None,
        evaluate_fn: str | None = None, callbacks: Callback | list[Callback] | None = None,
        metrics: Mapping[str, Any] | None = None, evaluate_every: int | Callable[[Trainer], bool] = -1,
        input_mapping: Any = None, output_mapping: Any = None, model_wo_auto_param_call: bool = False,
        accumulation_steps: int = 1, fp16: bool = False,
        monitor: str | Callable[[Mapping[str, float]], float] | None = None, larger_better: bool = True,
        n_batches: int = -1, overfit_batches: int = 0, marker: str | None = None, progress_bar: Any = "auto",
        precision: str | None = None, grad_clip: float | None = None, grad_clip_type: str = "norm",
        nproc: int | None = None, loss_fn: Callable[[Any, Any], Any] | None = None, *,
        train_input_mapping: Any = None, train_output_mapping: Any = None, evaluate_input_mapping: Any = None,
        evaluate_output_mapping: Any = None, check_dataloader_legality: bool = True,
        reproducible_sampler: bool = True, use_dist_sampler: bool = True, evaluate_use_dist_sampler: bool | None = None,
        loggers: Any = None, log_every_n_steps: int | None = None, run_dir: str | os.PathLike | None = None,
        log_level: str | int | None = None, **kwargs: Any,
    ) -> None:
        # -- 1. every argument is checked before anything is built
        check_loop_arguments(train_dataloader=train_dataloader, n_epochs=n_epochs, n_batches=n_batches,
                             accumulation_steps=accumulation_steps, overfit_batches=overfit_batches, nproc=nproc,
                             evaluate_every=evaluate_every, larger_better=larger_better)
        check_step_functions(batch_step_fn=batch_step_fn, evaluate_batch_step_fn=evaluate_batch_step_fn,
                             loss_fn=loss_fn, train_fn=train_fn, evaluate_fn=evaluate_fn, marker=marker)
        metrics = check_evaluation(metrics, evaluate_dataloaders, overfit_batches, monitor)
        backend_kwargs = _backend_options(kwargs)
        self.mappings = Mappings.resolve(input_mapping, output_mapping, train_input_mapping, train_output_mapping,
                                         evaluate_input_mapping, evaluate_output_mapping)
        callback_list = normalise_callbacks(callbacks)
        records = Records.resolve(loggers, log_every_n_steps, run_dir)
        level = check_log_level(log_level)
        progress = choose_progress(progress_bar)
        self.precision = resolve_precision(fp16, precision)
        if isinstance(driver, Driver):
            check_driver_instance(
                driver, model, device=(device, "cpu"), fp16=(fp16, False), precision=(precision, None),
                grad_clip=(grad_clip, None), grad_clip_type=(grad_clip_type, "norm"), nproc=(nproc, None),
                model_wo_auto_param_call=(model_wo_auto_param_call, False),
                **{f"{name}_kwargs": (value, None) for name, value in backend_kwargs.items()})
            self.precision = driver.precision

        # -- 2. the driver, the data, the evaluator, the callbacks
        self.model, self.marker, self.loss_fn = model, marker, loss_fn
        self.driver = build_driver(
            driver, model, device, precision=self.precision, grad_clip=grad_clip, grad_clip_type=grad_clip_type,
            model_wo_auto_param_call=model_wo_auto_param_call, backend_kwargs=backend_kwargs,
            **({} if nproc is None else {"nproc": nproc}))
        configure_logging(level, is_global_zero=self.driver.is_global_zero)
        self._setup_driver(optimizers, needs_optimizers=batch_step_fn is None, accumulation_steps=accumulation_steps,
                           train_dataloader=train_dataloader)
        self._setup_data(train_dataloader, check_dataloader_legality, use_dist_sampler, reproducible_sampler,
                         overfit_batches)
        self.metrics, self.monitor, self.larger_better, self.evaluate_every = metrics, monitor, larger_better, evaluate_every
        self.evaluator: Evaluator | None = None
        if metrics is not None:
            self.evaluator = Evaluator(
                model, self.dataloader if overfit_batches else evaluate_dataloaders, metrics, driver=self.driver,
                evaluate_batch_step_fn=evaluate_batch_step_fn, evaluate_fn=evaluate_fn, progress_bar=progress,
                input_mapping=self.mappings.evaluate_input, output_mapping=self.mappings.evaluate_output,
                use_dist_sampler=use_dist_sampler if evaluate_use_dist_sampler is None else evaluate_use_dist_sampler,
                _argument_names=self.mappings.evaluate_names)
        self._setup_callbacks(callback_list, progress, marker, self._recorder(records, n_epochs, n_batches,
                                                                                accumulation_steps, grad_clip))

        # -- 3. the step function and the loop's position
        self._setup_step(batch_step_fn, train_fn)
        self._reset_position(n_epochs, n_batches, accumulation_steps)
        self.fire("on_after_trainer_initialized", self.driver)

    def __getattr__(self, name: str) -> Any:
        """Called only for a name the Trainer lacks: ``fit``/``train`` name ``run()``, a misspelt one the closest."""
        raise MissingAttribute(self, name, self._HABITS)

    def _setup_driver(self, optimizers: Any, needs_optimizers: bool, accumulation_steps: int,
                      train_dataloader: Any) -> None:
        driver = self.driver
        driver.set_optimizers(optimizers)
        if not driver.optimizers and needs_optimizers:
            raise ConfigurationError(
                "optimizers=None: pass the optimizer(s) to train with, or a batch_step_fn that updates the model."
            )
        driver.configure_loop(accumulation_steps=accumulation_steps, train_dataloader=train_dataloader)
        driver.setup()
        driver.zero_grad()  # a clean start; a checkpoint loaded later may bring back gradients of a cycle

    def _setup_data(self, train_dataloader: Any, check_legality: bool, use_dist_sampler: bool,
                    reproducible_sampler: bool, overfit_batches: int) -> None:
        """The dataloader the loop iterates: sharded across ranks and resumable where the driver can make it so."""
        driver = self.driver
        if check_legality:
            driver.check_dataloader_legality(train_dataloader, argument="train_dataloader")
        self.train_dataloader = train_dataloader
        self.dataloader = driver.set_dist_repro_dataloader(
            train_dataloader, dist="train" if driver.is_distributed() and use_dist_sampler else None,
            reproducible=bool(reproducible_sampler))
        self._sampler = find_reproducible_sampler(self.dataloader)
        self.overfit_batches = overfit_batches
        if overfit_batches != 0:
            self.dataloader = OverfitLoader(self.dataloader, overfit_batches)

    def _recorder(self, records: Records, n_epochs: int, n_batches: int, accumulation_steps: int,
                  grad_clip: float | None) -> HistoryRecorder:
        """The callback keeping ``history`` and, with loggers or ``log_every_n_steps``, feeding the run record."""
        if records.every is None:
            return HistoryRecorder()
        hparams = {"n_epochs": n_epochs, "n_batches": n_batches, "accumulation_steps": accumulation_steps,
                   "precision": self.precision, "grad_clip": grad_clip, "log_every_n_steps": records.every,
                   "optimizers": [type(optimizer).__name__ for optimizer in self.driver.optimizers]}
        return RunRecorder(records.loggers, records.every, records.run_dir, hparams)

    @property
    def in_epoch(self) -> bool:
        """Whether an epoch is open: the loop is inside it, or ``n_batches`` stopped it inside one (a checkpoint
        taken then resumes inside that epoch)."""
        return self._in_epoch

    @property
    def history(self) -> dict[str, list[dict[str, Any]]]:
        """The run's scalars as plain data: ``{"train": [{"step": ..., "train/loss": ...}, ...], "evaluate": [...]}``.

        Evaluation results are always kept; training scalars when ``loggers`` or
        ``log_every_n_steps`` were given (one row per logged window).
        """
        return self._history_recorder.history

    def _setup_callbacks(self, callbacks: list[Callback], progress: Callback | None, marker: str | None,
                         recorder: HistoryRecorder) -> None:
        self.callback_manager = CallbackManager(is_global_zero=self.driver.is_global_zero)
        self._history_recorder = recorder
        # a PreemptionCallback goes last: it stops after every other callback saw the batch, and requeues after
        # the checkpoint is written (the Trainer adds one under Slurm, see preemption_for)
        preemption = [cb for cb in callbacks if isinstance(cb, PreemptionCallback)] or \
            [cb for cb in [preemption_for(callbacks)] if cb is not None]
        for cb in callbacks:
            if not isinstance(cb, PreemptionCallback):
                self.callback_manager.add_callback(cb)
        if progress is not None:
            self.callback_manager.add_callback(progress)
        self.callback_manager.add_callback(recorder)  # a save waits for every callback of its step
        for event, fn in self._take_registered_fns(marker):
            self.callback_manager.add_fn(event, fn, where="Trainer.on")
        for cb in preemption:
            self.callback_manager.add_callback(cb)
        self._handlers = self.callback_manager.handlers
        self._progress = progress

    def _setup_step(self, batch_step_fn: Callable[[Trainer, Any], None] | None, train_fn: str | None) -> None:
        """What each batch runs: the train function, its mappings and how tuple batches are named."""
        overridden = [name for name in ("train_step", "backward")
                      if getattr(type(self), name) is not getattr(Trainer, name)]
        if overridden and not self.driver.capabilities.separate_backward:
            raise ConfigurationError(
                f"{type(self).__name__} overrides Trainer.{overridden[0]}, which needs a loss computed before its "
                f"backward; the {self.driver.name} driver computes the loss and its gradients in one call. Override "
                "Trainer.forward_backward(batch), or pass batch_step_fn=fn(trainer, batch), instead.")
        self._check_before_backward()
        self.batch_step_fn = batch_step_fn or (_separate_step if overridden else _default_batch_step)
        self._train_step = ModelStep(self.driver, train_fn, "train_step", self.mappings.train_input,
                                     self.mappings.train_output, ArgumentNames(), "train function", self.loss_fn)
        self._batch_namer = self._train_step.namer
        self._input_fn = self._train_step.input_fn
        self._null = contextlib.nullcontext()
        self._fire_before_backward = functools.partial(self.fire, "on_before_backward")
        self._separate_backward = self.driver.capabilities.separate_backward

    def _check_before_backward(self) -> None:
        """Refuse an ``on_before_backward`` handler that may change the loss on a driver that cannot fire it
        between the loss and the backward (one that only reads the loss fires after the fused call)."""
        if self.driver.capabilities.separate_backward:
            return
        for handler in self._handlers["on_before_backward"]:
            fn = getattr(handler, "fn", handler)  # a FilteredHandler (every=, once=) wraps the function
            owner = getattr(fn, "__self__", None)
            if getattr(fn if owner is None else owner, "changes_loss", True):
                what = f"callback {type(owner).__name__}" if owner is not None else f"function {fn!r:.60}"
                where = "class" if owner is not None else "function (fn.changes_loss = False)"
                raise ConfigurationError(
                    f"the {what} handles on_before_backward, where a callback may change the loss; the "
                    f"{self.driver.name} driver computes the loss and its gradients in one call, so no event comes "
                    "between them and a changed loss would be ignored. To change the loss, pass loss_fn= (or "
                    f"output_mapping=); if it only reads the outputs, set changes_loss = False on its {where}: it "
                    "then runs after the gradients are computed.")

    def _reset_position(self, n_epochs: int, n_batches: int, accumulation_steps: int) -> None:
        """The loop's length and position, as callbacks read them and checkpoints store them."""
        self.accumulation_steps = accumulation_steps
        self._cycle = AccumulationCycle(accumulation_steps)
        self.n_epochs: int | None = n_epochs
        self._requested_n_epochs = n_epochs
        self.n_batches: int | None = None if n_batches == -1 else n_batches
        self._requested_n_batches = n_batches
        self.cur_epoch_idx = 0
        self.batch_idx_in_epoch = 0
        self.global_forward_batches = 0
        self.num_batches_per_epoch: int | None = None
        self._epoch_length: int | None = None
        self._has_run = False
        self._in_epoch = False
        self._mid_batch = False  # a batch was fetched and its step has not completed
        self._failed_by: BaseException | None = None  # what ended run() abnormally (checkpoints then are for salvage)
        self._resume_batches = 0  # batches of the current epoch a resumed run starts after
        self._resume_samples: int | None = None  # the same position in samples, when a sampler tracks it
        self._resume_loader_states: list[Any] | None = None  # each rank's saved loader position (streams)
        self._epoch_start_batch = 0  # batch index the running epoch's iteration started at
        self._ended: str | None = None  # how run() ended: "finished", "early_stopped" (checkpoints record it)
        self._resumed: ResumedFrom | None = None  # the checkpoint run() resumed from, if any

    # ------------------------------------------------------------------ callbacks
    @classmethod
    def on(cls, event: Event, marker: str | None = None) -> Callable[[Callable], Callable]:
        """Decorator registering ``fn`` for ``event`` on the next Trainer built (or every Trainer with ``marker``).

        Args:
            event: the `Event` to handle, e.g. ``Event.on_train_epoch_end()``.
            marker: attach ``fn`` to every Trainer built with this ``marker`` (None: the next Trainer only).

        Returns:
            The decorator; it returns ``fn`` unchanged.

        Raises:
            ConfigurationError: ``event`` is not an `Event`, or ``fn`` cannot take the event's arguments.
        """
        if not isinstance(event, Event):
            raise ConfigurationError(f"Trainer.on(event={event!r}): pass an Event such as Event.on_train_begin().")

        def register(fn: Callable) -> Callable:
            from .._callbacks import check_handler_signature

            check_handler_signature(fn, event.name, "Trainer.on")
            cls._registered_fns[marker].append((event, fn))
            return fn

        return register

    @classmethod
    def _take_registered_fns(cls, marker: str | None) -> list[tuple[Event, Callable]]:
        """Unmarked functions go to the next Trainer built; marked ones to every Trainer with that marker."""
        fns = cls._registered_fns.pop(None, [])
        if marker is not None:
            fns = fns + list(cls._registered_fns.get(marker, []))
        return fns

    def add_callback_fn(self, event: Event, fn: Callable) -> None:
        """Attach ``fn(trainer, ...)`` to ``event`` on this trainer.

        Args:
            event: the `Event` (or its name) to handle.
            fn: called with the trainer and the event's arguments.

        Raises:
            ConfigurationError: ``fn`` cannot take the event's arguments, or ``event`` is no event.
        """
        self.callback_manager.add_fn(event, fn, where="add_callback_fn")
        try:
            self._check_before_backward()
        except ConfigurationError:
            self._handlers["on_before_backward"].pop()  # the handler just added: the trainer stays usable
            raise

    def fire(self, name: str, *args: Any) -> None:
        """Run the callbacks registered for event ``name`` with ``args``.

        Args:
            name: an :class:`Event` name (``"on_train_begin"``).
            *args: the event's arguments after the trainer.

        Raises:
            CallbackError: a callback raised; the message names it and the event.
        """
        handlers = self._handlers[name]
        if handlers:
            self.callback_manager.fire(name, self, *args)

    @property
    def callbacks(self) -> list[Callback]:
        """The callbacks of this trainer, in the order they run (a copy: add them with ``add_callback_fn``)."""
        return list(self.callback_manager.callbacks)

    # ------------------------------------------------------------------- the loop
    def run(
        self,
        num_train_batch_per_epoch: int = -1,
        num_eval_batch_per_dl: int = -1,
        num_eval_sanity_batch: int = 2,
        resume_from: str | os.PathLike | bool | None = None,
        resume_training: bool = True,
        catch_KeyboardInterrupt: bool | None = None,  # noqa: N803 - fastNLP's public name
    ) -> None:
        """Train until ``n_epochs`` (or ``n_batches``) is reached, evaluating as scheduled.

        ``num_train_batch_per_epoch`` / ``num_eval_batch_per_dl`` shorten epochs and
        evaluations for a smoke run (-1 = full); ``num_eval_sanity_batch`` batches are
        evaluated before training to catch evaluation bugs early (0 = skip).
        On Ctrl-C the interrupt propagates once ``on_exception`` handlers (a CheckpointCallback's
        ``save_on_exception``) and ``on_train_end`` ran, so the script stops and exits 130 like any
        Python program; ``catch_KeyboardInterrupt=True`` (fastNLP's habit) returns quietly instead.
        SIGTERM (sent by SLURM, Kubernetes, ``kill``) raises :class:`TrainingTerminated` the same way
        (exit status 143). ``resume_from`` is a checkpoint folder, or a
        folder of checkpoints (the newest complete one is taken); see :meth:`load_checkpoint` and
        [Checkpoints and resume](../user-guide/checkpoints.md).
        The string ``"latest"`` takes the newest training checkpoint over the folders of the trainer's
        CheckpointCallback(s) and starts fresh when there is none yet, so one command line serves the
        first start and every restart (the keyword wins over a folder named ``latest``: pass ``"./latest"``);
        ``True`` (the Hugging Face Trainer's ``resume_from_checkpoint=True``) means ``"latest"``.

        Args:
            num_train_batch_per_epoch: cut every epoch after this many batches (-1: full epochs).
            num_eval_batch_per_dl: evaluate at most this many batches per dataloader (-1: all).
            num_eval_sanity_batch: batches per dataloader evaluated before training (0: skip).
            resume_from: a checkpoint folder, a folder of checkpoints, ``"latest"`` (or True), or None.
            resume_training: True continues where the checkpoint left off; False loads the model and
                optimizer states and trains from the start.
            catch_KeyboardInterrupt: True returns quietly on Ctrl-C instead of raising it again.

        Raises:
            ConfigurationError: a count is out of range, ``resume_from`` is of no accepted kind, or ``run()`` was
                already called.
            CheckpointError: the checkpoint to resume from is damaged or does not fit this trainer.
            TrainingTerminated: SIGTERM arrived (after ``on_exception`` and ``on_train_end`` ran).
        """
        check_int(num_train_batch_per_epoch, "num_train_batch_per_epoch", minimum=1, allowed=(-1,))
        check_int(num_eval_batch_per_dl, "num_eval_batch_per_dl", minimum=1, allowed=(-1,))
        check_int(num_eval_sanity_batch, "num_eval_sanity_batch", minimum=0)
        resume_from = check_resume_from(resume_from)
        if self._has_run:
            raise ConfigurationError("Trainer.run() was already called; build a new Trainer to train again.")
        self._has_run = True
        self.num_eval_batch_per_dl = num_eval_batch_per_dl
        if num_train_batch_per_epoch != -1:
            self.dataloader = TruncatedLoader(self.dataloader, num_train_batch_per_epoch)
        self.num_batches_per_epoch = loader_length(self.dataloader)
        locks = self._lock_checkpoint_folders()  # before a resume reads (and tidies) the folders
        try:
            resume_folder = self._latest_checkpoint() if resume_from == RESUME_LATEST else resume_from
            if resume_folder is not None:
                self.load_checkpoint(resolve_resume_folder(resume_folder), resume_training=resume_training)
            length = self._plan_length()
            start = Position(self.cur_epoch_idx, self._resume_start_batch(), self.global_forward_batches, None)
            if self._resumed is not None and not self._resumed.has_work(
                    length, start, by_steps=self._requested_n_batches != -1, per_epoch=self.num_batches_per_epoch,
                    latest=resume_from == RESUME_LATEST):
                return  # said why in one line; nothing is fired, so no checkpoint or run record is touched
            with stop_signals_raise(self.driver.is_distributed()):
                self._run_loop(num_eval_sanity_batch, bool(catch_KeyboardInterrupt))
        finally:
            for lock in locks:
                lock.release()

    def _lock_checkpoint_folders(self) -> list[FolderLock]:
        """Rank 0 locks every CheckpointCallback folder for this run; a folder another run holds is refused on
        every rank, naming that run (see ``_format/lock.py``)."""
        from .._callbacks import CheckpointCallback

        folders = sorted({cb.folder for cb in self.callbacks if isinstance(cb, CheckpointCallback)})
        locks: list[FolderLock] = []
        error = None
        if folders and self.driver.is_global_zero:
            try:
                for folder in folders:
                    lock = FolderLock(folder)
                    note = lock.acquire()
                    locks.append(lock)
                    if note:
                        logger.warning(note)
            except CheckpointError as exc:
                for lock in locks:
                    lock.release()
                locks, error = [], str(exc)
        if folders and self.driver.is_distributed():
            error = self.driver.broadcast_object(error, src=0)
        if error is not None:
            raise CheckpointError(error)
        return locks

    def _run_loop(self, num_eval_sanity_batch: int, catch_keyboard_interrupt: bool) -> None:
        """The epochs, with the events around them, and how each way of ending is reported."""
        try:
            if self.evaluator is not None and num_eval_sanity_batch > 0:
                self.fire("on_sanity_check_begin")
                results = self.evaluator.run(num_eval_batch_per_dl=num_eval_sanity_batch)
                self.fire("on_sanity_check_end", results)
            self.fire("on_train_begin")
            self.driver.barrier()
            while (self.n_epochs is None or self.cur_epoch_idx < self.n_epochs) and not self._reached_n_batches():
                self._run_epoch()
                if self._in_epoch:  # ended by n_batches before the epoch's end
                    break
                self.cur_epoch_idx += 1
                self.fire("on_train_epoch_end")
                if self._evaluate_every_epochs and self.cur_epoch_idx % self._evaluate_every_epochs == 0:
                    self._evaluate()
            self._ended = "finished"
        except Preempted as exc:  # the run goes on elsewhere: its checkpoints must not say it ended
            self.fire("on_exception", exc)
        except EarlyStopException as exc:
            self._ended = "early_stopped"
            self.fire("on_exception", exc)
        except KeyboardInterrupt as exc:
            self._failed_by = exc
            self.driver.on_exception()
            self.fire("on_exception", exc)
            if not catch_keyboard_interrupt:
                # the progress display's closing line says how it stopped; without one, this line does
                end_quietly(exc, None if self._progress is not None else
                            f"training stopped at step {self.global_forward_batches} by KeyboardInterrupt (Ctrl-C)")
                raise
        except BaseException as exc:
            self._failed_by = exc
            self.driver.on_exception()
            self.fire("on_exception", exc)
            raise
        finally:
            self.fire("on_train_end")

    def _latest_checkpoint(self) -> str | None:
        """``resume_from="latest"``: the newest training checkpoint over this trainer's CheckpointCallback folders.

        None (start fresh) when there is none yet. Rank 0 decides and every rank gets its answer, so all
        ranks resume from the same checkpoint even while the folders change.
        """
        from .._callbacks import CheckpointCallback

        folders = [cb.folder for cb in self.callbacks if isinstance(cb, CheckpointCallback)]
        shadowed = os.path.exists(RESUME_LATEST)
        note = (f" (the keyword wins over the path {os.path.abspath(RESUME_LATEST)!r} that exists here; pass "
                f"resume_from='./{RESUME_LATEST}' to resume from that folder)") if shadowed else ""
        if not folders:
            raise ConfigurationError(
                f"Trainer.run(resume_from={RESUME_LATEST!r}) looks for checkpoints in the folders of the trainer's "
                "CheckpointCallback(s), and it has none; add CheckpointCallback(folder=..., every_n_batches=...) "
                f"to callbacks=, or pass resume_from=<a checkpoint folder>{note}.")
        decision: tuple[str | None, str | None] = (None, None)
        if self.driver.is_global_zero:
            try:
                decision = (newest_over_folders(folders), None)
            except Exception as exc:  # every rank must raise, not wait for a broadcast that never comes
                decision = (None, f"{type(exc).__name__}: {exc}")
        if self.driver.is_distributed():
            decision = self.driver.broadcast_object(decision, src=0)
        folder, error = decision
        if error is not None:
            raise ConfigurationError(f"resume_from={RESUME_LATEST!r}: rank 0 could not look for checkpoints in "
                                     f"{folders}: {error}")
        say = logger.warning if shadowed else logger.info  # a shadowed folder named latest should not go unseen
        if folder is None:
            say("resume_from=%r: no training checkpoint in %s yet; starting fresh%s.",
                RESUME_LATEST, ", ".join(folders), note)
        else:
            say("resume_from=%r: resuming from %s%s.", RESUME_LATEST, folder, note)
        return folder

    def _plan_length(self) -> LoopLength:
        """Work out ``n_batches`` from ``n_epochs`` (or the reverse) once the epoch length and the start are
        known; a resumed run counts from its position in this run's layout (see ``_data/position.py``)."""
        length = plan_length(requested_epochs=self._requested_n_epochs, requested_batches=self._requested_n_batches,
                             per_epoch=self.num_batches_per_epoch, epoch=self.cur_epoch_idx,
                             steps=self.global_forward_batches, start_batch=self._resume_start_batch())
        self.n_epochs, self.n_batches = length.n_epochs, length.n_batches
        return length

    def _reached_n_batches(self) -> bool:
        return self.n_batches is not None and self.global_forward_batches >= self.n_batches

    @property
    def _evaluate_every_epochs(self) -> int:
        every = self.evaluate_every
        return -every if self.evaluator is not None and isinstance(every, int) and every < 0 else 0

    def _run_epoch(self) -> None:
        """One epoch: find where it starts, announce it, run its batches, apply a cycle the data cut short."""
        self.driver.set_model_mode("train")
        start = self._take_resume_position()
        self._epoch_start_batch = self.batch_idx_in_epoch = start
        self._epoch_length = self._epoch_stop(start)
        self.fire("on_train_epoch_begin")
        self.driver.set_sampler_epoch(self.dataloader, self.cur_epoch_idx)
        skip = self._batches_to_skip(start)  # before iter(): a loader that reports its position is set back first
        iterator = iter(self.dataloader)
        for _ in range(skip):  # only for dataloaders without a reproducible sampler or a position of their own
            next(iterator, None)
        self._in_epoch = True
        data_ran_out = self._run_batches(iterator)
        # n_batches reached inside the epoch: it stays open, so a checkpoint taken now (`last`) resumes inside it
        per_epoch = self.num_batches_per_epoch
        self._in_epoch = not data_ran_out and (per_epoch is None or self.batch_idx_in_epoch < per_epoch)
        if self.accumulation_steps > 1 and self._unstepped_gradients:
            self._step_cut_short_cycle()

    def _resume_offset(self) -> tuple[ReproducibleBatchSampler, int] | None:
        """The sampler and the resumed epoch's consumed samples it continues from (None: no reproducible
        sampler, or nothing to resume inside an epoch)."""
        sampler = self._sampler
        if sampler is None or not (self._resume_batches or self._resume_samples):
            return None
        return sampler, (self._resume_samples if self._resume_samples is not None else
                         self._resume_batches * sampler.global_batch_size)

    def _resume_start_batch(self) -> int:
        """The batch of the current epoch a resumed run starts at, in this run's layout (0 for a fresh run).

        With a reproducible sampler it is re-derived from the saved global sample offset, so a checkpoint of
        another world size (another number of batches per epoch) starts at the same sample.
        """
        return self._start_batch_of(self._resume_offset())

    def _start_batch_of(self, resumed: tuple[ReproducibleBatchSampler, int] | None) -> int:
        return self._resume_batches if resumed is None else resumed[0].batch_index_at(resumed[1])

    def _take_resume_position(self) -> int:
        """Batches of this epoch a resumed run has done already (0 otherwise); used once, then cleared."""
        resumed = self._resume_offset()
        start = self._start_batch_of(resumed)
        if resumed is not None:
            resumed[0].resume(self.cur_epoch_idx, resumed[1])
        self._resume_batches, self._resume_samples = 0, None
        return start

    def _epoch_stop(self, start: int) -> int | None:
        """The batch index this epoch ends at: its length, or earlier where ``n_batches`` is reached (None: unknown)."""
        per_epoch = self.num_batches_per_epoch
        if self.n_batches is None:
            return per_epoch
        remaining = start + self.n_batches - self.global_forward_batches
        return remaining if per_epoch is None else min(per_epoch, remaining)

    def _batches_to_skip(self, start: int) -> int:
        """How many batches to read and drop to start after ``start`` (a reproducible sampler resumes by itself)."""
        saved, self._resume_loader_states = self._resume_loader_states, None
        if start == 0 or self._sampler is not None:
            return 0
        restored = restore_loader_position(self.dataloader, saved, self.driver.rank, self.driver.world_size)
        if restored is not None:
            logger.info("resumed epoch %d at batch %d from the %s's saved position: no batch re-read.",
                        self.cur_epoch_idx, start, restored)
            return 0
        warnings.warn(
            f"resuming mid-epoch without a reproducible sampler: the first {start} batches of epoch "
            f"{self.cur_epoch_idx} are read and dropped, and their order is only the same if the dataloader "
            "does not shuffle. Use a dataloader whose sampler the driver can replace, or one that reports its "
            "position (torchdata's StatefulDataLoader; a Hugging Face streaming dataset with num_workers=0), "
            "to resume without re-reading.", RuntimeWarning, stacklevel=3,
        )
        logger.info("resume: re-reading %d batch(es) of epoch %d to reach the checkpoint's position.", start,
                    self.cur_epoch_idx)
        return start

    def _run_batches(self, iterator: Iterator[Any]) -> bool:
        """The per-batch loop, in the order of events of docs/user-guide/callbacks.md; True when the data ran
        out (else the epoch's planned end was reached).

        The hot path: everything it needs is looked up once into locals, and each event
        is fired only when a handler listens to it.
        """
        fire, sampler = self.fire, self._sampler
        # The very lists handlers are appended to, so handlers added during the epoch count.
        handlers = self._handlers
        fetch_begin, fetch_end = handlers["on_fetch_data_begin"], handlers["on_fetch_data_end"]
        batch_begin, batch_end = handlers["on_train_batch_begin"], handlers["on_train_batch_end"]
        move_data_to_device = self.driver.move_data_to_device
        input_fn, batch_namer, batch_step_fn = self._input_fn, self._batch_namer, self.batch_step_fn
        every = self.evaluate_every if self.evaluator is not None else None
        every_batches = every if isinstance(every, int) and every > 0 else 0
        every_fn = every if callable(every) else None
        stop_at = self._epoch_length
        while True:
            # -- fetch
            if fetch_begin:
                fire("on_fetch_data_begin")
            try:
                batch = next(iterator)
            except StopIteration:
                return True
            self._mid_batch = True
            if fetch_end:
                fire("on_fetch_data_end")
            # -- prepare: on the device, mapped once (the step, the metrics and the callbacks see the same batch)
            batch = move_data_to_device(batch)
            if input_fn is not None:
                batch = input_fn(batch)
            if batch_namer is not None and (type(batch) is tuple or type(batch) is list):
                batch = batch_namer(batch)  # dict batches, the usual ones, skip the call
            # -- step
            if batch_begin:
                indices = None if sampler is None else sampler.batch_indices(
                    self.batch_idx_in_epoch - self._epoch_start_batch)
                fire("on_train_batch_begin", batch, indices)
            batch_step_fn(self, batch)
            self.batch_idx_in_epoch += 1
            self.global_forward_batches += 1
            self._mid_batch = False
            if batch_end:
                fire("on_train_batch_end")
            # -- evaluate when scheduled; stop at the epoch's planned end
            if (every_batches and self.global_forward_batches % every_batches == 0) or (
                    every_fn is not None and every_fn(self)):
                self._evaluate()
            if stop_at is not None and self.batch_idx_in_epoch >= stop_at:
                return False

    def _step_cut_short_cycle(self) -> None:
        """The data ran out inside an accumulation cycle (a dataloader without len): apply what was accumulated."""
        self._force_step = True
        self.step()
        self.zero_grad()
        self._force_step = False

    # ------------------------------------------------- the parts of a batch step
    _force_step = False
    _unstepped_gradients = False  # backward ran since the last optimizer step

    def _is_cycle_end(self) -> bool:
        """Whether the current batch closes its gradient-accumulation cycle (then the optimizer steps)."""
        return self._force_step or self._cycle.closes(self.batch_idx_in_epoch, self._epoch_length)

    def _cycle_size(self) -> int:
        """Number of batches in the current accumulation cycle (shorter for the last one of an epoch)."""
        return self._cycle.size(self.batch_idx_in_epoch, self._epoch_length)

    def get_no_sync_context(self) -> contextlib.AbstractContextManager:
        """The context to run a batch's forward and backward in.

        Returns:
            ``driver.no_sync()`` inside an accumulation cycle (no gradient exchange), a no-op context on
            the batch that steps.
        """
        return self._null if self.accumulation_steps == 1 or self._is_cycle_end() else self.driver.no_sync()

    def forward_backward(self, batch: Any) -> Any:
        """Compute the loss of ``batch`` and add its gradients, through the driver's fused step.

        The default batch step calls it, then :meth:`step` and :meth:`zero_grad`. The driver runs the train
        function in its precision and its framework's idiom (forward, ``loss_fn``, backward of the loss divided
        by the accumulation cycle's size for ``loss.backward()`` frameworks; one gradient transform for JAX),
        without a gradient exchange inside an accumulation cycle; ``on_before_backward`` fires between the loss
        and the backward where the driver can, ``on_after_backward`` after.

        Args:
            batch: the batch, on the device and input-mapped (as a ``batch_step_fn`` receives it).

        Returns:
            The outputs after ``output_mapping`` (with ``loss_fn``: a dict holding ``"loss"``).
        """
        if self.accumulation_steps == 1:
            cycle_size, sync = 1, True
        else:
            sync = self._is_cycle_end()
            cycle_size = self._cycle_size()
        handlers = self._handlers
        if not self._separate_backward:  # the handlers only read the loss (_check_before_backward): fire after
            outputs = self.driver.forward_backward(batch, self._train_step, cycle_size=cycle_size, sync=sync)
            if handlers["on_before_backward"]:
                self.fire("on_before_backward", outputs)
        elif handlers["on_before_backward"]:
            outputs = self.driver.forward_backward(batch, self._train_step, cycle_size=cycle_size, sync=sync,
                                                   before_backward=self._fire_before_backward)
        else:
            outputs = self.driver.forward_backward(batch, self._train_step, cycle_size=cycle_size, sync=sync)
        self._unstepped_gradients = True
        if handlers["on_after_backward"]:
            self.fire("on_after_backward")
        return outputs

    def train_step(self, batch: Any) -> Any:
        """Run the train function on ``batch`` (already input-mapped by the loop) in the driver's precision.

        The default batch step does not call it (the driver's fused :meth:`forward_backward` runs the train
        function); a subclass that overrides it or :meth:`backward` gets the two-call step back, on a driver
        whose framework can take the gradients of a loss computed before (``Capabilities.separate_backward``).

        Args:
            batch: the batch, on the device and input-mapped.

        Returns:
            The outputs after ``output_mapping``; with ``loss_fn`` a dict holding ``loss_fn(outputs, batch)``
            as ``"loss"`` beside the named outputs.
        """
        return self._train_step.call(batch)

    def backward(self, outputs: Any) -> None:
        """Backpropagate ``outputs["loss"]``, divided by the accumulation cycle's size.

        Args:
            outputs: what ``train_step`` returned: a dict (or object) with a ``loss``, or the loss itself.

        Raises:
            BatchMismatchError: the outputs hold no loss (the message suggests ``output_mapping`` or ``loss_fn``).
        """
        if self._handlers["on_before_backward"]:
            self.fire("on_before_backward", outputs)
        loss = self._train_step.loss(outputs)
        if self.accumulation_steps > 1:
            loss = loss / self._cycle_size()
        self.driver.backward(loss)
        self._unstepped_gradients = True
        if self._handlers["on_after_backward"]:
            self.fire("on_after_backward")

    def step(self) -> None:
        """Step the optimizers when the accumulation cycle ends (every batch without accumulation)."""
        if self.accumulation_steps != 1 and not self._is_cycle_end():
            return
        handlers = self._handlers
        if handlers["on_before_optimizers_step"]:
            self.fire("on_before_optimizers_step", self.driver.optimizers)
        self.driver.step()
        self._unstepped_gradients = False
        if handlers["on_after_optimizers_step"]:
            self.fire("on_after_optimizers_step", self.driver.optimizers)

    def zero_grad(self) -> None:
        """Reset gradients when the accumulation cycle ends."""
        if self.accumulation_steps != 1 and not self._is_cycle_end():
            return
        handlers = self._handlers
        if handlers["on_before_zero_grad"]:
            self.fire("on_before_zero_grad", self.driver.optimizers)
        self.driver.zero_grad()
        if handlers["on_after_zero_grad"]:
            self.fire("on_after_zero_grad", self.driver.optimizers)

    # ----------------------------------------------------------------- evaluation
    def _evaluate(self) -> dict[str, float]:
        evaluator = self.evaluator
        if evaluator is None:
            raise ConfigurationError("this trainer has no metrics/evaluate_dataloaders to evaluate with.")
        self.fire("on_evaluate_begin")
        results = evaluator.run(num_eval_batch_per_dl=getattr(self, "num_eval_batch_per_dl", -1))
        self.driver.set_model_mode("train")
        self.fire("on_evaluate_end", results)
        return results

    def evaluate(self, num_eval_batch_per_dl: int = -1) -> dict[str, float]:
        """Evaluate now with the trainer's evaluator (fires on_evaluate_begin/end).

        Args:
            num_eval_batch_per_dl: evaluate at most this many batches per dataloader (-1: all).

        Returns:
            The results, ``{"metric#element#dataloader": value}`` (``{"acc#acc#dev": 0.93}``).

        Raises:
            ConfigurationError: the trainer has no ``metrics``.
        """
        if self.evaluator is None:
            raise ConfigurationError("Trainer.evaluate(): this trainer has no metrics/evaluate_dataloaders.")
        self.num_eval_batch_per_dl = num_eval_batch_per_dl
        return self._evaluate()

    def predict(self, dataloader: Any, predict_fn: str | Callable | None = None, output_mapping: Any = None, *,
                input_mapping: Any = None, num_batches: int = -1, progress_bar: Any = _SAME_AS_TRAINER,
                save_to: str | os.PathLike | None = None, pad_value: float = -100) -> dict[str, Any]:
        """Run the model over ``dataloader`` and return ``{output name: numpy array}`` in dataset order.

        ``predict_fn``: a method name of the model or a function of the batch's values
        (default: the model's ``predict_step``, else its forward). ``input_mapping`` defaults
        to the trainer's evaluation mapping, so the model is called as in evaluation;
        ``output_mapping`` renames or reshapes outputs. In a distributed run every rank gets
        the outputs of the whole dataset. ``save_to`` streams them into a folder instead
        (see :func:`drivetrain.predict`). The display follows the trainer's ``progress_bar``
        unless one is given here (``None``: no display).

        Args:
            dataloader: the batches to predict.
            predict_fn: a model method name or a function of the batch's values.
            output_mapping: renames or reshapes the outputs.
            input_mapping: adapts each batch (default: the trainer's evaluation mapping).
            num_batches: predict at most this many batches (-1: all).
            progress_bar: a display for this call (default: the trainer's; None: none).
            save_to: a folder to stream the outputs into (read back with `load_predictions`).
            pad_value: fills the padding when batches of different lengths are stacked.

        Returns:
            ``{output name: numpy array}`` in dataset order (with ``save_to``: what `load_predictions` reads).
        """
        from .predict import Predictor

        if input_mapping is None:
            input_mapping = self.mappings.evaluate_input if self.evaluator is not None else self.mappings.train_input
        predictor = Predictor(self.driver, predict_fn=predict_fn, input_mapping=input_mapping,
                              output_mapping=output_mapping, pad_value=pad_value,
                              progress_bar=self._progress if progress_bar is _SAME_AS_TRAINER else progress_bar)
        try:
            return predictor.run(dataloader, num_batches=num_batches, save_to=save_to)
        finally:
            self.driver.set_model_mode("train")

    def monitor_value(self, results: Mapping[str, float], monitor: Any = None) -> float:
        """The value ``monitor`` picks from evaluation results, by the rules of
        [Evaluation and metrics](../user-guide/evaluation-and-metrics.md#monitor).

        Args:
            results: evaluation results, as ``evaluate()`` returns them.
            monitor: a result name, full key or ``fn(results) -> float`` (default: the trainer's).

        Returns:
            The monitored value.

        Raises:
            ConfigurationError: no monitor is set, or it matches no result (the message lists them).
        """
        monitor = self.monitor if monitor is None else monitor
        if monitor is None:
            raise ConfigurationError("no monitor is set; pass monitor= to the Trainer or the callback.")
        return find_monitor_value(results, monitor)

    # ---------------------------------------------------------------- checkpoints
    def _position(self) -> Position:
        batches = self.batch_idx_in_epoch if self._in_epoch else 0
        consumed = None
        if self._sampler is not None:
            consumed = self._sampler.consumed_samples(batches - self._epoch_start_batch) if batches else 0
        return Position(self.cur_epoch_idx, batches, self.global_forward_batches, consumed)

    def _resume_at(self, position: Position) -> None:
        """Put the loop where a checkpoint's ``position`` says; the next epoch starts after its batches."""
        self.cur_epoch_idx = position.epoch
        self.global_forward_batches = position.global_forward_batches
        self._resume_batches = position.batches_done
        self._resume_samples = position.consumed_samples

    def save_checkpoint(self, folder: str | os.PathLike, *, allow_pickle: bool = False,
                        save_frozen: bool = False) -> str:
        """Write everything needed to resume exactly into the folder ``folder`` (atomically).

        The folder holds the model, optimizer, gradient, precision and RNG states, the
        loop position, the sampler and callback states, and a manifest with a sha256
        per file. Nothing is pickled unless ``allow_pickle=True`` (then only callback
        states that are not plain data). Frozen parameters (a base under an adapter) are
        left out and fingerprinted, unless ``save_frozen=True``.

        Args:
            folder: the checkpoint folder to write (replaced atomically if it exists).
            allow_pickle: pickle callback states that are not plain data (else they are an error).
            save_frozen: also write frozen parameters.

        Returns:
            The folder's absolute path.

        Raises:
            StateEncodingError: a callback state is not plain data and ``allow_pickle`` is False.
        """
        return save_trainer(self.driver, folder, self._trainer_state(), allow_pickle, save_frozen)

    def _start_checkpoint(self, folder: str | os.PathLike, *, allow_pickle: bool = False, save_frozen: bool = False,
                          buffers: HostBuffers | None = None) -> PendingSave:
        """:meth:`save_checkpoint` whose files a worker thread writes (``CheckpointCallback(background=True)``):
        returns once the state is copied to host memory (``buffers``, reused between the caller's saves); the
        caller finishes the save with ``PendingSave.finish()`` on every rank."""
        return start_trainer_save(self.driver, folder, self._trainer_state(), allow_pickle, save_frozen, buffers)

    def _trainer_state(self) -> TrainerState:
        """Fire ``on_save_checkpoint`` and gather what a checkpoint holds beside the driver's state."""
        self.fire("on_save_checkpoint")
        return TrainerState(self._position(), self.callback_manager.states(self), self._sampler, self.dataloader,
                            self._loop_settings())

    def _loop_settings(self) -> dict[str, Any]:
        """What a checkpoint's manifest records about the run beside its position (for people reading it)."""
        failed = self._failed_by
        return {"at_batch_boundary": not self._mid_batch,
                "after_exception": None if failed is None else type(failed).__name__, "ended": self._ended,
                "n_epochs": self.n_epochs, "n_batches": self.n_batches, "accumulation_steps": self.accumulation_steps}

    def load_checkpoint(self, folder: str | os.PathLike, *, resume_training: bool = True,
                        allow_pickle: bool = False) -> None:
        """Load a checkpoint written by :meth:`save_checkpoint`, verifying every file first.

        With ``resume_training=False`` only the model and optimizer states are loaded and
        the loop starts from the beginning. Everything is read, checked and parsed before
        anything is applied, so a damaged checkpoint changes nothing.

        Args:
            folder: a folder written by ``save_checkpoint``.
            resume_training: False loads only the model and optimizer states.
            allow_pickle: accept pickled callback states (only from a checkpoint you trust).

        Raises:
            CheckpointError: the checkpoint is damaged, incomplete, or for another driver or model.
        """
        loaded = load_trainer(self.driver, folder, resume_training, allow_pickle)
        resume = loaded.resume
        if resume is None:
            self.fire("on_load_checkpoint", loaded.callback_states)
            return
        self.callback_manager.load_states(self, resume.callback_states)
        self._resume_at(resume.position)
        self._resumed = resume.resumed
        if self._sampler is not None and resume.sampler_state is not None:
            self._sampler.load_state_dict(resume.sampler_state)
        self.fire("on_load_checkpoint", loaded.callback_states)
        self._resume_loader_states = resume.loader_states
        resume.restore_processes(self.driver)

    # --------------------------------------------------------------- model files
    def save_model(self, folder: str | os.PathLike, *, save_frozen: bool = False, merge_adapters: bool = False) -> str:
        """Write the model's weights as a checkpoint folder holding ``model.safetensors`` and a manifest.

        Written like a full checkpoint (temp folder, fsync, rename; no pickle), so a crash
        never leaves a half folder under ``folder``. Returns the path of the weights file,
        which any safetensors reader can open; a driver that shards the model (``torch_fsdp``)
        has every rank write its shards instead and returns the folder (``drivetrain export``
        merges them into one file). Frozen parameters are left out (their fingerprint is kept:
        loading takes them from the model loaded into) unless ``save_frozen=True``, which writes
        a file that holds the whole model. ``merge_adapters=True`` writes the whole model with its
        adapters (peft LoRA) folded into the base weights, under the base model's names, and the
        base's ``config.json``: a folder ``from_pretrained`` reads, without peft.

        Args:
            folder: the folder to write.
            save_frozen: also write frozen parameters.
            merge_adapters: write the whole model with its adapters folded into the base weights.

        Returns:
            The path of the weights file (a sharding driver: the folder).
        """
        return save_model(self.driver, folder, save_frozen, merge_adapters, saved=lambda: self.fire("on_save_model"))

    def load_model(self, folder: str | os.PathLike, *, name_map: Any = None, source_driver: str | None = None) -> None:
        """Load the weights of a folder written by :meth:`save_model` or :meth:`save_checkpoint`.

        The folder's checksums are verified first. A bare ``.safetensors`` file (from
        another tool, or ``drivetrain export``) is accepted too; it has no manifest to verify against.
        A folder or exported file written by another framework's driver is moved into this model's
        layout by both backends' declared rules (paddle's transposed Linear weights, BatchNorm
        statistics' names) once every name and shape matches. A file that does not say which
        framework wrote it is read in this driver's layout unless ``source_driver`` names another.

        Args:
            folder: a model or checkpoint folder, or a ``.safetensors`` file.
            name_map: renames for a file whose module names differ from this model's: a dict of module path
                or tensor name in the file to the one in this model, or a function of the name.
            source_driver: the driver whose layout a file without drivetrain's metadata is in (``"torch"``
                for a Hugging Face ``model.safetensors``).

        Raises:
            CheckpointError: a checksum, a name or a shape does not match; nothing is loaded then.
        """
        load_weights_into(self.driver, folder, name_map, source_driver)
        self.fire("on_load_model")

    @property
    def best_checkpoint(self) -> str | None:
        """The folder (absolute path) of the best top-k checkpoint, or None when there is none yet.

        It belongs to the first CheckpointCallback in ``callbacks=`` with ``topk >= 1`` and is ranked by
        that callback's monitor and direction (another callback's best: its own ``best_checkpoint``). It
        counts the checkpoints saved in this run and those a loaded checkpoint listed, so it holds after a
        resume; every rank of a distributed run holds the same one.
        """
        from .._callbacks import best_checkpoint

        return best_checkpoint(self)

    def load_best_model(self) -> str:
        """Load the weights of :attr:`best_checkpoint` into the model (as :meth:`load_model`); returns its folder.

        A :class:`ConfigurationError` names the fix when no CheckpointCallback keeps top-k checkpoints or
        none is saved yet. In a distributed run every rank calls it and loads the folder rank 0 names.
        ``CheckpointCallback(topk=k, load_best_model_at_end=True)`` does this when training ends.

        Returns:
            The folder loaded from.

        Raises:
            ConfigurationError: no CheckpointCallback keeps top-k checkpoints, or none is saved yet.
        """
        from .._callbacks import load_best_model

        return load_best_model(self)


def _backend_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``<driver>_kwargs`` dicts; any other unknown keyword is a misspelt argument."""
    backend_kwargs, unknown = split_backend_kwargs(kwargs)
    if unknown:
        raise unknown_arguments_error(
            "Trainer", unknown, parameter_names(Trainer.__init__),
            "Framework options go in '<driver>_kwargs' dicts (e.g. torch_kwargs={...}).")
    return backend_kwargs
