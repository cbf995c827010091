"""How a batch reaches a model and how its outputs are read: fastNLP-style argument matching, input/output
mappings, finding the loss."""

from .outputs import LOSS, METRIC_ALIASES, flatten_outputs, named_outputs, require_loss, resolve_metric_inputs
from .params import (
    as_dict,
    auto_param_call,
    explain_call_failure,
    loss_of,
    make_batch_namer,
    make_mapping_fn,
    positional_parameters,
)

__all__ = [
    "LOSS", "METRIC_ALIASES", "as_dict", "auto_param_call", "explain_call_failure", "flatten_outputs",
    "loss_of", "make_batch_namer", "make_mapping_fn", "named_outputs", "positional_parameters",
    "require_loss", "resolve_metric_inputs"
]
