"""A logits-level GRPO implementation around a Pallas logsumexp kernel.

``logsumexp_rows(x)`` is the kernel: rows of x [N, V] in (row block, vocab tile) blocks,
an online max / sum-of-exponentials per row in VMEM scratch, the last (partial) vocab
tile masked. Its gradient (softmax) is a ``jax.custom_vjp`` in plain JAX. The GRPO terms
around it come from grpo_jax's shared ``grpo_math``.

``IMPLEMENTATION`` is a full grpo_jax ``Implementation`` (every SPEC output, entropy
included). ``PADDED_ZEROS`` is deliberately wrong: it pads V up to a multiple of the
tile with zero logits and forgets to mask them, so padding counts in the normaliser (a
real bug class); on an unaligned V it must fail the suite.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grpo_jax.impls import grpo_math
from grpo_jax.impls.interface import Capabilities, Implementation

f32 = jnp.float32


def _lse_kernel(x_ref, o_ref, m_sc, l_sc, *, v, block_v, mask_tail):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -1e30, f32)
        l_sc[...] = jnp.zeros(l_sc.shape, f32)

    x = x_ref[...].astype(f32)
    if mask_tail:
        col = j * block_v + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        x = jnp.where(col < v, x, -jnp.inf)
    m_new = jnp.maximum(m_sc[...], jnp.max(x, axis=1, keepdims=True))
    l_sc[...] = jnp.exp(m_sc[...] - m_new) * l_sc[...] + jnp.sum(jnp.exp(x - m_new), axis=1, keepdims=True)
    m_sc[...] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        o_ref[...] = m_sc[...] + jnp.log(l_sc[...])


def logsumexp_rows(x, *, block_rows=8, block_v=512, pad_zeros=False):
    """logsumexp over the last axis of x [N, V] (f32 [N]), with its VJP."""

    @jax.custom_vjp
    def lse(x):
        return _forward(x)

    def _forward(x):
        n, v = x.shape
        if pad_zeros:  # the bug: zero columns up to a multiple of block_v, not masked
            x = jnp.pad(x, ((0, 0), (0, (-v) % block_v)))
        br, bv = min(block_rows, n), min(block_v, x.shape[1])
        out = pl.pallas_call(
            functools.partial(_lse_kernel, v=v, block_v=bv,
                              mask_tail=not pad_zeros and v % bv != 0),
            grid=(pl.cdiv(n, br), pl.cdiv(x.shape[1], bv)),
            in_specs=[pl.BlockSpec((br, bv), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((br, 1), lambda i, j: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((n, 1), f32),
            scratch_shapes=[pltpu.VMEM((br, 1), f32)] * 2,
            interpret=True,
        )(x)
        return out[:, 0]

    def fwd(x):
        y = _forward(x)
        return y, (x, y)

    def bwd(res, g):
        x, y = res
        return ((g[:, None] * jnp.exp(x.astype(f32) - y[:, None])).astype(x.dtype),)

    lse.defvjp(fwd, bwd)
    return lse(x)


def _builder(pad_zeros):
    def build(problem, k, options):
        b, t, v = problem.b, problem.t, problem.v

        def loss_fn(logits, chosen_ids, old_logp, ref_logp, advantages, mask):
            s = logits.reshape(b * t, v).astype(f32) / k.temperature
            lse = logsumexp_rows(s, block_rows=options["block_rows"],
                                 block_v=options["block_v"], pad_zeros=pad_zeros)
            ids = chosen_ids.reshape(b * t, 1).astype(jnp.int32)
            logp = (jnp.take_along_axis(s, ids, axis=1)[:, 0] - lse).reshape(b, t)
            p = jax.lax.stop_gradient(jnp.exp(s - lse[:, None]))
            entropy = (jax.lax.stop_gradient(lse) - jnp.sum(p * jax.lax.stop_gradient(s), axis=1)).reshape(b, t)
            loss, aux = grpo_math.grpo_from_logp(logp, old_logp, ref_logp, advantages, mask, k)
            return loss, (jax.lax.stop_gradient(logp), aux, entropy)

        def fn(logits, chosen_ids, old_logp, ref_logp, advantages, mask):
            (loss, (logp, aux, ent)), dlogits = jax.value_and_grad(loss_fn, has_aux=True)(
                logits, chosen_ids, old_logp, ref_logp, advantages, mask)
            return loss, logp, aux["per_token_loss"], aux["kl"], aux["clipped"], ent, dlogits
        return fn
    return build


_CAPS = Capabilities(levels=frozenset({"logits"}), platforms=frozenset({"cpu"}))
_OPTIONS = {"block_rows": 8, "block_v": 512}

IMPLEMENTATION = Implementation(
    id="ext_lse", description="example: Pallas logsumexp kernel (interpret mode) + grpo_math",
    build=_builder(False), capabilities=_CAPS, default_options=_OPTIONS)

PADDED_ZEROS = Implementation(
    id="ext_lse_padded_zeros",
    description="deliberately wrong example: zero-padded vocabulary counted in the logsumexp",
    build=_builder(True), capabilities=_CAPS, default_options=_OPTIONS)
