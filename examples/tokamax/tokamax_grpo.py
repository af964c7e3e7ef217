"""tokamax's fused linear softmax cross-entropy (PyPI tokamax 0.0.17,
``tokamax.linear_softmax_cross_entropy_loss``) as SPEC fused-level implementations, one per
tokamax implementation, through the public adapter ``from_fused_fn`` only.

tokamax takes x [N, H], labels [N] and weights [H, V] and returns the per-token
cross-entropy with ``reduction="none"``; the adapter builds the GRPO terms and the
gradients by differentiating it (tokamax's own VJP runs backwards). It has no temperature
parameter, so τ ≠ 1 cases are unsupported; its logits are f32 (SPEC logits_dtype f32).
"""

import tokamax

from grpo_jax.adapters import from_fused_fn


def cross_entropy(hidden, lm_head, chosen_ids, implementation):
    b, t, h = hidden.shape
    ce = tokamax.linear_softmax_cross_entropy_loss(
        hidden.reshape(b * t, h), chosen_ids.reshape(b * t), lm_head,
        reduction="none", implementation=implementation)
    return ce.reshape(b, t)


XLA = from_fused_fn(cross_entropy, id="tokamax_xla", returns="cross_entropy",
                    default_options={"implementation": "xla"},
                    description="tokamax linear_softmax_cross_entropy_loss, implementation xla")
CHUNKED_XLA = from_fused_fn(cross_entropy, id="tokamax_chunked_xla", returns="cross_entropy",
                            default_options={"implementation": "chunked_xla"},
                            description="tokamax linear_softmax_cross_entropy_loss, chunked_xla")
