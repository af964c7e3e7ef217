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
- Through ``grpo_torch.adapters.from_loss_module``: ``_build`` makes the module from the
  knobs, ``_call`` calls it as Liger's docs do.
"""

from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

from grpo_torch.adapters import from_fused_fn, from_loss_module
from grpo_torch.interface import Implementation


def _build(knobs, options, shape):
    mcl = knobs.get("max_completion_length")
    return LigerFusedLinearGRPOLoss(
        beta=knobs["beta"],
        compiled=False,
        use_ref_model=True,
        chunk_size=1,
        epsilon_low=knobs["epsilon_low"],
        epsilon_high=knobs["epsilon_high"],
        loss_type=knobs["loss_type"],
        max_completion_length=mcl if mcl is not None else shape[1],
        importance_sampling_level=knobs["importance_sampling_level"],
        temperature=knobs["temperature"],
        delta=knobs.get("delta"),
    )


def _call(module, head, batch, knobs):
    loss, _metrics = module(
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


FUSED = from_loss_module("liger_fused_linear_grpo", _build, _call, levels=("fused",),
                         supports=_supports)


def _triton_loss(head, batch, knobs, options):
    """``triton_grpo_loss`` (liger_kernel.transformers.grpo_loss) on the case's logits: it
    takes (B, T+1, V) logits and drops the last position, so one zero position is appended;
    ``reduce=True`` returns the loss and batch-level metrics (per-token outputs not
    provided). Written from its docstring; not run here (it needs a CUDA device)."""
    import torch
    from liger_kernel.transformers.grpo_loss import triton_grpo_loss

    logits = head["logits"]
    padded = torch.cat([logits, torch.zeros_like(logits[:, :1])], dim=1)
    t = batch["mask"].shape[1]
    mcl = knobs.get("max_completion_length")
    loss, _metrics = triton_grpo_loss(
        padded, batch["old_logp"], batch["ref_logp"], batch["chosen_ids"], batch["advantages"],
        completion_mask=batch["mask"], temperature=knobs["temperature"], beta=knobs["beta"],
        eps_low=knobs["epsilon_low"], eps_high=knobs["epsilon_high"], inplace=False,
        loss_type=knobs["loss_type"],
        max_completion_length=mcl if mcl is not None or knobs["loss_type"] != "dr_grpo" else t,
        importance_sampling_level=knobs["importance_sampling_level"], reduce=True,
        delta=knobs.get("delta"))
    return loss, {}


def _triton_supports(problem, knobs, options):
    if problem.device != "cuda":
        return "triton_grpo_loss runs Triton kernels: cuda only"
    return None


TRITON = Implementation(name="liger_triton_grpo", loss=_triton_loss, levels=("logits",),
                        supports=_triton_supports)


def _flce(hidden, lm_head, ids, knobs, options):
    """``LigerFusedLinearCrossEntropyLoss(reduction="none")`` as a fused cross-entropy
    function: hidden flattened to (B·T, H), our lm_head transposed. Triton kernels, so cuda
    only; written from its signature, not run here (Liger-Kernel#968 reported wrong
    gradients with reduction='none')."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    b, t, h = hidden.shape
    ce = LigerFusedLinearCrossEntropyLoss(reduction="none")(
        lm_head.t(), hidden.reshape(b * t, h), ids.reshape(b * t))
    return ce.reshape(b, t)


def _flce_supports(problem, knobs, options):
    if problem.device != "cuda":
        return "LigerFusedLinearCrossEntropyLoss runs Triton kernels: cuda only"
    if knobs["temperature"] != 1.0:
        return "τ ≠ 1: LigerFusedLinearCrossEntropyLoss has no temperature"
    return None


FLCE = from_fused_fn("liger_flce", _flce, returns="cross_entropy", supports=_flce_supports)
