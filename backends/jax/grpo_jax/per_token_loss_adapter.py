"""The per-token-loss adapter: a whole SPEC implementation from a kernel that computes
GRPO's per-token loss itself (public API: ``grpo_jax.adapters.from_per_token_loss_fn``).

Training repositories often have a kernel of the form
``(logits, chosen_ids, old_logp, advantages) -> (per_token_loss, per_token_logp)``, with
the clipping (and its gradient) inside a custom VJP and ε, τ in a config object of its own.
The adapter calls such a kernel as it is:

- **Inputs by name.** Each parameter of ``fn`` receives the SPEC input or knob of the same
  name, or of the name ``inputs`` maps it to: tensors ``logits`` | ``hidden`` | ``lm_head``,
  ``chosen_ids``, ``old_logp``, ``ref_logp``, ``mask``, ``advantages`` ([B], per sequence)
  or ``advantages_per_token`` ([B, T], the same values broadcast); knobs ``epsilon_low``,
  ``epsilon_high``, ``temperature``, ``beta``, ``delta``, ``importance_sampling_level``,
  ``logits_dtype``; and ``interpret`` (True only on the "cpu" platform, unless
  the entry's options or ``config_factory`` set it).
- **Its own config.** ``config_factory(knobs, options, platform) -> dict`` returns more
  keyword arguments (e.g. ``{"cfg": KernelConfig(epsilon_low=knobs.epsilon_low, ...)}``);
  the entry's ``options`` then go to the factory only. Without a factory, options are
  keyword arguments of ``fn``.
- **Knobs it takes.** ``knobs``: the knob names the kernel honours (by parameter or through
  the factory); default the knob names among ``fn``'s parameters. ε must be among them.
  Cases that set a knob the kernel does not take are unsupported, with the reason:
  τ ≠ 1, δ, sequence-level importance sampling, ``logits_dtype`` (fused level). β ≠ 0 is
  the exception: unless the kernel takes ``beta``, the adapter adds β·KL (SPEC's k3
  estimator of the returned logp), which needs the kernel's VJP to carry the logp
  cotangent; a probe traces it and, if it is dropped, the case is one line saying so.
- **Declared conventions.** ``conventions={"temperature": "log_softmax(z)/τ"}``: the
  kernel takes the knob but means something else by it. Cases that set it are reported
  "convention differs: ..." (ignored with that reason), never computed and passed.
- **Outputs.** ``returns="loss_logp"`` (a pair) or ``"loss_logp_entropy"``. The adapter
  aggregates the per-token loss with the mask by ``loss_type`` (SPEC's weights; masked
  positions are selected out, not multiplied), derives ``kl`` and ``clipped`` from the
  returned logp, and differentiates the loss through ``fn`` (so its VJP is what runs).
  Entropy, unless returned, is not provided (never gated).
- **Several devices.** Batch sharding: the kernel runs on each device's rows
  (``jax.shard_map``), the aggregation on the global arrays, so every normaliser is
  global. Vocab sharding needs a per_token core (each shard's −logsumexp): ignored with
  that reason.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping, Optional

import jax
import jax.numpy as jnp

from .impls import grpo_math
from .impls.interface import Capabilities, Implementation
from .spec import IS_LEVELS, LOGITS_DTYPES, Knobs, Problem, RequestError, input_specs

f32 = jnp.float32
RETURNS = ("loss_logp", "loss_logp_entropy")
HEADS = {"logits": ("logits",), "fused": ("hidden", "lm_head")}
TENSORS = ("chosen_ids", "old_logp", "ref_logp", "mask", "advantages", "advantages_per_token")
KNOBS = ("epsilon_low", "epsilon_high", "temperature", "beta", "delta",
         "importance_sampling_level", "logits_dtype")
# Knobs the adapter itself applies after the kernel (never refused, never passed).
ADAPTER_KNOBS = ("loss_type", "max_completion_length")


def _parameters(fn: Callable) -> tuple[list[str], bool]:
    """(parameter names of ``fn``, whether it takes **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot read the parameters of {fn!r}: {exc}") from None
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def _binding(fn: Callable, level: str, inputs: Mapping[str, str]) -> dict[str, str]:
    """fn parameter -> source name (a SPEC tensor, a knob or "interpret")."""
    names, var_kw = _parameters(fn)
    sources = (*HEADS[level], *TENSORS, *KNOBS, "interpret")
    for param, source in inputs.items():
        if source not in sources:
            raise ValueError(f"inputs[{param!r}] = {source!r} is not a SPEC input or knob "
                             f"(one of {', '.join(sources)})")
        if param not in names and not var_kw:
            raise ValueError(f"inputs names {param!r}, which is not a parameter of "
                             f"{getattr(fn, '__qualname__', fn)} ({', '.join(names)})")
    bound = {p: inputs.get(p, p) for p in names if inputs.get(p, p) in sources}
    bound.update({p: s for p, s in inputs.items() if p not in bound})
    missing = [s for s in (*HEADS[level], "chosen_ids", "old_logp") if s not in bound.values()]
    if missing:
        raise ValueError(f"{getattr(fn, '__qualname__', fn)} receives no {', '.join(missing)}: "
                         f"name its parameters so, or map them with inputs={{param: source}}")
    if not {"advantages", "advantages_per_token"} & set(bound.values()):
        raise ValueError(f"{getattr(fn, '__qualname__', fn)} receives no advantages: map a "
                         f"parameter to 'advantages' ([B]) or 'advantages_per_token' ([B, T])")
    return bound


def _depends_on(jaxpr, index: int) -> bool:
    """Whether any output of ``jaxpr`` is computed from its input ``index`` (a conservative
    data-flow walk: an equation's outputs depend on all of its inputs)."""
    def var_ids(vs):
        return {id(v) for v in vs if type(v).__name__ != "Literal"}
    needed = var_ids(jaxpr.outvars)
    for eqn in reversed(jaxpr.eqns):
        if var_ids(eqn.outvars) & needed:
            needed |= var_ids(eqn.invars)
    return id(jaxpr.invars[index]) in needed


def logp_cotangent_reaches_head(call: Callable, head_structs) -> bool:
    """Trace the VJP of the kernel's logp output alone (abstract shapes, nothing runs):
    True when the head's gradient depends on logp's cotangent. ``call(*head) -> logp``."""
    def vjp_of_logp(ct, *head):
        _, pullback = jax.vjp(call, *head)
        return pullback(ct)
    b_t = jax.eval_shape(call, *head_structs).shape
    closed = jax.make_jaxpr(vjp_of_logp)(jax.ShapeDtypeStruct(b_t, f32), *head_structs)
    return _depends_on(closed.jaxpr, 0)


def from_per_token_loss_fn(
        fn: Callable, *, id: str, level: str, returns: str = "loss_logp",
        inputs: Optional[Mapping[str, str]] = None, knobs: Optional[Iterable[str]] = None,
        config_factory: Optional[Callable[[Knobs, Mapping[str, Any], str], Mapping[str, Any]]] = None,
        conventions: Optional[Mapping[str, str]] = None, description: str = "",
        default_options: Optional[Mapping[str, Any]] = None,
        logits_dtypes: Iterable[str] = ("f32",),
        capabilities: Optional[Capabilities] = None) -> Implementation:
    """A SPEC implementation from a per-token GRPO loss kernel (see the module doc).

    ``level``: "logits" or "fused"; ``logits_dtypes`` (fused level, when the kernel does not
    take ``logits_dtype``): the SPEC values it computes. ``capabilities``: narrows what the
    adapter derives (dtypes, platforms, ...); it never widens it."""
    if level not in HEADS:
        raise ValueError(f"level must be 'logits' or 'fused', got {level!r}")
    if returns not in RETURNS:
        raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")
    bound = _binding(fn, level, dict(inputs or {}))
    taken = set(knobs) if knobs is not None else {s for s in bound.values() if s in KNOBS}
    unknown = sorted(taken - set(KNOBS) - set(ADAPTER_KNOBS))
    if unknown:
        raise ValueError(f"knobs: unknown knob names {unknown} (known: {', '.join(KNOBS)})")
    if not {"epsilon_low", "epsilon_high"} <= taken:
        raise ValueError(f"{id}: the kernel must take epsilon_low and epsilon_high (a parameter "
                         f"of that name, or through config_factory: list them in knobs=)")
    conventions = dict(conventions or {})
    for knob in conventions:
        if knob not in KNOBS:
            raise ValueError(f"conventions: {knob!r} is not a knob (one of {', '.join(KNOBS)})")
    honoured = taken | set(conventions)  # a declared convention is judged by extra_check
    derived = Capabilities(
        levels=frozenset({level}),
        importance_sampling_levels=frozenset(
            IS_LEVELS if "importance_sampling_level" in honoured else ("token",)),
        logits_dtypes=frozenset(LOGITS_DTYPES if "logits_dtype" in honoured else logits_dtypes),
        delta="delta" in honoured,
        temperature="temperature" in honoured)
    if capabilities is not None:
        derived = Capabilities(**{
            f: (getattr(derived, f) & getattr(capabilities, f)
                if isinstance(getattr(derived, f), frozenset)
                else getattr(derived, f) and getattr(capabilities, f))
            for f in derived.__dataclass_fields__})
    defaults = Knobs()

    def convention_reason(p: Problem, k: Knobs, options: Mapping[str, Any]) -> Optional[str]:
        differs = [f"{knob}: {what}" for knob, what in conventions.items()
                   if getattr(k, knob) != getattr(defaults, knob)]
        return f"convention differs: {'; '.join(differs)}" if differs else None

    nhead = len(HEADS[level])
    kernel_beta = "beta" in taken

    def make_call(k: Knobs, options: Mapping[str, Any], platform: str):
        """``call(*head, ids, old_logp, ref_logp, advantages, mask)`` -> the kernel's
        per-token arrays in f32 (shapes from ``ids``: it also runs on a batch shard)."""
        extra = dict(config_factory(k, options, platform)) if config_factory else dict(options)
        interpret = platform == "cpu"  # a GPU never runs Pallas TPU kernels interpreted

        def call(*arrays):
            head = arrays[:nhead]
            ids, old_logp, ref_logp, advantages, mask = arrays[nhead:]
            b, t = ids.shape
            values = dict(zip(HEADS[level], head))
            values.update(chosen_ids=ids, old_logp=old_logp, ref_logp=ref_logp, mask=mask,
                          advantages=advantages,
                          advantages_per_token=jnp.broadcast_to(advantages[:, None], (b, t)))
            kw = {}
            for param, source in bound.items():
                if param in extra:
                    continue
                if source == "interpret":
                    kw[param] = interpret
                elif source in values:
                    kw[param] = values[source]
                else:
                    kw[param] = getattr(k, source)
            out = fn(**kw, **extra)
            want = 3 if returns == "loss_logp_entropy" else 2
            if not isinstance(out, (tuple, list)) or len(out) != want:
                got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
                raise RequestError(f"{id}: returns={returns!r} expects {want} per-token arrays, "
                                   f"the function returned {got}")
            for name, x in zip(("per_token_loss", "per_token_logp", "entropy"), out):
                if tuple(x.shape) != (b, t):
                    raise RequestError(f"{id}: the function's {name} has shape {tuple(x.shape)}, "
                                       f"expected ({b}, {t})")
            return tuple(x.astype(f32) for x in out)
        return call

    def probe(call, problem: Problem, k: Knobs) -> None:
        """With β ≠ 0 added by the adapter: one line if the kernel's VJP drops logp's
        cotangent (traced at the case's shapes; nothing runs)."""
        if k.beta == 0 or kernel_beta:
            return
        b, t = problem.b, problem.t

        def logp_only(*head):
            rest = (jnp.zeros((b, t), jnp.int32), jnp.zeros((b, t), f32),
                    jnp.zeros((b, t), f32), jnp.ones((b,), f32), jnp.ones((b, t), f32))
            return call(*head, *rest)[1]
        structs = [s.struct() for s in input_specs(problem)[:nhead]]
        if not logp_cotangent_reaches_head(logp_only, structs):
            raise RequestError(
                f"{id}: its VJP drops the cotangent of per_token_logp, so the KL term "
                f"(beta = {k.beta:g}) would get no gradient: the kernel must differentiate "
                f"its logp output, or take beta and ref_logp itself (knobs=[..., 'beta'])")

    def spec_function(call, k: Knobs):
        """The SPEC function around ``call``: KL, aggregation (global normalisers: it runs
        on the global arrays), metrics and gradients through the kernel's VJP."""
        def loss_fn(*inputs):
            head = inputs[:nhead]
            ids, old_logp, ref_logp, advantages, mask = inputs[nhead:]
            mask = mask.astype(f32)
            out = call(*head, ids.astype(jnp.int32), old_logp, ref_logp, advantages, mask)
            ptl, logp = out[0], out[1]
            kl = grpo_math.k3_kl(logp, ref_logp, mask) if k.beta != 0 else jnp.zeros_like(logp)
            if k.beta != 0 and not kernel_beta:
                ptl = ptl + k.beta * kl
            loss = grpo_math.aggregate(jnp.where(mask > 0, ptl, 0.0), mask, k)
            sg = jax.lax.stop_gradient
            log_r = grpo_math.log_ratio(sg(logp), old_logp, mask, k.importance_sampling_level)
            clipped = grpo_math.clipped_metric(jnp.exp(log_r), advantages, k)
            entropy = sg(out[2]) if len(out) == 3 else jnp.zeros_like(logp)
            return loss, (sg(logp), sg(ptl), sg(kl), clipped, entropy)

        def spec_fn(*inputs):
            (loss, aux), grads = jax.value_and_grad(
                loss_fn, argnums=tuple(range(nhead)), has_aux=True)(*inputs)
            return (loss, *aux, *(g.astype(x.dtype) for g, x in zip(grads, inputs)))
        return spec_fn

    def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
        call = make_call(k, options, problem.platform)
        probe(call, problem, k)
        return spec_function(call, k)

    def build_batch_sharded(problem: Problem, k: Knobs, options: Mapping[str, Any], batch_map):
        call = make_call(k, options, problem.platform)
        probe(call, problem, k)
        replicated = (1,) if level == "fused" else ()  # lm_head
        return spec_function(batch_map(call, nhead + 5, replicated), k)

    return Implementation(
        id=id, description=description or f"per-token loss adapter around "
                                          f"{getattr(fn, '__qualname__', fn)}",
        build=build, capabilities=derived, default_options=dict(default_options or {}),
        extra_check=convention_reason if conventions else None,
        build_batch_sharded=build_batch_sharded,
        not_provided=frozenset() if returns == "loss_logp_entropy" else frozenset({"entropy"}))
