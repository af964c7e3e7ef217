"""Adapters: a whole SPEC implementation from a partial kernel.

Users often have only the hot part as a kernel: a log-softmax / logsumexp / cross-entropy
over the vocabulary. An adapter wraps that function and builds everything else of SPEC
around it -- the GRPO terms and aggregation (``impls.grpo_math``: ratio, tie rule, δ, k3
KL, loss types, sequence level, masking) and the gradients, by ``jax.value_and_grad``
through the user's function (so its ``custom_vjp``, if any, is what runs backwards).

    from grpo_jax.adapters import from_logits_fn, from_fused_fn

    IMPLEMENTATION = from_logits_fn(my_logp, id="my_logp")          # (logits, ids) -> logp
    CE = from_fused_fn(my_ce, id="my_ce", returns="cross_entropy")  # (hidden, lm_head, ids) -> CE

A kernel that computes GRPO's per-token loss itself (clipping in its own VJP, ε and τ in
its own config) goes through ``from_per_token_loss_fn`` (module
``per_token_loss_adapter``, re-exported here); a library function that computes the
whole aggregated loss (tunix's ``grpo_loss_fn``) through ``from_loss_fn`` (module
``loss_adapter``, re-exported here).

The function is called with SPEC's shapes: logits [B, T, V] (or [B*T, V] with
``flatten=True``), hidden [B, T, H] / lm_head [H, V], chosen_ids [B, T] int32, plus the
implementation's resolved ``impl_options`` as keyword arguments, plus ``temperature=τ``
if it has a parameter of that name. Without one, cases with τ ≠ 1 are reported
unsupported (never computed some other way). It returns per-token values [B, T]
(or [B*T]):

  returns="logp"           log p(chosen) = s_y − logsumexp(s)
  returns="logp_entropy"   (logp, entropy)
  returns="cross_entropy"  −log p(chosen)

Several devices: batch sharding runs the function on each device's rows (shard_map) and
the GRPO terms on the global arrays; vocab sharding needs a per_token core (ignored).

Outputs a function cannot produce (entropy, unless ``returns="logp_entropy"``) are listed
in ``Implementation.not_provided``: the module returns zeros there, the manifest says
"not provided", and the suite reports them as such and never gates them.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping, Optional

import jax
import jax.numpy as jnp

from .impls import grpo_math
from .impls.interface import Capabilities, Implementation
from .spec import LOGITS_DTYPES, Knobs, Problem, RequestError

from .per_token_loss_adapter import from_per_token_loss_fn  # noqa: F401 (public API)
from .loss_adapter import StandInModel, Unsupported, from_loss_fn  # noqa: F401 (public API)

f32 = jnp.float32
RETURNS = ("logp", "logp_entropy", "cross_entropy")


def _takes_temperature(fn: Callable) -> bool:
    try:
        return "temperature" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _adapt(fn: Callable, *, id: str, description: str, level: str, returns: str,
           flatten: bool, capabilities: Optional[Capabilities],
           default_options: Optional[Mapping[str, Any]],
           logits_dtypes: Iterable[str]) -> Implementation:
    if returns not in RETURNS:
        raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")
    temperature_kw = _takes_temperature(fn)
    if capabilities is None:
        capabilities = Capabilities(
            levels=frozenset({level}), temperature=temperature_kw,
            logits_dtypes=frozenset(logits_dtypes))
    elif level not in capabilities.levels:
        raise ValueError(f"capabilities of {id!r} must include level {level!r}")

    def per_token(k: Knobs, options: Mapping[str, Any], *args):
        """(logp [B, T] f32, entropy [B, T] f32 or None) from the user's function (B and T
        from the ids: it also runs on a batch shard)."""
        b, t = args[-1].shape
        if flatten:
            head = args[0]
            args = (head.reshape(b * t, head.shape[-1]), *args[1:-1], args[-1].reshape(b * t))
        kw = dict(options)
        if temperature_kw:
            kw["temperature"] = k.temperature
        out = fn(*args, **kw)
        ent = None
        if returns == "logp_entropy":
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise RequestError(f"{id}: returns='logp_entropy' but the function returned "
                                   f"{type(out).__name__}, not a (logp, entropy) pair")
            out, ent = out
        logp = -out if returns == "cross_entropy" else out
        if tuple(logp.shape) not in ((b, t), (b * t,)):
            raise RequestError(f"{id}: the function returned shape {tuple(logp.shape)}, "
                               f"expected ({b}, {t}) or ({b * t},) per-token values")
        logp = logp.reshape(b, t).astype(f32)
        if ent is not None:
            ent = jax.lax.stop_gradient(ent.reshape(b, t).astype(f32))
        return logp, ent

    nhead = 1 if level == "logits" else 2

    def core_of(k: Knobs, options: Mapping[str, Any]):
        def core(*head_ids):
            logp, ent = per_token(k, options, *head_ids)
            return logp, jnp.zeros_like(logp) if ent is None else ent  # placeholder
        return core

    def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
        if problem.level != level:
            raise ValueError(f"{id} implements the {level} level only")
        return grpo_math.spec_function(core_of(k, options), k, nhead=nhead)

    def build_batch_sharded(problem: Problem, k: Knobs, options: Mapping[str, Any], batch_map):
        """Batch sharding: the user's function on each device's rows (shard_map), the GRPO
        terms and the aggregation on the global arrays (global normalisers)."""
        core = batch_map(core_of(k, options), nhead + 1, (1,) if level == "fused" else ())
        return grpo_math.spec_function(core, k, nhead=nhead)

    return Implementation(
        id=id, description=description or f"adapter ({returns}) around {fn.__qualname__}",
        build=build, capabilities=capabilities, default_options=dict(default_options or {}),
        build_batch_sharded=build_batch_sharded,
        not_provided=frozenset() if returns == "logp_entropy" else frozenset({"entropy"}))


def from_logits_fn(fn: Callable, *, id: str, description: str = "", returns: str = "logp",
                   flatten: bool = False, capabilities: Optional[Capabilities] = None,
                   default_options: Optional[Mapping[str, Any]] = None) -> Implementation:
    """A logits-level implementation from ``fn(logits, chosen_ids, **options)``."""
    return _adapt(fn, id=id, description=description, level="logits", returns=returns,
                  flatten=flatten, capabilities=capabilities, default_options=default_options,
                  logits_dtypes=LOGITS_DTYPES)


def from_fused_fn(fn: Callable, *, id: str, description: str = "", returns: str = "logp",
                  capabilities: Optional[Capabilities] = None,
                  default_options: Optional[Mapping[str, Any]] = None,
                  logits_dtypes: Iterable[str] = ("f32",)) -> Implementation:
    """A fused-level implementation from ``fn(hidden, lm_head, chosen_ids, **options)``.

    ``logits_dtypes``: the SPEC ``logits_dtype`` values the function computes (default
    "f32": logits accumulated and used in f32); other cases are reported unsupported."""
    return _adapt(fn, id=id, description=description, level="fused", returns=returns,
                  flatten=False, capabilities=capabilities, default_options=default_options,
                  logits_dtypes=logits_dtypes)
