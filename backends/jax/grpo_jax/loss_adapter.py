"""The whole-loss adapter: a SPEC implementation from a library function that computes the
aggregated loss itself (public API: ``grpo_jax.adapters.from_loss_fn``).

Libraries such as tunix (``tunix.rl.algo_core.grpo_loss_fn``) compute the whole GRPO loss:
they call the model for the logits, build the per-token terms, average them by their own
aggregation rule and return the scalar loss with a dict of metrics. Judging such a loss
must not swap in the suite's averaging (which ``from_per_token_loss_fn`` would), so this
adapter calls the function as it is and differentiates the scalar it returns:

- **Two forms.** ``form="arrays"``: each parameter of ``fn`` receives the SPEC input or
  knob of its name (or of the name ``inputs`` maps it to): ``logits`` | ``hidden``,
  ``lm_head``, ``chosen_ids``, ``old_logp``, ``ref_logp``, ``mask``, ``advantages``
  ([B]) or ``advantages_per_token`` ([B, T]), and the knobs by name. ``form="model"``:
  the parameter ``model`` receives a stand-in model instead of the head arrays
  (``StandInModel``: calling it returns the case's logits [B, T, V]; at the fused level
  it computes hidden @ lm_head accumulated in f32, rounded to the input dtype for
  ``logits_dtype: input``). ``model_factory(stand_in)`` wraps it in the library's own
  model type (e.g. a ``flax.nnx.Module`` whose parameters hold ``stand_in.head``).
- **Its config.** ``config_factory(knobs, options, platform) -> dict`` maps the suite's
  knobs onto the library's own config (more keyword arguments of ``fn``). It may raise
  ``Unsupported("why")`` for a knob value the library has no setting for: the case is
  then ignored with that reason, never approximated.
- **Knobs it takes.** ``knobs``: the knob names the library honours (through parameters
  or the factory). A case that sets any other knob away from its default is unsupported
  with the knob's name.
- **Outputs.** ``fn`` returns the scalar loss, or ``(loss, metrics)``. ``metrics`` maps
  SPEC per-token outputs (``per_token_logp``, ``per_token_loss``, ``kl``, ``clipped``,
  ``entropy``) to keys of the function's metrics dict ([B, T] arrays); every other
  per-token output is **not provided**: never recomputed by the suite, never gated.
- **Gradients** by ``jax.value_and_grad`` of the returned loss through the library's own
  code (its custom VJPs, if any, are what run backwards).
- **Several devices.** Batch sharding runs the function on the global arrays, with the
  inputs split on B (``jax.jit`` with shardings: XLA partitions the library's loss, as in
  a multi-device training step); vocab sharding is not offered.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping, Optional

import jax
import jax.numpy as jnp

from .impls.interface import Capabilities, Implementation
from .spec import (IS_LEVELS, LOGITS_DTYPES, LOSS_TYPES, PER_TOKEN_OUTPUTS, Knobs,
                   Problem, RequestError)

f32 = jnp.float32
FORMS = ("arrays", "model")
HEADS = {"logits": ("logits",), "fused": ("hidden", "lm_head")}
TENSORS = ("chosen_ids", "old_logp", "ref_logp", "mask", "advantages", "advantages_per_token")
KNOBS = ("epsilon_low", "epsilon_high", "temperature", "beta", "delta", "loss_type",
         "max_completion_length", "importance_sampling_level", "logits_dtype")


class Unsupported(Exception):
    """Raised by a ``config_factory`` for a knob value the library cannot express; the
    message is the case's "not supported" reason."""


