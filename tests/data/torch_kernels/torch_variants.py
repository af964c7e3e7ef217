"""Torch implementations for tests/torch.rs: deliberately wrong ones that must fail, and
ones that raise, abort or hang, each of which must cost one trial and no more."""

import os
import time

import torch

from grpo_torch import contract
from grpo_torch.impls import baseline_loss
from grpo_torch.adapters import from_fused_fn, from_loss_module, from_per_token_loss_fn
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


_calls = [0]


def _flaky(head, batch, knobs, options):
    """SPEC's loss, doubled on the worker's first call only: a failure that does not
    reproduce (tests/shrink.rs)."""
    _calls[0] += 1
    loss, m = baseline_loss(head, batch, knobs, options)
    return (2 * loss if _calls[0] == 1 else loss), m


K1 = Implementation(name="k1", loss=_k1_loss)
FLAKY = Implementation(name="flaky", loss=_flaky)
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


def _per_token(logits, ids, old_logp, ref_logp, advantages, mask, knobs, options, kl=True):
    """SPEC's per-token loss from an f32 log-softmax (and the logp), as a kernel gives it."""
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None])[..., 0]
    log_r = contract.log_ratio(logp, old_logp, mask, "token")
    pg, _ = contract.clipped_pg(log_r, advantages, knobs)
    if kl and knobs["beta"] != 0:
        pg = pg + knobs["beta"] * contract.k3_kl(logp, ref_logp, mask)
    return pg, logp


PER_TOKEN = from_per_token_loss_fn("per_token", _per_token, level="logits")
PER_TOKEN_NO_KL = from_per_token_loss_fn(
    "per_token_no_kl", lambda *a: _per_token(*a, kl=False), level="logits")


class _SpecLoss(torch.nn.Module):
    """SPEC's loss as an nn.Module; ``bnpo_rule`` averages every loss type by the batch's
    token count (bnpo's rule)."""

    def __init__(self, knobs, bnpo_rule=False):
        super().__init__()
        self.knobs = dict(knobs, loss_type="bnpo") if bnpo_rule else knobs

    def forward(self, hidden, lm_head, ids, old_logp, ref_logp, advantages, mask):
        head = {"hidden": hidden, "lm_head": lm_head}
        batch = {"chosen_ids": ids, "old_logp": old_logp, "ref_logp": ref_logp,
                 "advantages": advantages, "mask": mask}
        return baseline_loss(head, batch, self.knobs, {})[0]


def _call(module, head, batch, knobs):
    return module(head["hidden"], head["lm_head"], batch["chosen_ids"], batch["old_logp"],
                  batch["ref_logp"], batch["advantages"], batch["mask"])


MODULE = from_loss_module("module", lambda k, o, s: _SpecLoss(k), _call)
MODULE_BNPO_RULE = from_loss_module("module_bnpo_rule", lambda k, o, s: _SpecLoss(k, True), _call)
