"""Several processes: launching them (nproc=, launchers), the failure board and watchdog, process-group options
and device layouts, object collectives and the data-parallel driver mixins."""

from .folder_store import FolderStore
from .grads import flat_buckets
from .layout import (
    LAUNCH_OPTION_DOCS,
    DeviceRules,
    DeviceSlot,
    check_distinct_devices,
    check_enough_gpus,
    process_group_backend,
    refuse_late_options,
    spawn_request,
    wrapper_options,
)
from .mixin import (
    COMM_ERROR_MARKERS,
    CollectiveGuard,
    DataSharding,
    DistributedDriverMixin,
    reducible_array,
    settle_at_exit,
)
from .objects import broadcast_pickled, gather_pickled, reduce_gathered
from .options import (
    DistPlan,
    LauncherEnv,
    LauncherVars,
    check_launched_layout,
    check_layout_arguments,
    check_process_count,
    choice_option,
    env_address,
    env_int,
    env_master,
    one_gpu_for_many,
    plan_options,
    processes_wanted,
    read_launcher_env,
    timeout_option,
)
from .sharded_engine import ShardedEngineMixin
from .slurm import (
    TASK_PROCESS_ENV,
    SlurmStep,
    TaskProcesses,
    check_not_batch_shell,
    check_slurm_world,
    expand_hostlist,
    expand_tasks_per_node,
    rerun_slurm_task,
    slurm_step,
    start_task_processes,
    task_process,
    task_processes_asked,
    torchrun_variables,
)
from .spawn import (
    LOCALHOST,
    READY_KEY,
    SPAWN_PARENT_ENV,
    CheckedStore,
    FailureBoard,
    Launcher,
    ThreadStore,
    die_with_parent,
    exception_summary,
    exit_description,
    free_ports,
    local_launch_env,
    loopback_env,
    pump_output,
    relaunch_command,
    startup_patience,
)
from .watchdog import Watchdog, end_process

__all__ = [
    "COMM_ERROR_MARKERS", "CheckedStore", "CollectiveGuard", "DataSharding", "DeviceRules", "DeviceSlot",
    "DistPlan", "DistributedDriverMixin", "FailureBoard", "FolderStore", "LAUNCH_OPTION_DOCS", "LOCALHOST",
    "Launcher", "LauncherEnv", "LauncherVars", "READY_KEY", "SPAWN_PARENT_ENV", "ShardedEngineMixin",
    "SlurmStep", "TASK_PROCESS_ENV", "TaskProcesses", "ThreadStore", "Watchdog", "broadcast_pickled", "check_distinct_devices",
    "check_enough_gpus", "check_launched_layout", "check_layout_arguments", "check_not_batch_shell",
    "check_process_count", "check_slurm_world", "choice_option", "die_with_parent", "end_process",
    "env_address", "env_int", "env_master", "exception_summary", "exit_description", "expand_hostlist",
    "expand_tasks_per_node", "flat_buckets", "free_ports", "gather_pickled", "local_launch_env",
    "loopback_env", "one_gpu_for_many", "plan_options", "process_group_backend", "processes_wanted",
    "pump_output", "read_launcher_env", "reduce_gathered", "reducible_array", "refuse_late_options",
    "relaunch_command", "rerun_slurm_task", "settle_at_exit", "slurm_step", "spawn_request", "start_task_processes",
    "startup_patience", "task_process", "task_processes_asked", "timeout_option", "torchrun_variables", "wrapper_options"
]