class StandInModel:
    """The model a whole-loss function calls: it returns the case's logits [B, T, V].

    ``head`` holds the differentiated arrays (logits, or hidden and lm_head), ``logits_of``
    the pure function from them to the logits; calling the model is
    ``logits_of(*head)``, whatever arguments the library passes (token ids, positions,
    caches: the case's logits do not depend on them)."""

    def __init__(self, level: str, head: tuple, logits_dtype: str = "f32"):
        self.level = level
        self.head = tuple(head)
        self.logits_dtype = logits_dtype

    def logits_of(self, *head):
        """The logits from head arrays: as given (logits level), or hidden @ lm_head with
        f32 accumulation, rounded to the input dtype when ``logits_dtype`` is "input"."""
        if self.level == "logits":
            return head[0]
        hidden, lm_head = head
        z = jnp.einsum("bth,hv->btv", hidden, lm_head, preferred_element_type=f32,
                       precision=jax.lax.Precision.HIGHEST)
        return z.astype(hidden.dtype) if self.logits_dtype == "input" else z

    def __call__(self, *args, **kwargs):
        return self.logits_of(*self.head)


def _parameters(fn: Callable) -> tuple[list[str], bool]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot read the parameters of {fn!r}: {exc}") from None
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def _binding(fn: Callable, level: str, form: str, inputs: Mapping[str, str]) -> dict[str, str]:
    """fn parameter -> source name (a SPEC tensor, a knob or "model")."""
    names, var_kw = _parameters(fn)
    heads = ("model",) if form == "model" else HEADS[level]
    sources = (*heads, *TENSORS, *KNOBS)
    for param, source in inputs.items():
        if source not in sources:
            raise ValueError(f"inputs[{param!r}] = {source!r} is not one of "
                             f"{', '.join(sources)}")
        if param not in names and not var_kw:
            raise ValueError(f"inputs names {param!r}, which is not a parameter of "
                             f"{getattr(fn, '__qualname__', fn)} ({', '.join(names)})")
    bound = {p: inputs.get(p, p) for p in names if inputs.get(p, p) in sources}
    bound.update({p: s for p, s in inputs.items() if p not in bound})
    missing = [s for s in heads if s not in bound.values()]
    if missing:
        raise ValueError(f"{getattr(fn, '__qualname__', fn)} receives no {', '.join(missing)}: "
                         f"name its parameters so, or map them with inputs={{param: source}}")
    return bound


