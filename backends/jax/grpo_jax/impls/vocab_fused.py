"""The vocab-parallel fused level: the LM head split over V on N devices, every device
holding the whole of ``hidden``, with a backward that keeps no [B, T, H] f32 array, and
no gather or scatter of LM-head columns (on TPU those force relayout copies of the
whole LM-head shard). Both cost the first version of this wrapper 1.5-2x the per-chip
floor.

The implementation's ``per_token`` core is called with ``with_lse=True``: it returns
r = s_y - lse_k (logp within the shard), the entropy and lse_k, and its VJP takes a
cotangent on lse_k as well as on r. Per shard k, ids another shard owns are -1 (select
no column: r = -lse_k).

Forward (inside ``shard_map``): r_k, ent_k, lse_k; the owner's chosen logit is
c_k = r_k + lse_k. Outside: lse = logsumexp_k lse_k, logp = sum_k c_k - lse, entropy from
the log-sum-exp weights w_k = exp(lse_k - lse) (``mixture_entropy``).

Backward (``jax.custom_vjp``), g = d loss / d logp. logp = sum_k [k owns y](r_k + lse_k)
- lse, so the cotangents are g_r = g [k owns y] on r_k and g_l = g_r - g w_k on lse_k;
inside the core dz = (g_r onehot - (g_r - g_l) softmax_k) / tau, the softmax
coefficient being g w_k, computed in f32 in the kernel. Per shard:

- dlm_head_k: the core's VJP in its LM-head shard over all tokens (its dhidden output
  is unused and removed by XLA).
- dhidden: the sum over shards, in f32, of each shard's partial, one token chunk at a
  time: the core's VJP in that chunk's hidden, which enters in f32 (values of the input
  dtype; the ``per_token`` contract) so that the partial comes out in f32, unrounded;
  ``psum`` over the devices in f32, then one rounding into the output. (Summing the partials in bf16 missed the bf16
  dhidden tolerance by 4% on 8 shards.) Chunks keep the f32 partial small
  (``chunk_tokens``): a whole [B*T, H] f32 partial per chip is 2x hidden, 0.33x the
  per-chip floor at (4, 1024, 1024, 32768) bf16.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..spec import Knobs, Problem

f32 = jnp.float32

# Bytes of one chunk's f32 dhidden partial (chunk_tokens * H * 4): small against any
# per-chip floor that matters, large enough that the loop has few steps.
CHUNK_BYTES = 2 << 20


def mixture_entropy(lse_k, ent_k, lse):
    """The row's entropy from its shards' (axis 0): with w_k = exp(lse_k − lse) the shard's
    share of the probability, H = Σ_k w_k (H_k − log w_k), a sum of non-negative terms.
    (The equal lse − Σ_k w_k (lse_k − H_k) cancels two numbers of the size of lse: at
    z/τ ≈ 1000 it was 8% off an entropy of 0.46, 1.7× the f32 bound.)"""
    log_w = lse_k - lse
    return jnp.sum(jnp.exp(log_w) * (ent_k - log_w), axis=0)


def chunk_tokens(n: int, h: int) -> int:
    """Tokens per backward chunk: CHUNK_BYTES of f32 [chunk, H], a multiple of 8, <= n."""
    c = max(8, CHUNK_BYTES // (4 * h))
    return min(n, c - c % 8)


def _over_chunks(n: int, c: int, body: Callable, carry):
    """``body(start, size, carry) -> carry`` over [0, n) in chunks of c (the last one,
    of n % c tokens, with a static size of its own)."""
    full = n // c
    if full:
        carry = jax.lax.fori_loop(0, full, lambda i, cr: body(i * c, c, cr), carry)
    if n % c:
        carry = body(full * c, n % c, carry)
    return carry


def make(impl, problem: Problem, k: Knobs, options: Mapping[str, Any], mesh, axis: str,
         devices: int, *, unsafe_bf16_reduction: bool = False) -> Callable:
    """``per_token(hidden [B, T, H], lm_head [H, V_pad], ids [B, T]) -> (logp, entropy)``
    for ``lm_head`` sharded on V over ``mesh``; columns >= problem.v are padding.
    ``unsafe_bf16_reduction`` (test-only wrong variant): the dhidden partials are rounded
    to bf16 and summed across shards in bf16, one rounding per shard added."""
    v = problem.v
    v_l = -(-v // devices)
    b, t, h = problem.b, problem.t, problem.h
    n = b * t
    c = chunk_tokens(n, h)
    local = dataclasses.replace(problem, v=v_l)
    full_core = impl.per_token(local, k, options)
    chunk_core = {size: impl.per_token(dataclasses.replace(local, b=1, t=size), k, options)
                  for size in {c, n % c} if size}

    def local_ids(ids):
        """(the shard's column of each chosen id or -1 where another shard owns it, its
        count of real columns: the rest of the padded shard is padding)."""
        off = jax.lax.axis_index(axis) * v_l
        y_l = ids - off
        own = (y_l >= 0) & (y_l < v_l)
        valid = jnp.clip(v - off, 0, v_l).astype(jnp.int32)
        return jnp.where(own, y_l, -1), valid

    def stats_shard(hidden, w, ids):
        y, valid = local_ids(ids)
        r, ent, lse_k = full_core(hidden, w, y, valid, with_lse=True)
        c_k = jnp.where(y >= 0, r + lse_k, 0.0)    # the owner's chosen logit s_y
        return lse_k[None], jax.lax.stop_gradient(ent)[None], c_k[None]

    stats = jax.shard_map(stats_shard, mesh=mesh, in_specs=(P(), P(None, axis), P()),
                          out_specs=(P(axis), P(axis), P(axis)), check_vma=False)

    def combine(lse_k, ent_k, c_k):
        top = jnp.max(lse_k, axis=0)
        lse = top + jnp.log(jnp.sum(jnp.exp(lse_k - top), axis=0))
        return jnp.sum(c_k, axis=0) - lse, mixture_entropy(lse_k, ent_k, lse), lse

    def grad_shard(hidden, w, ids, g, wk):
        y, valid = local_ids(ids)
        # logp = sum_k [k owns y] (r_k + lse_k) - lse: cotangents of the core's r_k and
        # lse_k outputs; inside, the softmax coefficient g_r - g_l = g w_k.
        g_r = jnp.where(y >= 0, g, 0.0)
        g_l = g_r - g * wk[0]
        _, vjp_w = jax.vjp(lambda w_: full_core(hidden, w_, y, valid, with_lse=True)[0::2], w)
        (dw,) = vjp_w((g_r, g_l))
        hf, yf = hidden.reshape(n, h), y.reshape(1, n)
        gr, gl = g_r.reshape(1, n), g_l.reshape(1, n)

        def dh_body(s, size, dh):
            core = chunk_core[size]
            piece = lambda x: jax.lax.dynamic_slice_in_dim(x, s, size, x.ndim - 1)  # noqa: E731
            hs = jax.lax.dynamic_slice_in_dim(hf, s, size).astype(f32)
            _, vjp_h = jax.vjp(lambda x: core(x.reshape(1, size, h), w, piece(yf), valid,
                                              with_lse=True)[0::2], hs)
            (part,) = vjp_h((piece(gr), piece(gl)))
            if unsafe_bf16_reduction:  # the wrong variant: a shard-ordered bf16 sum
                parts = jax.lax.all_gather(part.astype(jnp.bfloat16), axis)
                total = parts[0]
                for i in range(1, devices):
                    total = total + parts[i]
            else:
                total = jax.lax.psum(part, axis)
            return jax.lax.dynamic_update_slice_in_dim(dh, total.astype(hidden.dtype), s, 0)
        dh = _over_chunks(n, c, dh_body, jnp.zeros((n, h), hidden.dtype))
        return dh.reshape(b, t, h), dw

    grads = jax.shard_map(grad_shard, mesh=mesh,
                          in_specs=(P(), P(None, axis), P(), P(), P(axis)),
                          out_specs=(P(), P(None, axis)), check_vma=False)

    @jax.custom_vjp
    def per_token(hidden, w, ids):
        logp, entropy, _ = combine(*stats(hidden, w, ids))
        return logp, entropy

    def fwd(hidden, w, ids):
        lse_k, ent_k, c_k = stats(hidden, w, ids)
        logp, entropy, lse = combine(lse_k, ent_k, c_k)
        return (logp, entropy), (hidden, w, ids, lse_k, lse)

    def bwd(res, cts):
        hidden, w, ids, lse_k, lse = res
        g = cts[0].astype(f32)  # entropy is a metric: no gradient
        dh, dw = grads(hidden, w, ids, g, jnp.exp(lse_k - lse[None]))
        return dh, dw, None

    per_token.defvjp(fwd, bwd)
    return per_token
