"""Vocab chunks of the LM head for the plain-XLA loops on TPU, fetched by a Pallas DMA
(xla_chunked's and xla_saved_logits' ``lm_head_fetch``).

XLA:TPU lays out a loop-carried 16-bit array in the tiling its matmuls prefer. On tpu7x
that is (16,128)(2,1), while an entry parameter keeps the default (8,128)(2,1): a loop
that dynamic-slices the bf16 LM head makes the SparseCore re-tile the whole head before
the loop, one more H·V buffer (1.24 GB at the seeds' shape) live through both passes
(buffer assignment with ``GRPO_TPU_DUMP_TO``: a ``sparse-core-data-format-call`` from
``T(8,128)(2,1)`` into ``T(16,128)(2,1)``). A Mosaic custom call takes its operands in the
default layout, so a loop that reads the head only through one keeps it as it came: the
kernel below copies one chunk from HBM into VMEM by one DMA (the re-tiling happens in
that copy) and returns it, a chunk-sized array per loop step. It costs one more write
and read of the head per pass (2·H·V·b bytes) and one grid step per chunk.
Docs: docs/implementations.md ("xla_saved_logits", "The time-memory front").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FETCHES = ("slice", "pallas")


def alignment(axis: int) -> int:
    """What a DMA offset along ``axis`` of a rank-2 array must be a multiple of on TPU:
    its tile (128 lanes minor; 16 rows, a 16-bit tile's, major)."""
    return 128 if axis == 1 else 16


def chunk(w, start, size: int, axis: int, *, interpret: bool):
    """``lax.dynamic_slice_in_dim(w, start, size, axis)`` of a rank-2 ``w`` with a traced
    ``start``, as a Pallas kernel: ``w`` stays in HBM (its entry layout), one DMA moves
    the chunk into the kernel's VMEM output (``interpret``: Pallas' interpreter, any
    platform). ``start`` is not clamped: the caller keeps ``start + size <= w.shape[axis]``
    (an out-of-bounds DMA is an error on TPU) and ``start`` a multiple of
    ``alignment(axis)`` (Mosaic refuses an offset it cannot prove tile-aligned)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    shape = tuple(size if d == axis else n for d, n in enumerate(w.shape))

    def kernel(start_ref, w_hbm, out_ref, sem):
        window = pl.ds(pl.multiple_of(start_ref[0], alignment(axis)), size)
        src = w_hbm.at[:, window] if axis == 1 else w_hbm.at[window, :]
        copy = pltpu.make_async_copy(src, out_ref, sem)
        copy.start()
        copy.wait()

    nbytes = size * (w.size // w.shape[axis]) * w.dtype.itemsize
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(shape, w.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        # The chunk is the kernel's only VMEM buffer: room for it and Mosaic's own.
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=max(32 << 20, nbytes + (8 << 20))),
        interpret=interpret,
        name="lm_head_fetch",
    )(jnp.reshape(jnp.asarray(start, jnp.int32), (1,)), w)
