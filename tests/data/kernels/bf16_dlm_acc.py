"""Deliberately wrong test variants that only fail at scale, checked through config alone
(``id: bf16_dlm_acc:IMPLEMENTATION``, ``pythonpath: [tests/data/kernels]``; docs/nightly.md).

A fused LM-head kernel over blocks of 256 token rows (``lax.scan``; no [B·T, V] tensor, so
XLA:CPU runs it at the seeds' shape): the forward forms each block's f32 logits and their
logsumexp; the backward forms them again, dz = g·(onehot − softmax)/τ in f32, and the two
gradients. One of them is summed in an accumulator kept **in the input dtype**, rounded
after every block. That is the defect (option ``bf16_sum``):

- ``dlm_head`` (default): dlm_head over the 256-token blocks. One rounding at 256 tokens
  or fewer (every executed ci fused case), 32 at the seeds' 8192.
- ``dhidden``: the backward runs over vocabulary blocks of 2048 instead, and dhidden is
  summed across them (the seeds' MLLM-JAX defect): one or two roundings at the ci tier's
  V ≤ 4099, 75 at V = 151936.

With f32 inputs both are honest kernels."""

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.impls import baseline, grpo_math
from grpo_jax.impls.interface import Capabilities, Implementation

f32 = jnp.float32
VBLOCK = 2048


def _make(n, v, temperature, logits_dtype, BLOCK, bf16_sum):
    blocks = -(-n // BLOCK)
    vblocks = -(-v // VBLOCK)
    pad = blocks * BLOCK - n
    tau = float(temperature)

    def scaled(h, w):
        z = jnp.dot(h.astype(w.dtype), w, preferred_element_type=f32,
                    precision=baseline.matmul_precision(w.dtype))
        if logits_dtype == "input":
            z = baseline.round_to(z, w.dtype)
        return z / tau

    def padded(hidden, ids):
        return (jnp.pad(hidden, ((0, pad), (0, 0))), jnp.pad(ids, (0, pad)))

    def forward(hidden, lm_head, ids):
        hs, ys = padded(hidden, ids)

        def step(_, i):
            h = jax.lax.dynamic_slice_in_dim(hs, i * BLOCK, BLOCK, 0)
            y = jax.lax.dynamic_slice_in_dim(ys, i * BLOCK, BLOCK, 0)
            s = scaled(h, lm_head)
            lse = jax.nn.logsumexp(s, axis=-1)
            p = jnp.exp(s - lse[:, None])
            logp = jnp.take_along_axis(s, y[:, None], axis=-1)[:, 0] - lse
            return None, (logp, lse - jnp.sum(p * s, axis=-1), lse)

        _, (logp, ent, lse) = jax.lax.scan(step, None, jnp.arange(blocks))
        return tuple(x.reshape(-1)[:n] for x in (logp, ent, lse))

    @jax.custom_vjp
    def logp_entropy(hidden, lm_head, ids):
        logp, ent, _ = forward(hidden, lm_head, ids)
        return logp, ent

    def fwd_rule(hidden, lm_head, ids):
        logp, ent, lse = forward(hidden, lm_head, ids)
        return (logp, ent), (hidden, lm_head, ids, lse)

    def bwd_dhidden(res, cts):
        # Over vocabulary blocks: every row's dz on the block, dlm_head's block written
        # once (f32 sum, one rounding), dhidden summed across the blocks in the input dtype.
        hidden, lm_head, ids, lse = res
        g = cts[0].astype(f32)
        vpad = vblocks * VBLOCK - v
        w = jnp.pad(lm_head, ((0, 0), (0, vpad)))

        def step(acc, j):
            wb = jax.lax.dynamic_slice_in_dim(w, j * VBLOCK, VBLOCK, 1)
            s = scaled(hidden, wb)
            cols = j * VBLOCK + jnp.arange(VBLOCK)
            onehot = (cols[None, :] == ids[:, None]).astype(f32)
            dz = g[:, None] * (onehot - jnp.exp(s - lse[:, None])) / tau
            part = jnp.dot(dz, wb.astype(f32).T, precision=jax.lax.Precision.HIGHEST)
            dwb = jnp.dot(hidden.astype(f32).T, dz, precision=jax.lax.Precision.HIGHEST)
            # The defect: the running sum goes back to the input dtype after every block.
            return (acc.astype(f32) + part).astype(hidden.dtype), dwb.astype(lm_head.dtype)

        dh, dw = jax.lax.scan(step, jnp.zeros(hidden.shape, hidden.dtype), jnp.arange(vblocks))
        dw = jnp.moveaxis(dw, 0, 1).reshape(lm_head.shape[0], -1)[:, :v]
        return dh, dw, None

    def bwd_rule(res, cts):
        if bf16_sum == "dhidden":
            return bwd_dhidden(res, cts)
        hidden, lm_head, ids, lse = res
        g = jnp.pad(cts[0].astype(f32), (0, pad))  # entropy's cotangent: a metric, ignored
        lses = jnp.pad(lse, (0, pad))
        hs, ys = padded(hidden, ids)

        def step(acc, i):
            h = jax.lax.dynamic_slice_in_dim(hs, i * BLOCK, BLOCK, 0)
            y = jax.lax.dynamic_slice_in_dim(ys, i * BLOCK, BLOCK, 0)
            gb = jax.lax.dynamic_slice_in_dim(g, i * BLOCK, BLOCK, 0)
            lb = jax.lax.dynamic_slice_in_dim(lses, i * BLOCK, BLOCK, 0)
            s = scaled(h, lm_head)
            onehot = jax.nn.one_hot(y, v, dtype=f32)
            dz = gb[:, None] * (onehot - jnp.exp(s - lb[:, None])) / tau
            dh = jnp.dot(dz, lm_head.astype(f32).T, precision=jax.lax.Precision.HIGHEST)
            part = jnp.dot(h.astype(f32).T, dz, precision=jax.lax.Precision.HIGHEST)
            # The defect: the running sum goes back to the input dtype after every block.
            return (acc.astype(f32) + part).astype(lm_head.dtype), dh

        acc, dh = jax.lax.scan(step, jnp.zeros(lm_head.shape, lm_head.dtype),
                               jnp.arange(blocks))
        return dh.reshape(-1, hidden.shape[1])[:n].astype(hidden.dtype), acc, None

    logp_entropy.defvjp(fwd_rule, bwd_rule)
    return logp_entropy


def build(problem, k, options):
    b, t, h, v = problem.b, problem.t, problem.h, problem.v
    if options["bf16_sum"] not in ("dlm_head", "dhidden"):
        raise ValueError(f"bf16_sum must be 'dlm_head' or 'dhidden', got {options['bf16_sum']!r}")
    kernel = _make(b * t, v, k.temperature, k.logits_dtype, int(options["block_tokens"]),
                   options["bf16_sum"])

    def core(hidden, lm_head, ids):
        logp, ent = kernel(hidden.reshape(b * t, h), lm_head, ids.reshape(b * t))
        return logp.reshape(b, t), jax.lax.stop_gradient(ent.reshape(b, t))

    return grpo_math.spec_function(core, k, nhead=2)


IMPLEMENTATION = Implementation(
    id="bf16_dlm_acc",
    description="fused LM head, dlm_head summed over token blocks or dhidden over vocab blocks in the input dtype (test variant)",
    build=build,
    capabilities=Capabilities(levels=frozenset({"fused"})),
    default_options={"block_tokens": 256, "bf16_sum": "dlm_head"},
)
