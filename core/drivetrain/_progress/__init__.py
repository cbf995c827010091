"""Progress displays (callbacks run on the global-zero process) and the choice among them."""

from .._common import check_keywords
from .base import ProgressCallback
from .choose import choose_progress
from .loop import LoopDisplay, choose_loop_display
from .raw import RawTextProgress
from .rich_bar import RichProgress
from .tqdm_bar import TqdmProgress

__all__ = [
    "LoopDisplay", "ProgressCallback", "RawTextProgress", "RichProgress", "TqdmProgress",
    "choose_loop_display", "choose_progress"
]

for _public in (RawTextProgress, RichProgress, TqdmProgress):
    check_keywords(_public)  # a misspelt keyword gets the closest accepted name
