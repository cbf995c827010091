"""Helpers for backend authors: the parts every driver needs that have nothing framework-specific.

A driver in any backend (ours or a third party's) moves nested batches, validates its
``<framework>_kwargs`` and hands tensor bytes to the checkpoint writer. Those rules live
here once, so every backend gives the same behaviour and the same error messages.

This module is a backend's door to the core: a backend imports from ``drivetrain.backend``
(and ``drivetrain``), never from the core's private ``drivetrain._*`` modules, which may
change in any release (``tests/core/test_public_backend_api.py`` enforces it). ``Driver``,
the class every driver subclasses, and ``DriverError``, the error it raises for a wrong
argument, are here too, the same objects as ``drivetrain.Driver`` and ``drivetrain.DriverError``.
"""

from __future__ import (
    annotations as annotations,
)

from .._common import DistributedError, DriverError, bool_option, ignore_framework_log_format
from .._data import (
    DefaultSampling,
    ReproducibleBatchSampler,
    UnrepeatedBatchSampler,
    find_reproducible_sampler,
)
from .._distributed import (
    COMM_ERROR_MARKERS,
    LAUNCH_OPTION_DOCS,
    LOCALHOST,
    READY_KEY,
    SPAWN_PARENT_ENV,
    CollectiveGuard,
    DataSharding,
    DeviceRules,
    DistPlan,
    DistributedDriverMixin,
    FailureBoard,
    FolderStore,
    Launcher,
    LauncherEnv,
    LauncherVars,
    ShardedEngineMixin,
    SlurmStep,
    ThreadStore,
    Watchdog,
    check_launched_layout,
    check_layout_arguments,
    check_process_count,
    choice_option,
    die_with_parent,
    end_process,
    env_address,
    env_int,
    env_master,
    flat_buckets,
    free_ports,
    local_launch_env,
    loopback_env,
    one_gpu_for_many,
    plan_options,
    process_group_backend,
    read_launcher_env,
    reduce_gathered,
    refuse_late_options,
    relaunch_command,
    rerun_slurm_task,
    settle_at_exit,
    slurm_step,
    startup_patience,
    torchrun_variables,
    wrapper_options,
)
from .._format import (
    MODEL_PREFIX,
    CheckpointError,
    ShardPiece,
    ShardSource,
    StateShards,
    array_buffer,
    check_shard_model,
    check_shard_optimizers,
    flat_range_boxes,
)
from .._mapping import positional_parameters
from ._checks import (
    check_lrs,
    checked_cuda_index,
)
from ._device_args import (
    OTHER_DEVICE_KINDS,
    batch_mover,
    first_tensor,
    move_nested,
    parse_device_arg,
    unaccepted_device,
    unknown_device,
    usable_cuda_index,
)
from ._driver import (
    CONTRACT_VERSION as CONTRACT_VERSION,
)
from ._driver import (
    Capabilities as Capabilities,
)
from ._driver import (
    Driver,
)
from ._driver_factory import module_driver_factory, planned_distributed
from ._lr_groups import group_multipliers, shared_rate
from ._model_step import (
    ArgumentNames as ArgumentNames,
)
from ._model_step import (
    ModelStep,
)
from ._module_driver import NULL_CONTEXT, ModuleDriver, call_through_wrapper
from ._optimizer_keys import optimizer_state_by_index, optimizer_state_by_name
from ._plugin_spec import driver_specs_hook
from ._plugins import (
    KNOWN_BACKENDS as KNOWN_BACKENDS,
)
from ._plugins import (
    DriverSpec as DriverSpec,
)
from ._plugins import (
    available_drivers as available_drivers,
)
from ._plugins import (
    build_driver as build_driver,
)
from ._plugins import (
    contract_problem as contract_problem,
)
from ._plugins import (
    create_driver as create_driver,
)
from ._plugins import (
    driver_not_found as driver_not_found,
)
from ._plugins import (
    get_registry as get_registry,
)
from ._plugins import (
    hookimpl as hookimpl,
)
from ._plugins import (
    install_hint as install_hint,
)
from ._plugins import (
    known_install as known_install,
)
from ._plugins import (
    register_plugin as register_plugin,
)
from ._plugins import (
    resolve_spec as resolve_spec,
)
from ._precision_amp import AmpPrecision, check_scaler_values, no_bf16_error, scaler_options
from ._rng_states import rng_state_list
from ._seed import (
    capture_host_rng as capture_host_rng,
)
from ._seed import (
    restore_host_rng as restore_host_rng,
)
from ._seed import (
    seed_everything as seed_everything,
)
from ._state_checks import (
    check_gradient_names,
    check_gradient_shape,
    check_rng_state_keys,
    check_state_shape,
    listed_names,
    load_module_state,
    loadable_gradients,
    loadable_model_state,
    module_gradients,
    optimizer_state_for_load,
    scaler_state_to_load,
    warn_device_states,
)
from ._state_codec import (
    bf16_bits,
    check_file_tensor,
    check_optimizer_state,
    dtype_tags,
    file_dtype_tag,
    gradient_copies,
    safetensors_arrays,
    tensor_from,
    widened_tensors,
)
from ._weight_layout import (
    NEUTRAL as NEUTRAL,
)
from ._weight_layout import (
    NEUTRAL_COMPANIONS as NEUTRAL_COMPANIONS,
)
from ._weight_layout import (
    TensorRule as TensorRule,
)
from ._weight_layout import (
    WeightLayout as WeightLayout,
)
from ._weight_layout import (
    decode_classes as decode_classes,
)

