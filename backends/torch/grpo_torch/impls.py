"""The torch implementations the suite ships, by id.

``torch_baseline``: SPEC's loss in plain torch, the torch family's baseline: the logits
(or hidden @ lm_head, accumulated in f32 from the 16-bit values) in f32, an f32
log-softmax of z/τ, the chosen ids gathered, and ``contract.grpo_from_logp``. Its
gradient is autograd's: one rounding to the input dtype, at the cast back.
"""

from __future__ import annotations

import torch

from . import contract
from .interface import Implementation

f32 = torch.float32


def fused_logits(hidden, lm_head, logits_dtype: str):
    """hidden @ lm_head in f32 (16-bit values multiply exactly in f32); rounded to the
    input dtype in the forward pass only when ``logits_dtype`` is ``input`` (SPEC's
    gradient is the unrounded one)."""
    z = hidden.to(f32) @ lm_head.to(f32)
    if logits_dtype == "input" and lm_head.dtype != f32:
        z = z + (z.to(lm_head.dtype).to(f32) - z).detach()
    return z


def baseline_loss(head, batch, knobs, options):
    """SPEC's loss and every metric."""
    z = head["logits"] if "logits" in head else fused_logits(head["hidden"], head["lm_head"],
                                                             knobs["logits_dtype"])
    logp, entropy = contract.logp_and_entropy(z, batch["chosen_ids"], knobs["temperature"])
    loss, metrics = contract.grpo_from_logp(logp, batch["old_logp"], batch["ref_logp"],
                                            batch["advantages"], batch["mask"], knobs)
    metrics["per_token_logp"] = logp.detach()
    metrics["entropy"] = entropy
    return loss, metrics


IMPLEMENTATIONS = {
    "torch_baseline": Implementation(name="torch_baseline", loss=baseline_loss),
}
