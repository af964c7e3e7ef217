"""A product with an f32 operand taken as 16-bit terms (xla_chunked, xla_saved_logits and
pallas_fused's ``x3_dlm_head``).

A single-pass MXU matmul takes 16-bit operands. An f32 ``x`` enters it as the terms
t1 = round(x), t2 = round(x - t1), ..., each an exact-product single-pass matmul, summed
in f32: with bf16, 8 significant bits a term, so three hold an f32 to about 24 bits.
Docs: docs/implementations.md ("xla_saved_logits", "The time-memory front").
"""

from __future__ import annotations

import jax.numpy as jnp


def product_of_terms(x, dtype, terms: int, dot):
    """sum_k dot(t_k) for the first ``terms`` ``dtype`` terms t_k of the f32 array ``x``
    (``dot`` maps a term to its f32 product); no residual is formed after the last term."""
    out, rest = None, x
    for k in range(terms):
        term = rest.astype(dtype)
        part = dot(term)
        out = part if out is None else out + part
        if k + 1 < terms:
            rest = rest - term.astype(jnp.float32)
    return out