__all__ = [
    # distributed runs (see drivetrain._distributed.spawn): self-launch and naming the rank that failed
    "READY_KEY",  # a spawned rank sets it in the store once it reached the Trainer
    "SPAWN_PARENT_ENV",  # set in the environment of processes the Trainer started
    "ThreadStore",  # a checked store with one connection per thread (a store handle that cannot be shared)
    "FolderStore",  # a store of files in a private folder: notices between processes of one machine, no socket
    "FailureBoard",
    "Launcher",
    "die_with_parent",  # a preexec_fn: the child gets SIGKILL when the given parent dies (Linux)
    "relaunch_command",
    "LOCALHOST",  # 127.0.0.1, where a self-launched run meets
    "free_ports",  # TCP ports nobody listens on right now, for a rendezvous on this machine
    "startup_patience",  # how long starting the processes may take: the timeout, but at least a minute
    "local_launch_env",  # torchrun's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/... for one rank on this machine
    "loopback_env",  # GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME naming the loopback interface, for a run on this machine
    # distributed drivers (see drivetrain._distributed: mixin, options)
    "COMM_ERROR_MARKERS",  # words in an error's text that mean a collective broke on the connection
    "CollectiveGuard",  # wraps collectives: a broken one raises DistributedError naming the failed peer
    "DataSharding",  # how a backend rebuilds its dataloaders, for DistributedDriverMixin
    "DistPlan",  # base dataclass of one process's place in a run (launch, rank, world_size, device, ...)
    "DistributedDriverMixin",  # rank properties, dataloader sharding and the same-batch-count check
    "DistributedError",  # what a collective raises when another process failed or stopped answering
    "LauncherEnv",  # rank, world_size, local_rank, local_world_size as a launcher set them
    "LauncherVars",  # a launcher's variable names and the words of its messages
    "check_launched_layout",  # nproc= and a device list must fit the run a launcher started
    "check_layout_arguments",  # refuses a bad nproc= or an empty device list
    "check_process_count",  # nproc= must match the size of a run a launcher started
    "choice_option",  # an option that must be one of a few values
    "env_int",  # an integer environment variable, with the launcher hint when it is wrong
    "env_address",  # a host:port environment variable as (host, port), with the launcher hint when it is wrong
    "env_master",  # (MASTER_ADDR, MASTER_PORT) where both are set, else None
    "one_gpu_for_many",  # the error for device= naming one GPU for several processes
    "plan_options",  # timeout, even_batches and spawn_output of a backend's options, checked
    "read_launcher_env",  # a launcher's rank/world/local variables, checked (None when not launched)
    "SlurmStep",  # this task's place in a Slurm step of several tasks (srun -n N): ranks, nodes, the master
    "slurm_step",  # the SlurmStep of this process, or None (not under srun, or a step of one task)
    "torchrun_variables",  # a SlurmStep as torchrun's variables: LauncherVars(from_slurm=...) for torch-style
    "rerun_slurm_task",  # exec this Slurm task again with the variables a framework joins by, read only early
    "reduce_gathered",  # all_reduce of gathered arrays in numpy, in rank order
    "flat_buckets",  # gradients grouped by dtype in runs of bounded size, one flat all-reduce each
    "settle_at_exit",  # a short pause at exit so gloo's threads finish before the interpreter does
    # layout planning (see drivetrain._distributed.layout): device lists, GPU counts, process-group options
    "LAUNCH_OPTION_DOCS",  # descriptions of even_batches and spawn_output for a backend's accepted kwargs
    "DeviceRules",  # a backend's device calls; its methods pick each process's device and check device lists
    "process_group_backend",  # 'gloo' or 'nccl' from the options, checked against this process's device
    "refuse_late_options",  # start-up options given after the user already started the process group
    "wrapper_options",  # a dict of options for the framework's data-parallel wrapper, checked
    "Watchdog",  # ends the process, naming rank and operation, when a call that waits for the others cannot end
    "end_process",  # the Watchdog's default end: the reason on stderr, exit code 1 (optionally after a pause)
    # the contract
    "Driver",  # the abstract class every driver subclasses (also drivetrain.Driver)
    "ModelStep",  # one batch through the train function: what Driver.forward_backward receives
    "DriverError",  # what a driver raises for a wrong argument (also drivetrain.DriverError)
    "ModuleDriver",  # the template of a driver for a framework with modules, optimizers and dataloaders
    "ShardedEngineMixin",  # the state rules of a data-parallel driver whose engine shards the model (FSDP, ZeRO)
    "NULL_CONTEXT",  # one shared no-op context manager, for auto_cast / no_sync on the hot path
    "call_through_wrapper",  # a module's training method run inside a wrapper's forward (DDP, sharding, engines)
    "module_driver_factory",  # the plugin's create_driver for a ModuleDriver backend, given its distributed choice
    "planned_distributed",  # module_driver_factory's distributed choice from a planner and a lazily imported driver class
    "driver_specs_hook",  # the plugin module's drivetrain_driver_specs hook for a backend laid out by convention
    "ignore_framework_log_format",  # the format of a root-logger handler the framework adds on import: not the app's
    # models
    "positional_parameters",  # a forward's positional parameter names, required count, *args and **kwargs
    "first_tensor",  # a model's first parameter or buffer (None without any): where device=None finds it
    # devices (see drivetrain.backend._device_args)
    "OTHER_DEVICE_KINDS",  # accelerator kinds named as unsupported rather than unknown in device= errors
    "parse_device_arg",  # ('cpu'|'cuda', index) for device= spellings every backend takes; bool/negative refused
    "unaccepted_device",  # the DriverError for a device= of a type the backend does not read
    "unknown_device",  # the DriverError for any device= parse_device_arg did not read (other kinds named as such)
    "usable_cuda_index",  # a cuda device='s index, refused when the framework's CUDA is unavailable or lacks it
    "batch_mover",  # move(batch): nested tensors to one device, the usual dict-in-place batch without recursion
    "checked_cuda_index",  # the index of a cuda device= (the current one when it names none), refused when absent
    # data
    "DefaultSampling",  # a framework DataLoader with default sampling, rebuilt around the samplers below
    "ReproducibleBatchSampler",  # the resumable, shardable training sampler a driver installs
    "UnrepeatedBatchSampler",  # the evaluation sampler: each rank its own shard, once, no padding
    "array_buffer",  # (dtype, shape, bytes) of a numpy array, for Driver.tensor_buffer
    # sharded checkpoints (see drivetrain._checkpoint.sharded): Driver.state_shards / load_state_shards
    "StateShards",  # what one rank contributes to a sharded checkpoint: its pieces and plain-data meta
    "ShardPiece",  # one rank's piece of a tensor: the tensor, its offsets in the full tensor, the full shape
    "ShardSource",  # a verified sharded checkpoint: keys, shapes, meta, and the reads that fill a piece
    "flat_range_boxes",  # a flat range of a tensor as boxes: pieces for drivers that shard flattened tensors
    "MODEL_PREFIX",  # 'model/': the state keys of model weights in a sharded checkpoint
    "check_shard_model",  # a sharded checkpoint's model names and shapes against the model's, before any copy
    "check_shard_optimizers",  # its optimizer metas against each optimizer's param groups (by parameter name)
    "CheckpointError",  # a checkpoint that cannot be loaded (also drivetrain.CheckpointError)
    "bool_option",
    "check_state_shape",  # a saved tensor of another shape than the model's, refused with the same words
    "check_gradient_names",  # load_gradient_state's check: a mapping naming only the model's parameters
    "check_gradient_shape",  # a saved gradient of another shape than its parameter's
    "loadable_model_state",  # load_model_state's checks over a whole state, tensors converted and cast
    "load_module_state",  # load_model_state for torch-style modules: loadable_model_state, then load_state_dict(strict)
    "module_gradients",  # load_gradient_state for torch-style modules: parameters by name and checked gradients
    "loadable_gradients",  # load_gradient_state's checks over all saved gradients, each placed as its parameter needs
    "optimizer_state_for_load",  # an index-keyed optimizer state_dict with int keys again, checked against its groups
    "optimizer_state_by_name",  # an index-keyed optimizer state keyed by parameter name (sharded engines, files)
    "optimizer_state_by_index",  # the inverse: by index in the order of the param groups, as one process keys it
    "check_optimizer_state",  # a name-keyed optimizer state must be a mapping with the backend's own entries
    "tensor_from",  # a framework tensor from a tensor or numpy array (what checkpoints hold), else a DriverError
    "gradient_copies",  # host copies of the gradients by parameter name, for gradient_state
    "check_file_tensor",  # tensor_buffer's refusal of a value that is not a tensor
    "dtype_tags",  # {framework dtype: safetensors tag} for the dtypes a framework has, by their common names
    "file_dtype_tag",  # tensor_buffer's safetensors tag of a dtype, refusing one safetensors cannot store
    "safetensors_arrays",  # each tensor of parsed safetensors bytes as a checked numpy array, for tensors_from_bytes
    "bf16_bits",  # float32 values -> their bfloat16 bits (uint16), exactly
    "widened_tensors",  # tensors_from_bytes for a framework whose numpy bridge has no bfloat16 (through float32)
    "scaler_state_to_load",  # load_precision_state's checks and warnings around a grad scaler state
    # mixed precision (see drivetrain.backend._precision_amp)
    "AmpPrecision",  # base of a backend's Precision: autocast factory, loss scaler state saved and loaded
    "scaler_options",  # the user's loss-scaler options: fp16 only, known keys only
    "check_scaler_values",  # each loss-scaler option's value against the rule its description starts with
    "no_bf16_error",  # the DriverError for precision='bf16' on a GPU older than Ampere
    "check_rng_state_keys",  # load_rng_state's check of the state's entries
    "rng_state_list",  # an entry of a saved RNG state as a list (one state per device), refused otherwise
    "warn_device_states",  # how many saved per-device RNG states to restore here, warning when the counts differ
    "listed_names",  # a short list of names for an error message
    "find_reproducible_sampler",
    "move_nested",
    # optimisation
    "check_lrs",  # set_lrs' argument checked against the optimizers' param groups, with the message every backend gives
    "group_multipliers",  # each param group's fixed multiplier of its optimizer's one rate (paddle's learning_rate)
    "shared_rate",  # the one optimizer rate that gives each group its wanted rate, refused unless the ratios fit
]

# Imported above as "name as name" but not in __all__: names the rest of the core imports from this folder (the
# plugin registry, the contract version, seeding, weight layouts, ArgumentNames). They are not the author surface.
