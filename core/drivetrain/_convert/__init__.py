"""Moving trained weights between frameworks: the conversion engine over declared layout rules, reading any
framework's model file, and the layout record a save writes."""

from .engine import NameMap, check_name_map
from .load import convert_weights, load_converted
from .record import CLASSES_KEY, LAYOUT_KEY, format_name, layout_record
from .source import check_source_driver, written_by

__all__ = [
    "CLASSES_KEY", "LAYOUT_KEY", "NameMap", "check_name_map", "check_source_driver", "convert_weights",
    "format_name", "layout_record", "load_converted", "written_by"
]
