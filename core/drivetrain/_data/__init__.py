"""Where the loop is in the data: reproducible samplers, dataloader views, streaming positions, and the position
arithmetic (epochs, samples, steps) that fresh and resumed runs share."""

from .accumulation import AccumulationCycle
from .default_sampling import DefaultSampling
from .loader_checks import check_not_data
from .loaders import OverfitLoader, TruncatedLoader, loader_length
from .position import LoopLength, Position, ResumedFrom, epoch_of_last_step, plan_length
from .sampler import ReproducibleBatchSampler, UnrepeatedBatchSampler, find_reproducible_sampler
from .stateful import loader_position, restore_loader_position

__all__ = [
    "AccumulationCycle", "DefaultSampling", "LoopLength", "OverfitLoader", "Position",
    "ReproducibleBatchSampler", "ResumedFrom", "TruncatedLoader", "UnrepeatedBatchSampler",
    "check_not_data", "epoch_of_last_step", "find_reproducible_sampler", "loader_length", "loader_position",
    "plan_length", "restore_loader_position"
]
