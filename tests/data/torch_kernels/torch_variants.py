"""Torch implementations for tests/torch.rs: deliberately wrong ones that must fail, and
ones that raise, abort or hang, each of which must cost one trial and no more."""

import os
import time

import torch

from grpo_torch import contract
from grpo_torch.impls import baseline_loss
from grpo_torch.adapters import from_fused_fn
from grpo_torch.interface import Implementation


def _k1_loss(head, batch, knobs, options):
    """The KL term as k1 (logp − ref_logp) instead of SPEC's k3."""
    orig = contract.k3_kl
    contract.k3_kl = lambda logp, ref, mask: torch.where(mask > 0, logp - ref, torch.zeros_like(logp))
    try:
        return baseline_loss(head, batch, knobs, options)
    finally:
        contract.k3_kl = orig


def _bf16_matmul_loss(head, batch, knobs, options):
    """hidden @ lm_head in the input dtype, then cast to f32 (Liger-Kernel#1432's shape)."""
    if "hidden" not in head:
        return baseline_loss(head, batch, knobs, options)
    z = (head["hidden"] @ head["lm_head"]).to(torch.float32)
    logp, entropy = contract.logp_and_entropy(z, batch["chosen_ids"], knobs["temperature"])
    loss, m = contract.grpo_from_logp(logp, batch["old_logp"], batch["ref_logp"],
                                      batch["advantages"], batch["mask"], knobs)
    m["per_token_logp"], m["entropy"] = logp.detach(), entropy
    return loss, m


def _raises(head, batch, knobs, options):
    raise ValueError("a bug in the kernel")


def _aborts(head, batch, knobs, options):
    os.abort()


def _hangs(head, batch, knobs, options):
    time.sleep(3600)


def _logp_only(head, batch, knobs, options):
    """SPEC's loss, giving per_token_logp only of the metrics."""
    loss, m = baseline_loss(head, batch, knobs, options)
    return loss, {"per_token_logp": m["per_token_logp"]}


K1 = Implementation(name="k1", loss=_k1_loss)
BF16_MATMUL = Implementation(name="bf16_matmul", loss=_bf16_matmul_loss)
RAISES = Implementation(name="raises", loss=_raises)
ABORTS = Implementation(name="aborts", loss=_aborts)
HANGS = Implementation(name="hangs", loss=_hangs)
LOGP_ONLY = Implementation(name="logp_only", loss=_logp_only)


def _f32_logp(hidden, lm_head, ids, knobs, options):
    """SPEC's logp: hidden @ lm_head in f32, an f32 log-softmax of z/τ."""
    z = (hidden.float() @ lm_head.float()) / knobs["temperature"]
    return torch.log_softmax(z, -1).gather(-1, ids[..., None])[..., 0]


def _bf16_logp(hidden, lm_head, ids, knobs, options):
    """The product in the input dtype (rounded) before the f32 log-softmax."""
    z = (hidden @ lm_head).float() / knobs["temperature"]
    return torch.log_softmax(z, -1).gather(-1, ids[..., None])[..., 0]


ADAPTED = from_fused_fn("adapted", _f32_logp)
ADAPTED_BF16 = from_fused_fn("adapted_bf16", _bf16_logp)
