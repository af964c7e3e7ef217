"""A product with an f32 operand taken as 16-bit terms (xla_chunked, xla_saved_logits and
pallas_fused's ``x3_dlm_head``).

A single-pass MXU matmul takes 16-bit operands. An f32 ``x`` enters it as the terms
t1 = trunc(x), t2 = trunc(x - t1), ..., the last one rounded, each an exact-product
single-pass matmul, summed in f32: with bf16, 8 significant bits a term, so three hold an
f32 exactly (barring underflow).

The leading terms are cut with integer operations on x's bits, not by a round trip
through the 16-bit type: ``x - f32(bf16(x))`` is a convert pair that XLA:GPU removes when
excess precision is allowed (its default, ``SimplifyFPConversions``), which made every
residual zero and left dz in one bf16 term on an H100 (docs/gpu.md). A masked f32 is
exactly representable in the 16-bit type, so its convert is exact and the residual
``x - t`` is formed from f32 values alone.
Docs: docs/implementations.md ("xla_saved_logits", "The time-memory front").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def truncated(x, dtype):
    """(t, t as f32): the f32 array ``x`` cut to ``dtype``'s significant bits (toward zero)
    by masking its bits (f16's subnormal range: to a multiple of its spacing), so that
    ``x - t`` needs no convert; ``t`` is exact in ``dtype`` unless beyond its largest
    value (f16: 65504)."""
    info = jnp.finfo(dtype)
    drop = 23 - info.nmant  # f32's 23 stored mantissa bits, less the type's
    mask = jnp.int32(-(1 << drop))  # ones above the dropped bits: 0xFFFF0000 for bf16
    x = x.astype(jnp.float32)
    hi = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, jnp.int32) & mask,
                                      jnp.float32)
    if float(info.tiny) > float(jnp.finfo(jnp.float32).tiny):
        # f16's subnormals have a fixed spacing (2^-24): cut to a multiple of it (exact
        # in f32: scaling by a power of two, then trunc).
        q = float(info.smallest_subnormal)
        hi = jnp.where(jnp.abs(x) < float(info.tiny), jnp.trunc(x / q) * q, hi)
    return hi.astype(dtype), hi


def product_of_terms(x, dtype, terms: int, dot):
    """sum_k dot(t_k) for the first ``terms`` ``dtype`` terms t_k of the f32 array ``x``
    (``dot`` maps a term to its f32 product); no residual is formed after the last term,
    which is rounded to nearest."""
    out, rest = None, x
    for k in range(terms):
        if k + 1 < terms:
            term, hi = truncated(rest, dtype)
            rest = rest - hi
        else:
            term = rest.astype(dtype)
        part = dot(term)
        out = part if out is None else out + part
    return out
