"""W's chosen columns ``lm_head[:, ids].T`` gathered by Pallas DMAs (pallas_fused's
``chosen_gather: "dma"``, with ``dhidden: "forward"``).

pallas_fused's backward with ``dhidden: "forward"`` needs, per token, the LM head's column
of its chosen id. In XLA that is a gather, and on tpu7x XLA runs it on the SparseCore,
which takes the LM head transposed: a copy of the whole head (1.16 GiB at the seeds'
shape, V = 151936, where the head is stored [H][V]) live in the backward beside dlm_head,
the peak 1.500x the floor instead of 1.026x (buffer assignment, ``GRPO_TPU_DUMP_TO``).

This kernel leaves the head in HBM as it came and copies, per token, the 128-lane block
of columns holding its id into VMEM by one DMA (a DMA moves whole (8, 128) tiles: a
column of a [H][V] array is H/8 tiles wide, so a 128-column block costs what one column
does), then picks the column by a one-hot [1, 128] x [H, 128]^T product on the MXU
(exact: one term is 1, the others 0, summed in f32). ``g`` tokens a grid step, their DMAs
in flight together. Costs: H * 128 * itemsize bytes read per token (8.6 GB at the seeds'
shape in bf16), N / g grid steps, no [H, V] buffer.

On TPU each block's offset must be a multiple of 128 lanes, so V must be one (or below
128: one block, the whole head); the head must be [H][V] (vocab-major heads are gathered
by rows in XLA, with no copy). Docs: docs/implementations.md ("pallas_fused").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .tpu_layout import LANE

f32 = jnp.float32
GATHERS = ("xla", "dma")


def lanes(v: int) -> int:
    """Columns per DMA: 128 lanes, or the whole head when V is narrower."""
    return min(LANE, v)


def tokens_per_step(dtype) -> int:
    """Tokens a grid step: an output block of whole sublane tiles (8 rows of 32 bits,
    16 of 16 bits)."""
    return 8 * (4 // jnp.dtype(dtype).itemsize)


def unsupported_on_tpu(v: int) -> str | None:
    """Why the DMA gather cannot be compiled for a TPU at vocabulary ``v``, or None."""
    if v > LANE and v % LANE:
        return (f"chosen_gather 'dma' on tpu needs V a multiple of {LANE} (tile-aligned DMA "
                f"offsets), not {v}")
    return None


def cost(n: int, h: int, v: int, dtype) -> pl.CostEstimate:
    """The kernel's cost, counted by hand from ``gather``: per token a [1, L] x [L, H]
    product (L = ``lanes(v)``), the one-hot's iota compare and convert (2 L), the result's
    convert to W's dtype (H, none for f32); bytes: per token an [H, L] block in, an [H] row
    out, its id (4 bytes). Partial last steps count whole."""
    g, ln = tokens_per_step(dtype), lanes(v)
    tok = pl.cdiv(n, g) * g
    it = jnp.dtype(dtype).itemsize
    conv = h * int(jnp.dtype(dtype) != jnp.dtype(f32))
    return pl.CostEstimate(flops=tok * (2 * ln * h + 2 * ln + conv), transcendentals=0,
                           bytes_accessed=tok * h * ln * it + n * h * it + 4 * n)


def gather(w, ids, *, interpret: bool):
    """``w[:, clip(ids, 0, V - 1)].T``: [N, H] in w's dtype, exactly, for w [H, V] and
    int32 ids [N]. An out-of-range id (-1, another vocab shard's) reads a real column; the
    caller masks its term."""
    h, v = w.shape
    n = ids.shape[0]
    g, ln = tokens_per_step(w.dtype), lanes(v)
    precision = jax.lax.Precision.HIGHEST if w.dtype == f32 else jax.lax.Precision.DEFAULT

    def kernel(ids_ref, w_hbm, out_ref, buf, sems):
        i = pl.program_id(0)
        picks = []
        for r in range(g):
            y = jnp.clip(ids_ref[jnp.minimum(i * g + r, n - 1)], 0, v - 1)
            # y's block when ln divides V (y >= 0: a truncating division, which Mosaic
            # lowers without the sign op of Python's floor division)
            start = jnp.minimum(jax.lax.div(y, jnp.int32(ln)) * ln, v - ln)
            copy = pltpu.make_async_copy(w_hbm.at[:, pl.ds(pl.multiple_of(start, ln), ln)],
                                         buf.at[r], sems.at[r])
            copy.start()
            picks.append((copy, y - start))
        for r, (copy, lane) in enumerate(picks):
            copy.wait()
            onehot = (jax.lax.broadcasted_iota(jnp.int32, (1, ln), 1) == lane).astype(w.dtype)
            col = jax.lax.dot_general(onehot, buf[r], (((1,), (1,)), ((), ())),
                                      preferred_element_type=f32, precision=precision)
            out_ref[pl.ds(r, 1), :] = col.astype(out_ref.dtype)

    block = g * h * ln * jnp.dtype(w.dtype).itemsize
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(pl.cdiv(n, g),),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((g, h), lambda i, ids: (i, 0)),
            scratch_shapes=[pltpu.VMEM((g, h, ln), w.dtype), pltpu.SemaphoreType.DMA((g,))]),
        out_shape=jax.ShapeDtypeStruct((n, h), w.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=max(32 << 20, 2 * block)),
        cost_estimate=cost(n, h, v, w.dtype),
        interpret=interpret,
        name="grpo_fused_chosen_columns",
    )(ids.astype(jnp.int32), w)
