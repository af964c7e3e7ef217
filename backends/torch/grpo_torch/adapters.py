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


#: SPEC's knobs a per-token kernel may take; one it does not take must be at its default
#: for a case to run (else the case is unsupported, with the knob named).
KNOB_DEFAULTS = {"temperature": 1.0, "delta": None, "importance_sampling_level": "token",
                 "logits_dtype": "f32", "max_completion_length": None}


def from_per_token_loss_fn(name: str, fn: Callable[..., Any], *, level: str,
                           takes: tuple = ("epsilon_low", "epsilon_high", "beta"),
                           returns: str = "loss_logp", supports=None,
                           options: Optional[dict] = None) -> Implementation:
    """A kernel that computes the per-token GRPO loss itself: ``fn(*head, chosen_ids,
    old_logp, ref_logp, advantages, mask, knobs, options)`` returns the [B, T] per-token
    loss, and with ``returns="loss_logp"`` the [B, T] logp too. The suite averages it by
    SPEC's loss type (``contract.aggregate``), so the kernel's own clip, KL and τ are
    judged. ``takes``: the knobs it honours; a case that sets another away from its
    default is unsupported, with the knob named."""
    if level not in ("logits", "fused"):
        raise ValueError(f"level must be 'logits' or 'fused', got {level!r}")
    if returns not in ("loss", "loss_logp"):
        raise ValueError(f"returns must be 'loss' or 'loss_logp', got {returns!r}")

    def unsupported(problem, knobs, opts):
        for knob, default in KNOB_DEFAULTS.items():
            if knob not in takes and knobs.get(knob) != default and not (
                    knob == "logits_dtype" and problem.level == "logits"):
                return f"{knob} = {knobs.get(knob)}: {name} takes no {knob}"
        return supports(problem, knobs, opts) if supports is not None else None

    def loss(head, batch, knobs, opts):
        args = ((head["logits"],) if level == "logits" else (head["hidden"], head["lm_head"]))
        out = fn(*args, batch["chosen_ids"], batch["old_logp"], batch["ref_logp"],
                 batch["advantages"], batch["mask"], knobs, opts)
        per_token, logp = (out if returns == "loss_logp" else (out, None))
        mask = batch["mask"].float()
        total = contract.aggregate(per_token.float(), mask, knobs)
        metrics = {"per_token_loss": per_token.detach().float()}
        if logp is not None:
            metrics["per_token_logp"] = logp.detach().float()
        return total, metrics

    return Implementation(name=name, loss=loss, levels=(level,), supports=unsupported,
                          default_options=dict(options or {}))


def from_loss_module(name: str, build: Callable[..., Any], call: Callable[..., Any], *,
                     levels: tuple = ("fused",), supports=None,
                     options: Optional[dict] = None) -> Implementation:
    """An ``nn.Module`` loss called as its library documents it: ``build(knobs, options,
    (B, T))`` makes the module with the suite's knobs mapped onto its own arguments (the
    case's B and T for those that need them, e.g. a max completion length), and
    ``call(module, head, batch, knobs)`` calls it and returns the scalar loss, or
    ``(loss, metrics)`` with the [B, T] metrics the module gives. Its own forward and
    backward run; its averaging is judged."""

    def loss(head, batch, knobs, opts):
        out = call(build(knobs, opts, tuple(batch["mask"].shape)), head, batch, knobs)
        return out if isinstance(out, tuple) else (out, {})

    return Implementation(name=name, loss=loss, levels=tuple(levels), supports=supports,
                          default_options=dict(options or {}))
