"""Averaging gradients by hand, for a data-parallel driver that does it itself (paddle: once per optimizer step).

The framework's part is the tensor work (concatenate, all-reduce, copy back); which
gradients travel together is decided here: one flat all-reduce per dtype and bucket of
at most :data:`BUCKET_ELEMENTS` elements. The check that every process has gradients
for the same parameters is :meth:`drivetrain.backend.DistributedDriverMixin._check_same_gradients`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

BUCKET_ELEMENTS = 1 << 24
"""The most elements one flat all-reduce of gradients carries (a larger gradient goes alone)."""


def flat_buckets(tensors: Iterable[T], *, size: Callable[[T], int], dtype: Callable[[T], Hashable],
                 limit: int = BUCKET_ELEMENTS) -> Iterator[list[T]]:
    """``tensors`` grouped by ``dtype(t)``, in order, in runs of at most ``limit`` elements (``size(t)`` each):
    each run can be concatenated into one flat tensor and all-reduced at once."""
    by_dtype: dict[Hashable, list[T]] = {}
    for tensor in tensors:
        by_dtype.setdefault(dtype(tensor), []).append(tensor)
    for group in by_dtype.values():
        bucket: list[T] = []
        total = 0
        for tensor in group:
            n = size(tensor)
            if bucket and total + n > limit:
                yield bucket
                bucket, total = [], 0
            bucket.append(tensor)
            total += n
        if bucket:
            yield bucket