def from_loss_fn(
        fn: Callable, *, id: str, level: str, form: str = "arrays",
        inputs: Optional[Mapping[str, str]] = None, knobs: Iterable[str] = (),
        config_factory: Optional[Callable[[Knobs, Mapping[str, Any], str], Mapping[str, Any]]] = None,
        metrics: Optional[Mapping[str, str]] = None,
        model_factory: Optional[Callable[[StandInModel], Any]] = None,
        description: str = "", default_options: Optional[Mapping[str, Any]] = None,
        logits_dtypes: Iterable[str] = ("f32",),
        capabilities: Optional[Capabilities] = None) -> Implementation:
    """A SPEC implementation from a function that returns the aggregated loss (see the
    module doc). ``capabilities`` narrows what the adapter derives; it never widens it."""
    if level not in HEADS:
        raise ValueError(f"level must be 'logits' or 'fused', got {level!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if model_factory is not None and form != "model":
        raise ValueError("model_factory is for form='model' only")
    bound = _binding(fn, level, form, dict(inputs or {}))
    taken = set(knobs) | {s for s in bound.values() if s in KNOBS}
    unknown = sorted(taken - set(KNOBS))
    if unknown:
        raise ValueError(f"knobs: unknown knob names {unknown} (known: {', '.join(KNOBS)})")
    if not {"epsilon_low", "epsilon_high"} <= taken:
        raise ValueError(f"{id}: the loss must take epsilon_low and epsilon_high (a parameter "
                         f"of that name, or through config_factory: list them in knobs=)")
    metrics = dict(metrics or {})
    for name in metrics:
        if name not in PER_TOKEN_OUTPUTS:
            raise ValueError(f"metrics: {name!r} is not a SPEC per-token output (one of "
                             f"{', '.join(PER_TOKEN_OUTPUTS)})")
    derived = Capabilities(
        levels=frozenset({level}),
        loss_types=frozenset(LOSS_TYPES if "loss_type" in taken else ("grpo",)),
        importance_sampling_levels=frozenset(
            IS_LEVELS if "importance_sampling_level" in taken else ("token",)),
        # The stand-in model of the model form computes either logits dtype itself.
        logits_dtypes=frozenset(LOGITS_DTYPES if "logits_dtype" in taken or form == "model"
                                else logits_dtypes),
        delta="delta" in taken, beta="beta" in taken, temperature="temperature" in taken)
    if capabilities is not None:
        derived = Capabilities(**{
            f: (getattr(derived, f) & getattr(capabilities, f)
                if isinstance(getattr(derived, f), frozenset)
                else getattr(derived, f) and getattr(capabilities, f))
            for f in derived.__dataclass_fields__})
    nhead = len(HEADS[level])

    def config(k: Knobs, options: Mapping[str, Any], platform: str) -> dict:
        return dict(config_factory(k, options, platform)) if config_factory else dict(options)

    def support_reason(p: Problem, k: Knobs, options: Mapping[str, Any]) -> Optional[str]:
        if k.max_completion_length is not None and "max_completion_length" not in taken:
            return "not supported: max_completion_length (the loss has no setting for L)"
        try:
            config(k, options, p.platform)
        except Unsupported as exc:
            return f"not supported: {exc}"
        return None

    def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
        extra = config(k, options, problem.platform)

        def loss_fn(*arrays):
            head = arrays[:nhead]
            ids, old_logp, ref_logp, advantages, mask = arrays[nhead:]
            b, t = ids.shape
            values = dict(zip(HEADS[level], head))
            values.update(chosen_ids=ids.astype(jnp.int32), old_logp=old_logp,
                          ref_logp=ref_logp, mask=mask, advantages=advantages,
                          advantages_per_token=jnp.broadcast_to(advantages[:, None], (b, t)))
            if form == "model":
                stand_in = StandInModel(level, head, k.logits_dtype)
                values["model"] = model_factory(stand_in) if model_factory else stand_in
            kw = {}
            for param, source in bound.items():
                if param in extra:
                    continue
                kw[param] = values[source] if source in values else getattr(k, source)
            out = fn(**kw, **extra)
            loss, found = (out if isinstance(out, (tuple, list)) and len(out) == 2
                           else (out, {}))
            loss = jnp.asarray(loss)
            if loss.shape != ():
                raise RequestError(f"{id}: the loss function returned shape "
                                   f"{tuple(loss.shape)}, not a scalar loss")
            per_token = {}
            for name, key in metrics.items():
                if not isinstance(found, Mapping) or key not in found:
                    have = sorted(found) if isinstance(found, Mapping) else type(found).__name__
                    raise RequestError(f"{id}: metrics maps {name} to {key!r}, which the loss "
                                       f"function's metrics do not have ({have})")
                x = jnp.asarray(found[key])
                if tuple(x.shape) != (b, t):
                    raise RequestError(f"{id}: metric {key!r} ({name}) has shape "
                                       f"{tuple(x.shape)}, expected ({b}, {t})")
                per_token[name] = jax.lax.stop_gradient(x.astype(f32))
            return loss.astype(f32), per_token

        def spec_fn(*inputs):
            (loss, per_token), grads = jax.value_and_grad(
                loss_fn, argnums=tuple(range(nhead)), has_aux=True)(*inputs)
            b, t = inputs[nhead].shape
            zeros = jnp.zeros((b, t), f32)  # placeholders of outputs not provided
            return (loss, *(per_token.get(n, zeros) for n in PER_TOKEN_OUTPUTS),
                    *(g.astype(x.dtype) for g, x in zip(grads, inputs)))
        return spec_fn

    def build_batch_sharded(problem: Problem, k: Knobs, options: Mapping[str, Any], batch_map):
        """The whole loss on the global arrays: the exporter's shardings split them on B
        and XLA partitions the library's code (every normaliser stays the library's)."""
        return build(problem, k, options)

    return Implementation(
        id=id, description=description or f"whole-loss adapter ({form}) around "
                                          f"{getattr(fn, '__qualname__', fn)}",
        build=build, capabilities=derived, default_options=dict(default_options or {}),
        extra_check=support_reason, build_batch_sharded=build_batch_sharded,
        not_provided=frozenset(PER_TOKEN_OUTPUTS) - set(metrics))


__all__ = ["from_loss_fn", "StandInModel", "Unsupported"]
