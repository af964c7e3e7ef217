"""Liger-Kernel's ``LigerFusedLinearGRPOLoss`` (liger-kernel 0.8.5) as a grpo_torch
implementation, called as the library documents it, with the suite's knobs mapped onto its
own arguments and nothing else.

- ``_input`` is hidden [B, T, H] and ``lin_weight`` the [V, H] LM head: our lm_head [H, V]
  transposed (autograd takes dlm_head back through the transpose).
- ``compiled=False``: torch.compile needs a C compiler toolchain for inductor on cpu; the
  eager path is the same function.
- Liger returns the loss and batch-level metrics (mean KL, clip fraction): every per-token
  output is "not provided".
- ``max_completion_length``: Liger's dr_grpo requires it; SPEC's default is T.
"""

from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

from grpo_torch.interface import Implementation


def _loss(head, batch, knobs, options):
    t = batch["mask"].shape[1]
    mcl = knobs.get("max_completion_length")
    if knobs["loss_type"] == "dr_grpo" and mcl is None:
        mcl = t
    loss_fn = LigerFusedLinearGRPOLoss(
        beta=knobs["beta"],
        compiled=False,
        use_ref_model=True,
        chunk_size=1,
        epsilon_low=knobs["epsilon_low"],
        epsilon_high=knobs["epsilon_high"],
        loss_type=knobs["loss_type"],
        max_completion_length=mcl,
        importance_sampling_level=knobs["importance_sampling_level"],
        temperature=knobs["temperature"],
        delta=knobs.get("delta"),
    )
    loss, _metrics = loss_fn(
        head["hidden"],
        head["lm_head"].t(),
        batch["chosen_ids"],
        batch["mask"],
        batch["advantages"],
        ref_per_token_logps=batch["ref_logp"],
        old_per_token_logps=batch["old_logp"],
    )
    return loss, {}


def _supports(problem, knobs, options):
    if knobs["logits_dtype"] != "f32":
        return ("logits_dtype input: LigerFusedLinearGRPOLoss has no setting for it (it "
                "computes its logits as it does, see docs/external.md)")
    return None


FUSED = Implementation(name="liger_fused_linear_grpo", loss=_loss, levels=("fused",),
                       supports=_supports)
