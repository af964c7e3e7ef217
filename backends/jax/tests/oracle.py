"""Independent float64 numpy implementation of SPEC.md, gradient included.

The gradient is the closed form of SPEC's "Gradient" section (no autodiff): per-token
g = d loss / d logp, then dlogits = g * (onehot - softmax) / tau, and for the fused level
dhidden = dlogits @ lm_head^T, dlm_head = hidden^T @ dlogits. Written without reference to
grpo_jax so that a bug there is not mirrored here.
"""

from __future__ import annotations

import numpy as np


def _f64(x):
    return np.asarray(x).astype(np.float64)


def logits_of(inputs: dict, level: str, logits_dtype: str = "f32"):
    """f64 logits (fused: hidden @ lm_head, rounded to the input dtype if asked)."""
    if level == "logits":
        return _f64(inputs["logits"])
    hidden = inputs["hidden"]
    z = _f64(hidden) @ _f64(inputs["lm_head"])
    if logits_dtype == "input":
        z = _f64(z.astype(np.float32).astype(hidden.dtype))
    return z


def oracle(inputs: dict, knobs: dict, level: str = "logits") -> dict:
    """All SPEC outputs in float64 (keys as the output names)."""
    tau = knobs.get("temperature", 1.0)
    el, eh = knobs.get("epsilon_low", 0.2), knobs.get("epsilon_high", 0.2)
    beta, delta = knobs.get("beta", 0.0), knobs.get("delta")
    loss_type = knobs.get("loss_type", "grpo")
    is_level = knobs.get("importance_sampling_level", "token")

    z = logits_of(inputs, level, knobs.get("logits_dtype", "f32"))
    ids = np.asarray(inputs["chosen_ids"]).astype(np.int64)
    old, m = _f64(inputs["old_logp"]), _f64(inputs["mask"])
    adv = _f64(inputs["advantages"])[:, None]
    b, t, v = z.shape

    s = z / tau
    smax = s.max(-1, keepdims=True)
    lse = (smax + np.log(np.exp(s - smax).sum(-1, keepdims=True)))[..., 0]
    p = np.exp(s - lse[..., None])
    s_y = np.take_along_axis(s, ids[..., None], -1)[..., 0]
    logp = s_y - lse
    entropy = lse - (p * s).sum(-1)

    # Masked tokens never read their old/ref log-probs (they may be +-1e4 or -inf): their
    # terms use their own logp, so 0 * inf cannot reach the loss.
    old = np.where(m > 0, old, logp)
    n_row = np.maximum(m.sum(-1, keepdims=True), 1.0)
    if is_level == "token":
        log_r = logp - old
    else:
        log_r = np.broadcast_to((m * (logp - old)).sum(-1, keepdims=True) / n_row, logp.shape)
    r = np.exp(log_r)
    r_d = r if delta is None else np.minimum(r, delta)
    r_c = np.clip(r, 1 - el, 1 + eh)
    pg = -np.minimum(r_d * adv, r_c * adv)
    if beta != 0:
        ref = np.where(m > 0, _f64(inputs["ref_logp"]), logp)
        kl = np.exp(ref - logp) - (ref - logp) - 1
        dkl = 1 - np.exp(ref - logp)
    else:
        kl = dkl = np.zeros_like(logp)
    ell = pg + beta * kl
    clipped = ((r < 1 - el) & (adv < 0)) | ((r > 1 + eh) & (adv > 0))

    # Aggregation and its weights w = d loss / d ell.
    if loss_type == "grpo":
        loss = np.mean((m * ell).sum(-1) / n_row[:, 0])
        w = m / (b * n_row)
    elif loss_type == "bnpo":
        n_all = max(m.sum(), 1.0)
        loss = (m * ell).sum() / n_all
        w = m / n_all
    else:
        length = knobs.get("max_completion_length") or t
        loss = (m * ell).sum() / (b * length)
        w = m / (b * length)

    # d pg / d log_r: -A * r_d on the unclipped branch (ties included), else 0.
    unclipped = (r_d * adv <= r_c * adv)
    if delta is not None:
        unclipped &= r <= delta
    dpg = np.where(unclipped, -adv * r_d, 0.0)
    if is_level == "token":
        g = w * (dpg + beta * dkl)
    else:
        # log_r is shared by the row: d log_r / d logp_t = m_t / max(sum m, 1).
        row = (w * dpg).sum(-1, keepdims=True)
        g = row * m / n_row + w * beta * dkl
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, ids[..., None], 1.0, -1)
    dlogits = g[..., None] * (onehot - p) / tau

    out = {"loss": loss, "per_token_logp": logp, "per_token_loss": ell, "kl": kl,
           "clipped": clipped.astype(np.float64), "entropy": entropy}
    if level == "logits":
        out["dlogits"] = dlogits
    else:
        out["dhidden"] = dlogits @ _f64(inputs["lm_head"]).T
        out["dlm_head"] = np.einsum("bth,btv->hv", _f64(inputs["hidden"]), dlogits)
    return out
