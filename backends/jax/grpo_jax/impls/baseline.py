"""``jax_baseline``: the seeds' pure-JAX reference (no kernels).

logits -> f32 -> / temperature -> ``jax.nn.log_softmax`` -> gather chosen ids -> GRPO
(``grpo_math``), differentiated by ``jax.value_and_grad`` w.r.t. the logits (logits level)
or w.r.t. hidden and lm_head (fused level, logits = hidden @ lm_head accumulated in f32,
optionally rounded to the input dtype when ``logits_dtype == "input"``).

Option ``dz_precision`` (fused level, 16-bit inputs): ``"default"`` (jax's VJP: the f32
cotangent dz meets the 16-bit operands at DEFAULT, one bf16 pass on a TPU: the ``bf16``
precision class, 3 single-pass matmuls); ``"x3_dlm_head"`` (dz as three 16-bit terms in
the dlm_head product, one in dhidden's, ``dz_terms``, as the suite's Adam-safe kernels
split it: the ``bf16x3`` class, docs/spec.md "Precision classes"; 5 matmuls); ``"x3"``
(three terms in both: 7). f32 inputs use HIGHEST either way.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ..spec import Knobs, Problem, RequestError
from . import dz_terms, grpo_math
from .interface import Capabilities, Implementation

f32 = jnp.float32


def logp_and_entropy(z, chosen_ids, temperature: float):
    """Per-token log-prob of the chosen ids (differentiable) and entropy (no gradient)."""
    s = z.astype(f32) / temperature
    logp_all = jax.nn.log_softmax(s, axis=-1)
    logp = jnp.take_along_axis(logp_all, chosen_ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
    lp = jax.lax.stop_gradient(logp_all)
    entropy = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
    return logp, entropy


def _loss_from_logits(z, chosen_ids, old_logp, ref_logp, advantages, mask, k: Knobs):
    logp, entropy = logp_and_entropy(z, chosen_ids, k.temperature)
    loss, aux = grpo_math.grpo_from_logp(logp, old_logp, ref_logp, advantages, mask, k)
    aux["per_token_logp"] = jax.lax.stop_gradient(logp)
    aux["entropy"] = entropy
    return loss, aux


def _metrics(aux):
    return (aux["per_token_logp"], aux["per_token_loss"], aux["kl"], aux["clipped"], aux["entropy"])


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def round_to(z, dtype):
    """f32 ``z`` rounded to ``dtype``'s precision and range, kept in f32.

    ``lax.reduce_precision`` rather than ``astype(dtype).astype(f32)``: XLA may drop such a
    convert round trip (``xla_allow_excess_precision``), and did so on CPU inside the fused
    value_and_grad graph. The gradient passes straight through (SPEC's dlogits is unrounded).
    """
    info = jnp.finfo(dtype)
    if info.bits >= 32:
        return z
    return jax.lax.reduce_precision(z, exponent_bits=info.nexp, mantissa_bits=info.nmant)


@round_to.defjvp
def _round_to_jvp(dtype, primals, tangents):
    return round_to(primals[0], dtype), tangents[0]


def matmul_precision(dtype):
    """HIGHEST for f32 operands (DEFAULT is one bf16 pass on a TPU and TF32 on a GPU:
    docs/spec.md, "Precision"); DEFAULT for narrower ones, where it is exact products
    accumulated in f32 already."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == f32 else None


def fused_logits(hidden, lm_head, logits_dtype: str):
    """hidden @ lm_head accumulated in f32, at full precision for f32 inputs (its VJP's two
    matmuls inherit it); rounded to the input dtype (lm_head's: hidden may come in f32
    holding values of that dtype) if asked."""
    z = jnp.einsum("bth,hv->btv", hidden.astype(lm_head.dtype), lm_head,
                   preferred_element_type=f32, precision=matmul_precision(lm_head.dtype))
    if logits_dtype == "input":
        z = round_to(z, lm_head.dtype)
    return z


@jax.custom_vjp
def _logits_f32_dhidden(hidden, lm_head):
    """hidden @ lm_head accumulated in f32, for ``hidden`` in f32 holding values of
    lm_head's (narrower) dtype. Its cotangent w.r.t. hidden comes back in f32, unrounded
    (interface.per_token's promise: the vocab-parallel wrapper sums the shards' partials
    in f32 and rounds once); the plain graph would round it to lm_head's dtype."""
    return jnp.einsum("bth,hv->btv", hidden.astype(lm_head.dtype), lm_head,
                      preferred_element_type=f32)


def _logits_f32_dhidden_fwd(hidden, lm_head):
    return _logits_f32_dhidden(hidden, lm_head), (hidden, lm_head)


def _logits_f32_dhidden_bwd(res, dz):
    hidden, lm_head = res
    # The same contractions as the plain graph's transpose, without the final rounding of
    # dhidden; dlm_head is rounded to its dtype as before.
    dh = jax.lax.dot_general(dz, lm_head, (((2,), (1,)), ((), ())),
                             preferred_element_type=f32)
    dw = jax.lax.dot_general(hidden.astype(lm_head.dtype), dz, (((0, 1), (0, 1)), ((), ())),
                             preferred_element_type=f32)
    return dh.astype(hidden.dtype), dw.astype(lm_head.dtype)


_logits_f32_dhidden.defvjp(_logits_f32_dhidden_fwd, _logits_f32_dhidden_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _logits_dz_terms(hidden, lm_head, terms):
    """hidden @ lm_head accumulated in f32 (16-bit operands), whose backward takes the f32
    cotangent dz as 16-bit terms (``dz_terms``): ``terms`` = (dhidden's, dlm_head's)."""
    return jnp.einsum("bth,hv->btv", hidden.astype(lm_head.dtype), lm_head,
                      preferred_element_type=f32)


def _logits_dz_terms_fwd(hidden, lm_head, terms):
    return _logits_dz_terms(hidden, lm_head, terms), (hidden, lm_head)


def _logits_dz_terms_bwd(terms, res, dz):
    hidden, lm_head = res
    dt = lm_head.dtype
    dh = dz_terms.product_of_terms(
        dz, dt, terms[0],
        lambda t: jax.lax.dot_general(t, lm_head, (((2,), (1,)), ((), ())),
                                      preferred_element_type=f32))
    dw = dz_terms.product_of_terms(
        dz, dt, terms[1],
        lambda t: jax.lax.dot_general(hidden.astype(dt), t, (((0, 1), (0, 1)), ((), ())),
                                      preferred_element_type=f32))
    return dh.astype(hidden.dtype), dw.astype(dt)


_logits_dz_terms.defvjp(_logits_dz_terms_fwd, _logits_dz_terms_bwd)

# dz_precision -> (dhidden's, dlm_head's) 16-bit terms of dz (None: jax's own VJP).
_DZ_TERMS = {"default": None, "x3": (3, 3), "x3_dlm_head": (1, 3)}


def _validate_options(options: Mapping[str, Any]) -> None:
    if options["dz_precision"] not in _DZ_TERMS:
        raise RequestError(f"impl_options.dz_precision must be one of {sorted(_DZ_TERMS)}, "
                           f"got {options['dz_precision']!r}")


def build(problem: Problem, k: Knobs, options: Mapping[str, Any], logits_fn=None):
    """The case's function: all SPEC inputs in order -> (loss, metrics..., gradients...).
    ``logits_fn(hidden, lm_head, logits_dtype)`` replaces ``fused_logits`` (test variants)."""
    options = {**IMPLEMENTATION.default_options, **options}
    _validate_options(options)
    terms = _DZ_TERMS[options["dz_precision"]]
    if logits_fn is None and terms is not None:
        def logits_fn(hidden, lm_head, logits_dtype):
            if jnp.dtype(lm_head.dtype) == f32:
                return fused_logits(hidden, lm_head, logits_dtype)
            z = _logits_dz_terms(hidden, lm_head, terms)
            return round_to(z, lm_head.dtype) if logits_dtype == "input" else z
    logits_fn = logits_fn or fused_logits
    if problem.level == "logits":
        def loss_fn(logits, chosen_ids, old_logp, ref_logp, advantages, mask):
            return _loss_from_logits(logits, chosen_ids, old_logp, ref_logp, advantages, mask, k)

        def fn(logits, chosen_ids, old_logp, ref_logp, advantages, mask):
            (loss, aux), dlogits = jax.value_and_grad(loss_fn, has_aux=True)(
                logits, chosen_ids, old_logp, ref_logp, advantages, mask)
            return (loss, *_metrics(aux), dlogits)
        return fn

    def loss_fn_fused(hidden, lm_head, chosen_ids, old_logp, ref_logp, advantages, mask):
        z = logits_fn(hidden, lm_head, k.logits_dtype)
        return _loss_from_logits(z, chosen_ids, old_logp, ref_logp, advantages, mask, k)

    def fn_fused(hidden, lm_head, chosen_ids, old_logp, ref_logp, advantages, mask):
        (loss, aux), (dh, dw) = jax.value_and_grad(loss_fn_fused, argnums=(0, 1), has_aux=True)(
            hidden, lm_head, chosen_ids, old_logp, ref_logp, advantages, mask)
        return (loss, *_metrics(aux), dh, dw)
    return fn_fused


def pad_value(dtype) -> float:
    """A logit that is never the max and whose probability is exactly 0 after any
    temperature: -1e30, or half the most negative finite value of a 16-bit float type."""
    info = jnp.finfo(dtype)
    return -1e30 if float(info.max) > 1e31 else float(info.min) / 2


def _core(z, chosen_ids, temperature: float, with_lse: bool = False):
    """logp = s_y − logsumexp(s) (s_y = 0 for an id of −1: no column), entropy, and
    (with_lse) the differentiable logsumexp."""
    s = z.astype(f32) / temperature
    lse = jax.nn.logsumexp(s, axis=-1)
    ids = chosen_ids.astype(jnp.int32)
    s_y = jnp.take_along_axis(s, jnp.maximum(ids, 0)[..., None], axis=-1)[..., 0]
    logp = jnp.where(ids >= 0, s_y, 0.0) - lse
    lp = jax.lax.stop_gradient(s - lse[..., None])
    entropy = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
    return (logp, entropy, lse) if with_lse else (logp, entropy)


def per_token(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """The differentiable core: (logits, ids) or (hidden, lm_head, ids, valid_v=None,
    with_lse=False) -> (logp [B, T], entropy [B, T][, lse [B, T]]); fused columns >= valid_v
    (a traced count) are padding; an id of −1 selects no column (logp = −logsumexp)."""
    del options
    if problem.level == "logits":
        def f(logits, chosen_ids):
            return _core(logits, chosen_ids, k.temperature)
        return f

    def f_fused(hidden, lm_head, chosen_ids, valid_v=None, with_lse=False):
        if hidden.dtype == f32 and lm_head.dtype != f32:
            z = _logits_f32_dhidden(hidden, lm_head)
            if k.logits_dtype == "input":
                z = round_to(z, lm_head.dtype)
        else:
            z = fused_logits(hidden, lm_head, k.logits_dtype)
        if valid_v is not None:
            col = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
            z = jnp.where(col < valid_v, z, pad_value(jnp.float32))
        return _core(z, chosen_ids, k.temperature, with_lse)
    return f_fused


IMPLEMENTATION = Implementation(
    id="jax_baseline",
    description="pure JAX: f32 log_softmax + gather, jax.value_and_grad (the seeds' reference)",
    build=build,
    capabilities=Capabilities(),  # every level, dtype, platform and knob
    default_options={"dz_precision": "default"},
    validate_options=_validate_options,
    per_token=per_token,
    # "default" is shown by its dots (f32 dz at DEFAULT); the terms of dz are not.
    option_class=lambda o, dtype: (None if dtype == "f32" else
                                   {"x3_dlm_head": "bf16x3", "x3": "f32"}.get(o["dz_precision"])),
)
