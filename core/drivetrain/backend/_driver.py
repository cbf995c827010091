"""The Driver contract: everything the framework-agnostic core asks of a backend.

The core never touches a tensor itself; it calls these methods. Public methods
that need validation are implemented here once and delegate to small ``_do_*``
hooks; a backend overrides the abstract methods and whichever defaults do not
fit. Capabilities are declared data (:class:`Capabilities`), never probed with
``hasattr`` in the loop.
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._common import DriverError, DrivetrainError, public_name
from .._data import check_not_data
from .._format import TensorEntry, safetensors_writer
from .._mapping import auto_param_call, explain_call_failure

if TYPE_CHECKING:
    from .._format import ShardSource, StateShards
    from ._model_step import ModelStep

CONTRACT_VERSION = 1
"""Version of this contract; a backend declares the versions it implements."""



@dataclass(frozen=True)
class Capabilities:
    """What a driver can do, declared up front so the core can check inputs early.

    Args:
        precisions: precisions accepted at all (one may still be slow or a no-op on some devices).
        distributed: distributed modes, e.g. ``("ddp",)``; empty for a single-process-only backend.
        devices: device kinds understood, e.g. ``("cpu", "cuda")``.
        notes: free-form honest remarks shown by ``drivetrain backends`` (``{"fp16": "a no-op on CPU"}``).
        separate_backward: whether the framework can take the gradients of a loss computed earlier
            (``loss.backward()``). False for one that computes a loss and its gradients in one call (JAX's
            ``value_and_grad``): its driver overrides :meth:`Driver.forward_backward` and leaves
            :meth:`Driver.backward` alone, and the Trainer refuses what needs the loss between the forward and
            the backward (an ``on_before_backward`` handler, a subclass overriding ``train_step``/``backward``).
    """

    precisions: tuple[str, ...] = ("fp32",)
    distributed: tuple[str, ...] = ()
    devices: tuple[str, ...] = ("cpu",)
    notes: Mapping[str, str] = field(default_factory=dict)
    separate_backward: bool = True


class Driver(abc.ABC):
    """Drives one model of one framework for the Trainer and the Evaluator.

    A driver is built by its backend's factory with the user's model, device and
    options; the Trainer then calls :meth:`setup` once and uses the rest on the
    hot path, so implementations keep per-batch methods lean.

    Args:
        model: the user's model, an object of the driver's framework.
        precision: ``"fp32"``, ``"fp16"`` or ``"bf16"``; one of ``capabilities.precisions``.
        grad_clip: clip gradients at this value in :meth:`step` (None: no clipping).
        grad_clip_type: ``"norm"`` (global norm) or ``"value"`` (each element).
        model_wo_auto_param_call: True passes a batch to the model as one argument instead of matching a dict
            batch's keys to parameter names.

    Raises:
        DriverError: a precision the driver does not declare, a ``grad_clip`` that is not a positive number, or
            an unknown ``grad_clip_type``.
    """

    name: str = "abstract"
    capabilities: Capabilities = Capabilities()
    default_forward_name: str = "forward"
    """Name of the framework's forward method (``forward`` in torch, ``execute`` in jittor)."""
    checkpoint_format: str | None = None
    """The driver name checkpoints are written and accepted under when several drivers share one format (the
    torch FSDP driver writes and reads the torch drivers' ``"torch"`` checkpoints); None: :attr:`name`."""
    grad_norm: Any = None
    """The total gradient norm the last :meth:`step` computed while clipping by norm (None otherwise); the run
    recorder takes it (and sets it back to None) to log ``train/grad_norm``."""
    shards_state: bool = False
    """True when the model and optimizer state live in pieces across the processes (FSDP, ZeRO) and checkpoints
    are written by every rank in parallel from :meth:`state_shards`, with nothing gathered. False: rank 0 writes
    :meth:`model_state` and :meth:`optimizer_states` whole (after :meth:`gathering_state`)."""
    reads_state_shards: bool = False
    """True when :meth:`load_state_shards` can load a sharded checkpoint (at any world size, resharding)."""

    def __init__(
        self,
        model: Any,
        *,
        precision: str = "fp32",
        grad_clip: float | None = None,
        grad_clip_type: str = "norm",
        model_wo_auto_param_call: bool = False,
    ) -> None:
        if precision not in self.capabilities.precisions:
            raise DriverError(
                f"precision={precision!r} is not supported by driver {self.name!r}; "
                f"accepted: {', '.join(self.capabilities.precisions)}."
            )
        if grad_clip is not None and (isinstance(grad_clip, bool) or not isinstance(grad_clip, (int, float))
                                      or grad_clip <= 0):
            raise DriverError(f"grad_clip={grad_clip!r} must be a positive number or None.")
        if grad_clip_type not in ("norm", "value"):
            raise DriverError(f"grad_clip_type={grad_clip_type!r} is not accepted; use 'norm' or 'value'.")
        self.model = model
        self.precision = precision
        self.grad_clip = grad_clip
        self.grad_clip_type = grad_clip_type
        self.model_wo_auto_param_call = model_wo_auto_param_call
        self.optimizers: list[Any] = []

    # ------------------------------------------------------------------ lifecycle
    def configure_loop(self, *, accumulation_steps: int, train_dataloader: Any = None) -> None:
        """The Trainer's loop settings, given once before :meth:`setup`: a driver whose engine needs them (DeepSpeed's
        ``gradient_accumulation_steps`` and micro-batch size) checks and takes them here, so a contradiction fails
        when the Trainer is built. This is the one place a driver learns which dataloader trains:
        :meth:`set_dist_repro_dataloader` also receives evaluation and prediction dataloaders, whose batch sizes
        may differ, and at a world of one it cannot tell them apart. Default: nothing.

        Args:
            accumulation_steps: the Trainer's ``accumulation_steps``.
            train_dataloader: the Trainer's ``train_dataloader``, as the user gave it.
        """

    def setup(self) -> None:
        """Move the model to its device and prepare anything that needs the process group."""

    def on_exception(self) -> None:
        """Called when the loop raises, before callbacks see the exception (e.g. to abort peers)."""

    def is_distributed(self) -> bool:
        """Whether this driver runs one process of several (the collectives below then communicate).

        Returns:
            True in a run of several processes.
        """
        return False

    @property
    def rank(self) -> int:
        """This process's index among all processes of the run (0 without distribution)."""
        return 0

    @property
    def local_rank(self) -> int:
        """This process's index among the processes of its machine (picks its GPU)."""
        return 0

    @property
    def world_size(self) -> int:
        """How many processes the run has."""
        return 1

    @property
    def is_global_zero(self) -> bool:
        """Whether this is rank 0, the process that writes files and prints (checkpoints, logs, bars)."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every process; a no-op for a single process."""

    # ---------------------------------------------------------------------- model
    def get_model_call_fn(self, fn_name: str | None, default: str = "train_step") -> tuple[Callable, Callable]:
        """Resolve the function the loop calls with each batch.

        Returns ``(fn, signature_fn)``: ``fn`` is what gets called, ``signature_fn``
        is the function whose parameters auto-matching reads (they differ when
        ``fn`` is the module's ``__call__``, which runs framework hooks, and the
        parameters live on ``forward``). ``fn_name=None`` means ``default`` if the
        model has it, else the framework's forward.

        Args:
            fn_name: the model method the user named (``train_fn``/``evaluate_fn``), or None.
            default: the method used when the model has it and ``fn_name`` is None.

        Returns:
            ``(fn, signature_fn)``.

        Raises:
            DriverError: the model has no method ``fn_name``, or neither ``default`` nor a forward.
        """
        model = self.unwrap_model()
        if fn_name is not None:
            fn = getattr(model, fn_name, None)
            if not callable(fn):
                raise DriverError(
                    f"train_fn/evaluate_fn={fn_name!r}: the model {type(model).__name__} has no method "
                    f"{fn_name!r}; define it or pass None to use {default!r} or {self.default_forward_name!r}."
                )
            return fn, fn
        fn = getattr(model, default, None)
        if callable(fn):
            return fn, fn
        forward = getattr(model, self.default_forward_name, None)
        if not callable(forward):
            raise DriverError(
                f"The model {type(model).__name__} has neither {default!r} nor {self.default_forward_name!r}."
            )
        return self._wrapped_model_call(), forward

    def _wrapped_model_call(self) -> Callable:
        """The callable that runs the forward through the framework's hooks (``model.__call__``)."""
        return self.model

    def model_call(self, batch: Any, fn: Callable, signature_fn: Callable | None) -> Any:
        """Call ``fn`` with ``batch``: matched by parameter name when the batch is a dict.

        Args:
            batch: the batch, on the device.
            fn: what :meth:`get_model_call_fn` returned first.
            signature_fn: the function whose parameters name the batch keys to pass (None: ``fn``).

        Returns:
            What ``fn`` returned.

        Raises:
            BatchMismatchError: the batch does not fit ``fn`` (a missing key, numpy arrays where tensors belong).
        """
        try:
            # type() first: the ABC check of isinstance(batch, Mapping) costs more than the call it guards
            if (type(batch) is dict or isinstance(batch, Mapping)) and not self.model_wo_auto_param_call:
                return auto_param_call(fn, batch, signature_fn=signature_fn)
            return fn(batch)
        except (TypeError, AttributeError, ValueError) as exc:  # the framework's error about a batch it cannot take
            explained = self._explain_call_failure(batch, fn, signature_fn, exc)
            if explained is None:
                raise
            raise explained from exc

    def _explain_call_failure(self, batch: Any, fn: Callable, signature_fn: Callable | None,
                              exc: Exception) -> Exception | None:
        """The error naming the batch's fault when ``fn(batch)`` failed because of it (numpy arrays where
        tensors belong, a tuple batch for a one-parameter forward), else None; runs only after a failure."""
        if isinstance(exc, DrivetrainError):
            return None
        knows_tensors = type(self).is_tensor is not Driver.is_tensor  # the default cannot tell a tensor
        return explain_call_failure(batch, fn, signature_fn, exc, driver_name=self.name,
                                    is_tensor=self.is_tensor if knows_tensors else None,
                                    to_tensor_example=getattr(self, "to_tensor_example", None))

    @abc.abstractmethod
    def set_model_mode(self, mode: str) -> None:
        """Switch the model to training or evaluation behaviour (dropout, batch-norm statistics).

        Args:
            mode: ``"train"`` or ``"eval"``.
        """

    def no_grad(self) -> contextlib.AbstractContextManager:
        """Context in which no gradient is recorded (evaluation).

        Returns:
            A context manager.
        """
        return contextlib.nullcontext()

    def auto_cast(self) -> contextlib.AbstractContextManager:
        """Context that runs the forward in the driver's precision.

        Returns:
            A context manager (a no-op in fp32).
        """
        return contextlib.nullcontext()

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Context in which backward does not synchronise gradients across processes.

        Returns:
            A context manager (a no-op for one process).
        """
        return contextlib.nullcontext()

    def unwrap_model(self) -> Any:
        """The user's model, without any distributed or compilation wrapper.

        Returns:
            The model the user passed.
        """
        return self.model

    # --------------------------------------------------------------- optimisation
    def set_optimizers(self, optimizers: Any) -> None:
        """Accept one optimizer or a sequence of them; each is checked by :meth:`_check_optimizer`.

        Args:
            optimizers: None, one optimizer, or a list or tuple of them.

        Raises:
            DriverError: an optimizer this driver cannot use (the message says which and why).
        """
        if optimizers is None:
            self.optimizers = []
            return
        items = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        for i, opt in enumerate(items):
            where = "optimizers" if len(items) == 1 else f"optimizers[{i}]"
            if isinstance(opt, type):  # the class, not an optimizer made from it
                example = getattr(self, "optimizer_example", None) or "an optimizer over model.parameters()"
                raise DriverError(f"{where}={public_name(opt)} is a class, not an optimizer; create one from the "
                                  f"model's parameters, e.g. {example}.")
            problem = self._check_optimizer(opt)
            if problem:
                raise DriverError(f"{where}={public_name(type(opt))}: {problem}")
        self.optimizers = items

    def _check_optimizer(self, optimizer: Any) -> str | None:
        """Return why ``optimizer`` cannot be used by this driver, or None."""
        return None

    def forward_backward(self, batch: Any, step: ModelStep, *, cycle_size: int = 1, sync: bool = True,
                         before_backward: Callable[[Any], None] | None = None) -> Any:
        """Compute the loss of one training batch and add its gradients, in the framework's own idiom.

        The default is the path of frameworks with ``loss.backward()``: ``outputs = step.call(batch)`` (the train
        function in this driver's precision, the output mapping, ``loss_fn``), ``before_backward(outputs)`` (the
        ``on_before_backward`` event: a callback may replace ``outputs["loss"]``), the loss divided by
        ``cycle_size``, then :meth:`backward`, inside :meth:`no_sync` unless ``sync``. A framework that computes a
        loss and its gradients in one call overrides this (calling ``step.fn`` inside its gradient transform),
        declares ``Capabilities(separate_backward=False)``, and never receives a ``before_backward``.

        Args:
            batch: the batch, on the device, input-mapped and named.
            step: the train function, its mappings and ``loss_fn`` (:class:`ModelStep`).
            cycle_size: batches in this gradient-accumulation cycle; the gradients added are those of
                ``loss / cycle_size`` so a cycle's sum is the mean (1: no division, and no division is done).
            sync: False inside an accumulation cycle: gradients need not be exchanged between processes yet
                (they are on the cycle's last batch, where ``sync`` is True).
            before_backward: called with the outputs between the loss and the backward; None when no callback
                listens.

        Returns:
            The outputs (``step.call``'s), for the batch's callbacks and records.
        """
        if not sync:  # the same batch, inside no_sync (the default's own body, not a subclass's override)
            with self.no_sync():
                return Driver.forward_backward(self, batch, step, cycle_size=cycle_size,
                                               before_backward=before_backward)
        outputs = step.call(batch)
        if before_backward is not None:
            before_backward(outputs)
        loss = step.loss(outputs)
        if cycle_size > 1:
            loss = loss / cycle_size
        self.backward(loss)
        return outputs

    def backward(self, loss: Any) -> None:
        """Accumulate gradients of ``loss`` (already divided for accumulation by the core).

        Every driver whose framework has ``loss.backward()`` implements it; the default
        :meth:`forward_backward` calls it. A driver that computes gradients in
        :meth:`forward_backward` (``Capabilities(separate_backward=False)``) leaves it: it
        then says why a loss computed outside that call has no gradients here.

        Args:
            loss: the framework's scalar loss tensor.

        Raises:
            DriverError: this driver computes gradients only in :meth:`forward_backward`.
        """
        raise DriverError(
            f"the {self.name} driver computes the loss and its gradients in one call (forward_backward), so it "
            "cannot take the gradients of a loss computed before; call trainer.forward_backward(batch) in a "
            "batch_step_fn instead of trainer.backward(trainer.train_step(batch))."
        )

    @abc.abstractmethod
    def step(self) -> None:
        """Clip gradients if asked, then step every optimizer (and the grad scaler).

        When it clips by norm, set :attr:`grad_norm` to the total gradient norm before
        clipping, as the framework computed it (a framework scalar is fine: it is read only
        when the run record logs it).
        """

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Reset the gradients of every optimizer's parameters."""

    def get_lrs(self) -> list[list[float]]:
        """The learning rate of every param group: one list per optimizer (in order), one float per group.

        The core's learning-rate schedules read the base rates with it. The default
        raises: only a schedule asks for it.

        Returns:
            ``[[rate of each param group] for each optimizer]``.

        Raises:
            DriverError: the backend does not implement it.
        """
        raise DriverError(
            f"driver {self.name!r} ({type(self).__qualname__}) cannot read learning rates: its backend does not "
            "implement Driver.get_lrs()/set_lrs(). Ask the backend's author to add them, or step the framework's "
            "own scheduler with LRSchedulerCallback instead."
        )

    def set_lrs(self, lrs: list[list[float]]) -> None:
        """Set the learning rate of every param group; ``lrs`` is shaped as :meth:`get_lrs` returns it.

        Called by schedules before the first optimizer step and after every one, so keep it
        cheap. Refuse a wrongly shaped ``lrs`` with a :class:`DriverError` (the helper
        ``drivetrain.backend.check_lrs`` does it). The default raises, like :meth:`get_lrs`.

        Args:
            lrs: ``[[rate of each param group] for each optimizer]``.

        Raises:
            DriverError: ``lrs`` is shaped wrongly, or the backend does not implement it.
        """
        raise DriverError(
            f"driver {self.name!r} ({type(self).__qualname__}) cannot set learning rates: its backend does not "
            "implement Driver.get_lrs()/set_lrs(). Ask the backend's author to add them, or step the framework's "
            "own scheduler with LRSchedulerCallback instead."
        )

    # ----------------------------------------------------------------------- data
    @abc.abstractmethod
    def move_data_to_device(self, batch: Any) -> Any:
        """Move every tensor of a nested dict/list/tuple/dataclass batch to the model's device.

        Args:
            batch: the batch as the dataloader yielded it.

        Returns:
            The same structure with every tensor on the device.
        """

    @abc.abstractmethod
    def tensor_to_numpy(self, tensor: Any) -> np.ndarray:
        """Detach and copy a framework tensor into a numpy array (bf16 becomes float32).

        Args:
            tensor: a tensor of this framework.

        Returns:
            A numpy array holding a copy of its values.
        """

    def scalars_to_numpy(self, values: list[Any]) -> np.ndarray:
        """Single-value tensors (a logged window's losses, gradient norms) as one float64 array of their values.

        Read once per logged window, never per batch. The default converts them one by one; a
        backend overrides it to stack them on the device and copy them to the host in one read.

        Args:
            values: single-value tensors or numbers.

        Returns:
            A float64 array, one value per item.
        """
        return np.array([_single(value if isinstance(value, (int, float, np.ndarray, np.number))
                                 else self.tensor_to_numpy(value)) for value in values], dtype=np.float64)

    def is_tensor(self, obj: Any) -> bool:
        """Whether ``obj`` is a tensor of this framework (used to convert outputs for metrics).

        Args:
            obj: any object.

        Returns:
            True for a tensor of this framework.
        """
        return False

    def check_dataloader_legality(self, dataloader: Any, argument: str = "train_dataloader") -> None:
        """Raise a :class:`DriverError` naming ``argument`` when ``dataloader`` cannot be iterated, or is the data
        itself (an array, a tensor of this framework, a dict of them: the fix names the framework's dataloader).

        Args:
            dataloader: what the user passed as a dataloader.
            argument: the argument's name for the message (``"train_dataloader"``, ``"evaluate_dataloaders['dev']"``).

        Raises:
            DriverError: the dataloader cannot be used.
        """
        check_not_data(dataloader, argument, self)
        if not isinstance(dataloader, (Iterator, Mapping)) and not hasattr(dataloader, "__iter__"):
            raise DriverError(
                f"{argument}={type(dataloader).__name__} is not iterable; pass a dataloader or any iterable of batches."
            )

    def set_dist_repro_dataloader(self, dataloader: Any, *, dist: str | None, reproducible: bool) -> Any:
        """Return the dataloader to iterate instead of ``dataloader``.

        ``dist``: None (one process, or the user shards the data), ``"train"`` (each rank
        its share of every global batch: :class:`~drivetrain.ReproducibleBatchSampler`
        with ``num_replicas``/``rank``) or ``"eval"`` (each sample once across ranks:
        ``UnrepeatedBatchSampler``). ``reproducible``: order fixed by a saved seed and
        resumable mid-epoch. A dataloader whose sampling cannot be replaced is returned
        as is (training) or refused with a message saying what to do (``dist`` set).

        Args:
            dataloader: the user's dataloader.
            dist: None, ``"train"`` or ``"eval"``, as above.
            reproducible: install a resumable, seeded order.

        Returns:
            The dataloader to iterate (``dataloader`` itself when nothing changes).

        Raises:
            DriverError: ``dist`` is set and the dataloader's sampling cannot be replaced.
        """
        return dataloader

    def set_sampler_epoch(self, dataloader: Any, epoch: int) -> None:
        """Tell the dataloader's samplers which epoch starts (shuffling differs per epoch).

        Args:
            dataloader: the dataloader about to be iterated.
            epoch: the epoch's index (0-based).
        """
        for attr in ("sampler", "batch_sampler"):
            set_epoch = getattr(getattr(dataloader, attr, None), "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    # ---------------------------------------------------------------- collectives
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank (a picklable Python object; every rank calls it).

        Args:
            obj: the object (only rank ``src``'s is used).
            src: the rank whose object is sent.

        Returns:
            Rank ``src``'s object.
        """
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (every rank calls it).

        Args:
            obj: this rank's picklable object.

        Returns:
            A list of every rank's object, in rank order.
        """
        return [obj]

    def all_reduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce a numpy array across processes (``sum``, ``max``, ``min``); metrics use it.

        Args:
            array: this process's values.
            op: ``"sum"``, ``"max"`` or ``"min"``.

        Returns:
            The reduced array, of the same shape, on every process.

        Raises:
            DriverError: an unknown ``op``.
        """
        if op not in ("sum", "max", "min"):
            raise DriverError(f"all_reduce op={op!r} is not accepted; use 'sum', 'max' or 'min'.")
        return array

    # ---------------------------------------------------------------------- state
    @abc.abstractmethod
    def model_state(self) -> dict[str, Any]:
        """The model's parameters and buffers as a flat ``{name: framework tensor}`` dict.

        The tensors may be the live ones (views, no copy): checkpoints write them straight
        to disk, and a caller that keeps them across training steps copies them itself.

        Returns:
            ``{name: tensor}`` of every parameter and buffer.
        """

    @abc.abstractmethod
    def load_model_state(self, state: Mapping[str, Any]) -> None:
        """Load a dict produced by :meth:`model_state` or :meth:`load_tensors`; names must match.

        Args:
            state: ``{name: tensor}`` as :meth:`model_state` returns it.

        Raises:
            DriverError: names or shapes differ from the model's (nothing is loaded then).
        """

    def frozen_parameter_names(self) -> frozenset[str]:
        """The :meth:`model_state` names of the parameters that do not train (``requires_grad=False``,
        ``stop_gradient``, ``stop_grad``: a frozen base under a LoRA adapter, a frozen encoder).

        Checkpoints and ``save_model`` leave them out and keep a fingerprint instead (loading takes them from
        the model loaded into, once they match it). Default: none, so every parameter is saved.

        Returns:
            The names of the frozen parameters.
        """
        return frozenset()

    def module_classes(self) -> dict[str, tuple[str, ...]]:
        """``{module path: class names}`` for every module of the model (``""`` for the model itself), each with
        its class's name first and then its base classes' (``("Linear", "Module")``).

        Moving weights between frameworks reads it: a backend's layout rule may apply to the tensors of some
        module classes only (paddle's ``Linear`` weights are stored transposed), and save_model records it so
        that a reader without the model knows the classes too. Default: none known, so such rules refuse
        to guess.

        Returns:
            ``{module path: (class name, base class names...)}``; empty when unknown.
        """
        return {}

    def companion_files(self, *, save_frozen: bool, merged: bool = False) -> dict[str, Any]:
        """Files a ``save_model`` folder holds beside drivetrain's own, so that the model's own library reads
        the folder (the torch driver writes a peft model's ``adapter_model.safetensors`` and
        ``adapter_config.json``; ``merged``: beside :meth:`merged_adapter_state`'s weights, a Hugging Face
        model's ``config.json``): ``{file name: bytes, or tensors as from tensor_file}``, written atomically
        with the folder and checksummed in its manifest. Default: none.

        Args:
            save_frozen: whether the folder also holds the frozen parameters.
            merged: whether the folder holds the merged weights (``save_model(merge_adapters=True)``).

        Returns:
            ``{file name: bytes or tensors}``, empty by default.
        """
        return {}

    def merged_adapter_state(self) -> dict[str, Any] | None:
        """The model's weights with its adapters folded into the base weights, under the base model's own
        names (what peft's ``merge_and_unload`` leaves), computed without changing the model; None when the
        model has no adapter. ``save_model(folder, merge_adapters=True)`` writes it. Default: None.

        Returns:
            ``{name: tensor}`` of the merged model, or None.
        """
        return None

    def tensor_buffer(self, tensor: Any) -> tuple[str, tuple[int, ...], memoryview]:
        """One tensor as ``(dtype, shape, data)`` for the core's safetensors writer.

        ``dtype`` is the safetensors tag (``"F32"``, ``"BF16"``, ``"I64"``, ``"BOOL"``, ...),
        ``data`` a C-contiguous byte view of the tensor's values on the CPU that keeps
        their memory alive. Copy only where needed (another device, non-contiguous): the
        core writes each view straight into the file, so saving costs one write of the
        data rather than a serialised copy first. Tensors sharing memory (tied weights)
        need nothing special: each is written in full. Raise a :class:`DriverError` worded
        to follow the tensor's name (``"is a float, not a torch tensor; ..."``): the core
        puts the name in front. numpy arrays can use ``drivetrain.backend.array_buffer``.

        The default raises: a driver without it cannot save tensors.

        Args:
            tensor: a tensor of this framework.

        Returns:
            ``(dtype tag, shape, byte view)``.

        Raises:
            DriverError: ``tensor`` is not a tensor this driver can save.
            NotImplementedError: the backend does not implement it.
        """
        raise NotImplementedError(
            f"driver {self.name!r} ({type(self).__qualname__}) does not implement tensor_buffer(); implement it to "
            "save tensors."
        )

    def tensor_file(self, tensors: Mapping[str, Any]) -> list[TensorEntry]:
        """A flat ``{name: tensor}`` dict the way the core writes it to disk: ``(name, dtype, shape, data)`` of each
        tensor from :meth:`tensor_buffer`, streamed into the file.

        Args:
            tensors: ``{name: tensor}``.

        Returns:
            Entries to stream into a safetensors file.

        Raises:
            DriverError: a name is not a string or a value not a tensor (the message names it).
        """
        if not isinstance(tensors, Mapping):
            raise DriverError(f"save_tensors(tensors={type(tensors).__name__}) needs a dict of name -> tensor.")
        entries: list[TensorEntry] = []
        for name, tensor in tensors.items():
            if not isinstance(name, str):
                raise DriverError(f"save_tensors: key {name!r} is a {type(name).__name__}; tensor names must be str.")
            try:
                dtype, shape, data = self.tensor_buffer(tensor)
            except DriverError as exc:
                raise DriverError(f"save_tensors: {name!r} {exc}") from exc
            entries.append((name, dtype, shape, data))
        return entries

    @abc.abstractmethod
    def tensors_from_bytes(self, data: bytes) -> dict[str, Any]:
        """Parse safetensors bytes (a file :meth:`save_tensors` wrote) into CPU tensors; never executes code.

        Args:
            data: a safetensors file's bytes.

        Returns:
            ``{name: CPU tensor}``.
        """

    def save_tensors(self, tensors: Mapping[str, Any], path: str) -> None:
        """Write ``tensors`` as the safetensors file ``path``, straight from the tensors' memory.

        Args:
            tensors: ``{name: tensor}``.
            path: the file to write.

        Raises:
            DriverError: a name is not a string or a value not a tensor.
        """
        safetensors_writer.save(os.fspath(path), self.tensor_file(tensors))

    def load_tensors(self, path: str) -> dict[str, Any]:
        """Read a file written by :meth:`save_tensors`.

        Args:
            path: a safetensors file.

        Returns:
            ``{name: CPU tensor}``.

        Raises:
            DriverError: the file is not readable safetensors.
        """
        with open(path, "rb") as f:
            data = f.read()
        try:
            return self.tensors_from_bytes(data)
        except Exception as exc:
            raise DriverError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc}).") from exc

    @abc.abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's random generators.

        Args:
            seed: the seed, an int in ``[0, 2**32)``.
        """

    # ------------------------------------------------- training state (checkpoints)
    # Nested structures below may hold framework tensors anywhere (``is_tensor`` finds
    # them); the core stores those tensors with ``save_tensors`` and the rest as JSON.
    def gathering_state(self) -> contextlib.AbstractContextManager:
        """Entered by every process around a save, before rank 0 alone reads :meth:`model_state` and
        :meth:`optimizer_states`. A driver whose state is sharded over the processes gathers it here (a
        collective every process joins) and serves rank 0 that copy until the context exits; default: nothing.

        Returns:
            A context manager every process enters.
        """
        return contextlib.nullcontext()

    def optimizer_states(self) -> list[Any]:
        """One nested state per optimizer, in order; names must survive rebuilding the model.

        Returns:
            A list of plain nested states, one per optimizer.
        """
        return [self._optimizer_state(opt, f"optimizer_states()[{i}]") for i, opt in enumerate(self.optimizers)]

    def load_optimizer_states(self, states: list[Any]) -> None:
        """Check the list against the optimizers, then load each state into the optimizer at its position.

        Args:
            states: what :meth:`optimizer_states` returned.

        Raises:
            DriverError: the list's length or a state does not fit the optimizers.
        """
        if not isinstance(states, (list, tuple)):
            raise DriverError(
                f"load_optimizer_states(states={type(states).__name__}) needs the list optimizer_states() returns."
            )
        if len(states) != len(self.optimizers):
            raise DriverError(
                f"the checkpoint holds {len(states)} optimizer state(s) but the trainer has {len(self.optimizers)} "
                "optimizer(s); pass the same optimizers as the run that saved it."
            )
        for i, (opt, state) in enumerate(zip(self.optimizers, states, strict=True)):
            self._load_optimizer_state(opt, state, f"optimizer_states[{i}]")

    def _optimizer_state(self, optimizer: Any, where: str) -> Any:
        """One optimizer's state (``where`` names it in errors); override to key it by parameter name."""
        return optimizer.state_dict()

    def _load_optimizer_state(self, optimizer: Any, state: Any, where: str) -> None:
        """Load what :meth:`_optimizer_state` returned into ``optimizer``."""
        optimizer.load_state_dict(state)

    @abc.abstractmethod
    def gradient_state(self) -> dict[str, Any]:
        """Accumulated gradients by parameter name (only those that exist), so a checkpoint taken
        inside an accumulation cycle resumes exactly.

        Returns:
            ``{parameter name: gradient tensor}``.
        """

    @abc.abstractmethod
    def load_gradient_state(self, grads: Mapping[str, Any]) -> None:
        """Set the gradients saved by :meth:`gradient_state`; parameters absent from ``grads`` get none.

        Args:
            grads: what :meth:`gradient_state` returned.
        """

    def precision_state(self) -> Any:
        """State of the mixed-precision machinery (e.g. the grad scaler), or None.

        Returns:
            Plain nested data, or None when there is nothing to keep.
        """
        return None

    def load_precision_state(self, state: Any) -> None:
        """Restore what :meth:`precision_state` returned.

        Args:
            state: what :meth:`precision_state` returned.
        """

    @abc.abstractmethod
    def rng_state(self) -> dict[str, Any]:
        """The framework's random generator states (CPU and every device); python's and numpy's
        global generators are captured by the core.

        Returns:
            ``{generator name: state}``.
        """

    @abc.abstractmethod
    def load_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned.

        Args:
            state: what :meth:`rng_state` returned.
        """

    def state_shards(self, *, optimizers: bool) -> StateShards:
        """Every rank, when :attr:`shards_state`: this rank's pieces of the model and (``optimizers=True``, a
        training checkpoint; False for ``save_model``) optimizer states.

        A collective (every rank calls it at the same point). Model weights go under the keys
        ``model/<name>``, with ``<name>`` as in :meth:`model_state`; each piece says where it sits in
        the full tensor (``ShardPiece(tensor, offsets, full shape)``); a tensor every rank holds whole is
        given by rank 0 only. ``meta`` carries plain data (optimizer hyper-parameters, ...).

        Args:
            optimizers: include the optimizer states (a training checkpoint) or not (``save_model``).

        Returns:
            This rank's `StateShards`.

        Raises:
            DriverError: the driver does not shard its state (the default).
        """
        raise DriverError(
            f"driver {self.name!r} does not shard its state (shards_state=False): rank 0 writes its checkpoints "
            "whole from model_state() and optimizer_states()."
        )

    def load_state_shards(self, source: ShardSource, *, optimizers: bool) -> None:
        """Load a sharded checkpoint (``optimizers=False``: the weights only) whatever world size wrote it.

        For each tensor this rank holds, ``source.reads(key, offsets, sizes)`` says which stored slices fill
        it. Check every key and shape (``source.model_keys()``, ``source.shape``) before copying anything, so
        a mismatch loads nothing. Every rank calls it.

        Args:
            source: the checkpoint's pieces, as a `ShardSource`.
            optimizers: also load the optimizer states.

        Raises:
            CheckpointError: a key or shape does not fit, or the driver cannot read sharded checkpoints.
        """
        from .._format import cannot_read_shards

        raise cannot_read_shards(self.name, source)

    def framework_version(self) -> str:
        """Version of the framework, recorded in checkpoint manifests.

        Returns:
            The version string (``"unknown"`` by default).
        """
        return "unknown"

    # ----------------------------------------------------------------- describing
    def describe(self) -> str:
        """One line naming the driver, its class and settings, for logs and ``repr``.

        Returns:
            The line, e.g. ``"torch driver (TorchDriver) precision=fp32"``.
        """
        return f"{self.name} driver ({type(self).__qualname__}) precision={self.precision}"


def _single(value: Any) -> float:
    """The value of a single-value array or number (the mean, for a loss that was not reduced)."""
    array = np.asarray(value)
    return float(array.item() if array.size == 1 else array.mean())
