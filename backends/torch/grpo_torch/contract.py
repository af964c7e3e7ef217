"""SPEC's GRPO loss in plain torch (docs/spec.md), from per-token log-probabilities.

Mirrors grpo_jax's ``grpo_math``: differentiable in ``logp``; ties at the clip edges go to
the unclipped branch (SPEC, "Branch rule and ties"); metrics carry no gradient; masked
positions are sanitised so that no input there can give Inf or NaN.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

f32 = torch.float32


def log_ratio(logp, old_logp, mask, level: str):
    """log r per token: token level, or the masked mean over t broadcast (sequence level)."""
    diff = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))
    if level == "token":
        return diff
    count = torch.clamp(mask.sum(-1, keepdim=True), min=1.0)
    seq = (mask * diff).sum(-1, keepdim=True) / count
    return seq.expand_as(diff)


def clipped_pg(log_r, advantages, k: Mapping[str, Any]):
    """pg = -min(r_d·A, r_c·A) with SPEC's gradient (all of it on the unclipped branch when
    r_d·A ≤ r_c·A and r ≤ δ, none elsewhere); returns (pg, r)."""
    r = torch.exp(log_r)
    a = advantages[:, None]
    delta = k.get("delta")
    r_d = r if delta is None else torch.clamp(r, max=delta)
    r_c = torch.clamp(r, 1.0 - k["epsilon_low"], 1.0 + k["epsilon_high"])
    unclipped = r_d * a <= r_c * a
    if delta is not None:
        unclipped = unclipped & (r <= delta)
    value = -torch.minimum(r_d * a, r_c * a)
    return torch.where(unclipped, -r * a, value.detach()), r


def k3_kl(logp, ref_logp, mask):
    """exp(ref − logp) − (ref − logp) − 1 (masked positions give 0)."""
    d = torch.where(mask > 0, ref_logp - logp, torch.zeros_like(logp))
    return torch.exp(d) - d - 1.0


def clipped_metric(r, advantages, k: Mapping[str, Any]):
    """1 where the ratio is clipped in the direction the advantage pushes it, else 0."""
    a = advantages[:, None]
    low = (r < 1.0 - k["epsilon_low"]) & (a < 0)
    high = (r > 1.0 + k["epsilon_high"]) & (a > 0)
    return (low | high).to(f32).detach()


def aggregate(per_token_loss, mask, k: Mapping[str, Any]):
    """The scalar loss by ``loss_type`` (grpo | bnpo | dr_grpo)."""
    masked = mask * per_token_loss
    b, t = per_token_loss.shape
    lt = k["loss_type"]
    if lt == "grpo":
        return (masked.sum(-1) / torch.clamp(mask.sum(-1), min=1.0)).mean()
    if lt == "bnpo":
        return masked.sum() / torch.clamp(mask.sum(), min=1.0)
    if lt == "dr_grpo":
        length = k.get("max_completion_length") or t
        return masked.sum() / float(b * length)
    raise ValueError(f"unknown loss_type {lt!r}")


def grpo_from_logp(logp, old_logp, ref_logp, advantages, mask, k: Mapping[str, Any]):
    """(loss, metrics) from f32 per-token logp; metrics: per_token_loss, kl, clipped."""
    mask = mask.to(f32)
    log_r = log_ratio(logp, old_logp, mask, k["importance_sampling_level"])
    pg, r = clipped_pg(log_r, advantages, k)
    if k["beta"] != 0:
        kl = k3_kl(logp, ref_logp, mask)
        per_token = pg + k["beta"] * kl
    else:
        kl = torch.zeros_like(logp)
        per_token = pg
    loss = aggregate(per_token, mask, k)
    return loss, {"per_token_loss": per_token.detach(), "kl": kl.detach(),
                  "clipped": clipped_metric(r, advantages, k)}


def logp_and_entropy(z, chosen_ids, temperature: float):
    """Per-token log-prob of the chosen ids (f32 log-softmax of z/τ, differentiable) and
    the entropy (no gradient)."""
    s = z.to(f32) / temperature
    logp_all = torch.log_softmax(s, dim=-1)
    logp = torch.gather(logp_all, -1, chosen_ids.long()[..., None])[..., 0]
    lp = logp_all.detach()
    entropy = -(torch.exp(lp) * lp).sum(-1)
    return logp, entropy
