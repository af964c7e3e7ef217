"""A deliberately wrong test variant, checked through config alone (``id:
default_dot:IMPLEMENTATION``, ``pythonpath: [tests/data/kernels]``): ``jax_baseline`` whose
forward logits matmul runs at ``Precision.DEFAULT`` for f32 inputs (one bf16 pass on a TPU,
TF32 on a GPU) while its VJP's two matmuls stay at HIGHEST, without declaring reduced
precision. The tpu-aot trial must fail naming that one matmul (``tests/tpu_aot.rs``);
on pjrt-cpu the matmul is computed as a TPU would and the f32 gates see it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from grpo_jax.impls import baseline

HIGHEST = jax.lax.Precision.HIGHEST


@jax.custom_vjp
def _logits(hidden, lm_head):
    # The wrong part: no precision, i.e. DEFAULT.
    return jnp.einsum("bth,hv->btv", hidden, lm_head, preferred_element_type=jnp.float32)


def _fwd(hidden, lm_head):
    return _logits(hidden, lm_head), (hidden, lm_head)


def _bwd(res, dz):
    hidden, lm_head = res
    dh = jnp.einsum("btv,hv->bth", dz, lm_head, precision=HIGHEST,
                    preferred_element_type=jnp.float32)
    dw = jnp.einsum("bth,btv->hv", hidden, dz, precision=HIGHEST,
                    preferred_element_type=jnp.float32)
    return dh.astype(hidden.dtype), dw.astype(lm_head.dtype)


_logits.defvjp(_fwd, _bwd)


def logits_one_default_dot(hidden, lm_head, logits_dtype):
    z = _logits(hidden.astype(lm_head.dtype), lm_head)
    return baseline.round_to(z, lm_head.dtype) if logits_dtype == "input" else z


IMPLEMENTATION = dataclasses.replace(
    baseline.IMPLEMENTATION,
    id="jax_baseline_default_dot",
    description="jax_baseline with its forward f32 matmul at DEFAULT, undeclared (test variant)",
    build=functools.partial(baseline.build, logits_fn=logits_one_default_dot),
    per_token=None,
)
