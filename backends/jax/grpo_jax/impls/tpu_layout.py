"""The physical layout XLA:TPU gives an entry parameter or result (default layout mode).

A Pallas (Mosaic) kernel reads its operands row-major; a plain-XLA loop carry is laid out
row-major too. When XLA:TPU stores an entry array in another dimension order, handing it
to such code costs a relayout copy of the whole array (for a [B, T, V] logits or an
[H, V] LM head: gigabytes). Kernels avoid it by working on ``transpose(x, order)``, which
XLA turns into a bitcast when ``order`` is the physical order.
"""

from __future__ import annotations

import itertools

SUBLANE, LANE = 8, 128
ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def tpu_default_order(shape, dtype: str) -> tuple:
    """Dimension order, major to minor, of XLA:TPU's default ("compact") layout.

    The order whose tiled size is least, where the minor dim is padded to 128 lanes and
    the second-minor dim to its tile rows (the next power of two up to 8, at least 2 for
    16-bit types); ties go to the order closest to row-major. An empirical rule, checked
    against libtpu 0.0.42.1 (v5e and v6e agree) on the 2008 rank-3 shapes of
    tests/data/tpu_default_layouts.txt and the rank-2 LM heads of tests/test_tpu_layout.py.
    A wrong guess costs copies, not results.
    """
    rank = len(shape)
    if rank < 2:
        return tuple(range(rank))
    itemsize = ITEMSIZE[dtype]
    best = None
    # minor_to_major permutations, most row-major first (lexicographically largest).
    for m2m in sorted(itertools.permutations(range(rank)), reverse=True):
        minor, second = shape[m2m[0]], shape[m2m[1]]
        major = 1
        for d in m2m[2:]:
            major *= shape[d]
        rows = 1
        while rows < min(second, SUBLANE):
            rows *= 2
        if itemsize == 2:
            rows = max(rows, 2)
        size = major * _round_up(second, rows) * _round_up(minor, LANE)
        if best is None or size < best[0]:  # strict: the first (most row-major) wins ties
            best = (size, m2m)
    return tuple(reversed(best[1]))
