"""The MLLM-JAX GRPO kernels (github.com/demon2036/MLLM-JAX, branch feat-kernel,
``plugins/training/kernels/``) as SPEC implementations, through the public per-token-loss
adapter only (docs/external.md, "A kernel that computes the per-token loss").

Their code is not in this repository: point ``MLLM_JAX_DIR`` at your checkout (or put
the checkout on the config entry's ``pythonpath``).

Both kernels return ``(per_token_loss, per_token_logp)``; they take no mask, no ref_logp
and no β; advantages per sequence; ε and τ in a frozen config object. Their temperature
is ``log_softmax(z)[y] / τ``, not SPEC's ``log_softmax(z / τ)[y]``: declared below, so
τ ≠ 1 cases are reported "convention differs", never judged against SPEC.
"""

from __future__ import annotations

import os
import sys

_checkout = os.environ.get("MLLM_JAX_DIR")
if _checkout:
    sys.path.insert(0, _checkout)
try:
    from plugins.training.kernels.grpo_fused_lm_head import (
        GRPOLmHeadFusedConfig, grpo_per_token_loss_fused_lm_head)
    from plugins.training.kernels.grpo_loss_pallas import (
        GRPOKernelConfig, grpo_per_token_loss_pallas)
except ImportError as exc:
    raise ImportError(
        f"MLLM-JAX's kernels do not import ({exc}); set MLLM_JAX_DIR to a checkout of "
        f"https://github.com/demon2036/MLLM-JAX (branch feat-kernel)") from None

from grpo_jax.adapters import from_per_token_loss_fn

TEMPERATURE = "log_softmax(z)[y] / τ (SPEC: log_softmax(z / τ)[y])"
KNOBS = ("epsilon_low", "epsilon_high", "temperature")


def _logits_config(knobs, options, platform):
    return {"cfg": GRPOKernelConfig(
        block_size=options["block_size"], time_block=options["time_block"],
        epsilon_low=knobs.epsilon_low, epsilon_high=knobs.epsilon_high,
        temperature=knobs.temperature, bwd_impl=options["bwd_impl"])}


def _fused_config(knobs, options, platform):
    return {"cfg": GRPOLmHeadFusedConfig(
        vocab_block_size=options["vocab_block_size"],
        epsilon_low=knobs.epsilon_low, epsilon_high=knobs.epsilon_high,
        temperature=knobs.temperature,
        # SPEC's logits_dtype "input" rounds the logits to the input dtype; "f32" keeps them.
        cast_logits_to_hidden_dtype=knobs.logits_dtype == "input")}


LOGITS = from_per_token_loss_fn(
    grpo_per_token_loss_pallas, id="mllm_logits", level="logits",
    inputs={"old_per_token_logps": "old_logp"}, knobs=KNOBS,
    conventions={"temperature": TEMPERATURE}, config_factory=_logits_config,
    default_options={"block_size": 2048, "time_block": 8, "bwd_impl": "pallas"},
    description="MLLM-JAX grpo_per_token_loss_pallas (logits level)")

FUSED = from_per_token_loss_fn(
    grpo_per_token_loss_fused_lm_head, id="mllm_fused", level="fused",
    inputs={"hidden_states": "hidden", "lm_head_kernel": "lm_head",
            "old_per_token_logps": "old_logp"},
    knobs=(*KNOBS, "logits_dtype"), conventions={"temperature": TEMPERATURE},
    config_factory=_fused_config, default_options={"vocab_block_size": 2048},
    description="MLLM-JAX grpo_per_token_loss_fused_lm_head (fused level)")
