"""GRPO per-token terms and aggregation from per-token log-probabilities (SPEC.md).

Shared by implementations whose kernels stop at ``logp`` (and let JAX autodiff the rest).
All functions are pure jnp and differentiable in ``logp``; the gradient they produce is
exactly SPEC's (ties go to the unclipped branch; metrics carry no gradient).

Masked positions are sanitised (their log-ratio and KL argument are replaced by 0) so that
arbitrary inputs there can never produce Inf/NaN in values or gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..spec import Knobs

f32 = jnp.float32


def log_ratio(logp, old_logp, mask, level: str):
    """log r per token: token level, or the masked mean over t broadcast (sequence level)."""
    diff = jnp.where(mask > 0, logp - old_logp, 0.0)
    if level == "token":
        return diff
    count = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
    seq = jnp.sum(mask * diff, axis=-1, keepdims=True) / count
    return jnp.broadcast_to(seq, diff.shape)


def clipped_pg(log_r, advantages, k: Knobs):
    """pg = -min(r_d*A, r_c*A) with SPEC's gradient; returns (pg, r).

    ``jnp.minimum``/``jnp.clip`` split the gradient 50/50 on ties (e.g. r == 1 on the first
    step), whereas SPEC sends it all to the unclipped branch when r_d*A <= r_c*A and
    r <= delta, and none otherwise. So: select -r*A (differentiable) on that branch and the
    stop-gradient value elsewhere. On that branch r <= delta, so r_d == r and the values agree.
    """
    r = jnp.exp(log_r)
    a = advantages[:, None]
    r_d = r if k.delta is None else jnp.minimum(r, k.delta)
    r_c = jnp.clip(r, 1.0 - k.epsilon_low, 1.0 + k.epsilon_high)
    unclipped = r_d * a <= r_c * a
    if k.delta is not None:
        unclipped = unclipped & (r <= k.delta)
    value = -jnp.minimum(r_d * a, r_c * a)
    pg = jnp.where(unclipped, -r * a, jax.lax.stop_gradient(value))
    return pg, r


def k3_kl(logp, ref_logp, mask):
    """exp(ref - logp) - (ref - logp) - 1 (masked positions give 0)."""
    d = jnp.where(mask > 0, ref_logp - logp, 0.0)
    return jnp.exp(d) - d - 1.0


def clipped_metric(r, advantages, k: Knobs):
    """1.0 where the ratio is clipped in the direction the advantage pushes it, else 0.0."""
    a = advantages[:, None]
    low = (r < 1.0 - k.epsilon_low) & (a < 0)
    high = (r > 1.0 + k.epsilon_high) & (a > 0)
    return jax.lax.stop_gradient((low | high).astype(f32))


def aggregate(per_token_loss, mask, k: Knobs):
    """Scalar loss from per-token losses by ``k.loss_type`` (grpo | bnpo | dr_grpo)."""
    masked = mask * per_token_loss
    b, t = per_token_loss.shape
    if k.loss_type == "grpo":
        rows = jnp.sum(masked, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        return jnp.mean(rows)
    if k.loss_type == "bnpo":
        return jnp.sum(masked) / jnp.maximum(jnp.sum(mask), 1.0)
    if k.loss_type == "dr_grpo":
        length = k.max_completion_length if k.max_completion_length is not None else t
        return jnp.sum(masked) / float(b * length)
    raise ValueError(f"unknown loss_type {k.loss_type!r}")


def grpo_from_logp(logp, old_logp, ref_logp, advantages, mask, k: Knobs):
    """(loss, aux) from f32 per-token logp; aux = per_token_loss, kl, clipped (no gradient).

    ``ref_logp`` is not read when ``k.beta == 0`` (kl is then reported as 0).
    """
    mask = mask.astype(f32)
    log_r = log_ratio(logp, old_logp, mask, k.importance_sampling_level)
    pg, r = clipped_pg(log_r, advantages, k)
    if k.beta != 0:
        kl = k3_kl(logp, ref_logp, mask)
        per_token = pg + k.beta * kl
    else:
        kl = jnp.zeros_like(logp)
        per_token = pg
    loss = aggregate(per_token, mask, k)
    aux = {
        "per_token_loss": jax.lax.stop_gradient(per_token),
        "kl": jax.lax.stop_gradient(kl),
        "clipped": clipped_metric(r, advantages, k),
    }
    return loss, aux


def spec_function(core, k: Knobs, nhead: int, loss_from_logp=None):
    """The SPEC function of a per-token core: all inputs in SPEC order -> (loss, logp,
    per_token_loss, kl, clipped, entropy, gradients of the first ``nhead`` inputs).

    ``core(*head, chosen_ids) -> (logp [B, T], entropy [B, T] without gradient)``;
    ``loss_from_logp`` (default ``grpo_from_logp``) turns logp into (loss, aux)."""
    loss_from_logp = loss_from_logp or grpo_from_logp

    def loss_fn(*inputs):
        head, (ids, old_logp, ref_logp, advantages, mask) = inputs[:nhead], inputs[nhead:]
        logp, entropy = core(*head, ids.astype(jnp.int32))
        loss, aux = loss_from_logp(logp, old_logp, ref_logp, advantages, mask, k)
        return loss, (jax.lax.stop_gradient(logp), aux, entropy)

    def fn(*inputs):
        (loss, (logp, aux, entropy)), grads = jax.value_and_grad(
            loss_fn, argnums=tuple(range(nhead)), has_aux=True)(*inputs)
        return (loss, logp, aux["per_token_loss"], aux["kl"], aux["clipped"], entropy, *grads)
    return fn
