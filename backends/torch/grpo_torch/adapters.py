"""Adapters from a library's partial kernel to a grpo_torch implementation, mirroring
grpo_jax's: the library computes the per-token log-probability (or cross-entropy) of the
chosen ids, and SPEC's loss around it is the suite's (``contract.grpo_from_logp``), so
its clip, KL and averaging are the contract's; the gradient is autograd's through the
library's own code.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from . import contract
from .interface import Implementation, Problem

RETURNS = ("logp", "cross_entropy")


def _wrap(name: str, fn: Callable[..., Any], returns: str, level: str,
          supports: Optional[Callable[[Problem, Mapping[str, Any], Mapping[str, Any]], Optional[str]]],
          options: Optional[dict]) -> Implementation:
    if returns not in RETURNS:
        raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")

    def loss(head, batch, knobs, opts):
        args = ((head["logits"],) if level == "logits" else (head["hidden"], head["lm_head"]))
        out = fn(*args, batch["chosen_ids"], knobs, opts)
        logp = (-out if returns == "cross_entropy" else out).float()
        total, metrics = contract.grpo_from_logp(logp, batch["old_logp"], batch["ref_logp"],
                                                 batch["advantages"], batch["mask"], knobs)
        metrics["per_token_logp"] = logp.detach()
        return total, metrics

    return Implementation(name=name, loss=loss, levels=(level,), supports=supports,
                          default_options=dict(options or {}))


def from_logits_fn(name: str, fn: Callable[..., Any], *, returns: str = "logp",
                   supports=None, options: Optional[dict] = None) -> Implementation:
    """``fn(logits [B, T, V], chosen_ids [B, T], knobs, options) -> [B, T]`` log-probability
    (or cross-entropy, ``returns="cross_entropy"``) of the chosen ids, at temperature
    ``knobs["temperature"]`` if the library has one (else say so in ``supports``)."""
    return _wrap(name, fn, returns, "logits", supports, options)


def from_fused_fn(name: str, fn: Callable[..., Any], *, returns: str = "logp",
                  supports=None, options: Optional[dict] = None) -> Implementation:
    """``fn(hidden [B, T, H], lm_head [H, V], chosen_ids [B, T], knobs, options) -> [B, T]``
    log-probability (or cross-entropy) of the chosen ids: a fused LM-head kernel."""
    return _wrap(name, fn, returns, "fused", supports, options)
