"""``pallas_logits_2pass``: the logits level in one read and one write of the logits
(issue 19, item 2). WORK IN PROGRESS: row-major logits only, one device.

For token-level importance sampling the loss's gradient in logp is per token:
``d loss / d logp_t = w_t * l'(logp_t; old_t, ref_t, A_b, mask_t)`` with ``w_t`` the
aggregation weight (``d loss / d per_token_loss_t``: a function of the mask alone). A
block of whole rows ([block_rows, V] in VMEM) gives each token's logsumexp in one read,
so the same kernel step computes logp, entropy, ``g_t = w_t * l'`` (``jax.grad`` of the
per-token terms of ``grpo_math``, traced inside the kernel: elementwise ops) and writes
``dlogits = g * (onehot - p) / tau``: the logits are read once and dlogits written once
(2 passes), against 3 for ``pallas_logits``. The function returns dlogits directly (the
SPEC function's cotangent is 1), so there is no separate backward.

Limits: sequence-level importance sampling needs the row's mean log-ratio before any
token's gradient (3 passes: not supported here). Vocab-major logits ((4, 1024, 151643):
XLA:TPU stores it [V][B][T]) would need blocks of V x 128 tokens, 38.8 MB (bf16) per
buffer: over VMEM; such shapes are refused on TPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..spec import Knobs, Problem, RequestError
from . import grpo_math
from .interface import Capabilities, Implementation
from .tpu_layout import ITEMSIZE, tpu_default_order

f32 = jnp.float32
SUBLANE, LANE = 8, 128
VMEM_BUDGET_BYTES = 16 * 2**20
VMEM_LIMIT_MAX_BYTES = 128 * 2**20


def _token_grad(logp, old, ref, adv, mask, w, k: Knobs):
    """g = w * d per_token_loss / d logp, per token ([rows, 1] arrays, token level)."""
    def total(lp):
        log_r = jnp.where(mask > 0, lp - old, 0.0)
        pg, _ = grpo_math.clipped_pg(log_r, adv[:, 0], k)
        out = pg
        if k.beta != 0:
            out = out + k.beta * grpo_math.k3_kl(lp, ref, mask)
        return jnp.sum(w * out)
    return jax.grad(total)(logp)


def _kernel(ids_ref, tok_ref, z_ref, out_ref, dz_ref, *, k: Knobs):
    """One block of whole rows. ``tok_ref``: [rows, 5] (old_logp, ref_logp, advantage,
    mask, aggregation weight); ``out_ref``: [rows, 2] (logp, entropy). Packed because
    XLA:TPU pads an f32 [N, k] array to 128 lanes whatever k is (eight [N, 1] columns
    were 1.48x the floor at (3, 16, 1000) f32)."""
    tau = k.temperature
    s = z_ref[...].astype(f32) / tau
    m = jnp.max(s, axis=1, keepdims=True)
    d = s - m
    e = jnp.exp(d)
    l = jnp.sum(e, axis=1, keepdims=True)
    a = jnp.sum(jnp.where(e > 0, e * d, 0.0), axis=1, keepdims=True)
    col = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    onehot = col == ids_ref[...]
    c = jnp.sum(jnp.where(onehot, d, 0.0), axis=1, keepdims=True)
    log_l = jnp.log(l)
    logp = c - log_l
    out_ref[...] = jnp.concatenate([logp, log_l - a / l], axis=1)
    tok = tok_ref[...]
    g = _token_grad(logp, tok[:, 0:1], tok[:, 1:2], tok[:, 2:3], tok[:, 3:4], tok[:, 4:5], k)
    p = e * (1.0 / l)
    dz_ref[...] = (g * (onehot.astype(f32) - p) / tau).astype(dz_ref.dtype)


def vmem_estimate(rows: int, v: int, itemsize: int) -> int:
    """Double-buffered logits and dlogits blocks plus ~5 f32 [rows, V] temporaries,
    padded to (8, 128) tiles."""
    r = -(-rows // SUBLANE) * SUBLANE
    cols = -(-v // LANE) * LANE
    return 4 * r * cols * itemsize + 5 * r * cols * 4


def cost(n: int, v: int, rows: int, itemsize: int) -> pl.CostEstimate:
    """Hand count of ``_kernel`` (partial last block counts whole). Per logits element:
    /tau, max, s - m, sum e, e > 0, e * d, select, sum, == id, select, sum, e * (1/l),
    onehot convert, onehot - p, g *, /tau: 16 (+2 converts for 16-bit logits) and one exp.
    Per token: ~26 for the statistics and the in-kernel gradient (log-ratio, ratio, clip
    branches, k3 KL) and up to 3 transcendentals. Bytes: the logits once, dlogits once, ids
    and 5 f32 per-token inputs, 2 outputs."""
    ex = pl.cdiv(n, rows) * rows * v
    tok = pl.cdiv(n, rows) * rows
    per_elem = 16 + 2 * (itemsize != 4)
    return pl.CostEstimate(flops=per_elem * ex + 26 * tok, transcendentals=ex + 3 * tok,
                           bytes_accessed=2 * n * v * itemsize + 32 * n)


def _interpret(platform: str, options) -> bool:
    return options["interpret"] if options["interpret"] is not None else platform != "tpu"


def extra_check(p: Problem, k: Knobs, options: Mapping[str, Any]) -> Optional[str]:
    if k.importance_sampling_level != "token":
        return "sequence-level importance sampling needs the row's mean log-ratio first"
    if _interpret(p.platform, options):
        return None
    if p.dtype == "f16":
        return "Mosaic cannot load f16 vectors on TPU v5e/v6e/tpu7x (\"Invalid vector type for load\")"
    order = tpu_default_order((p.b, p.t, p.v), p.dtype)
    if order[-1] != 2:
        return (f"XLA:TPU stores logits {(p.b, p.t, p.v)} {p.dtype} vocab-major ({order}): "
                f"whole-row blocks do not fit VMEM")
    rows = min(options["block_rows"], p.b * p.t)
    if rows % SUBLANE and rows != p.b * p.t:
        return f"block_rows={rows} is neither a multiple of {SUBLANE} nor N={p.b * p.t}"
    need = vmem_estimate(rows, p.v, ITEMSIZE[p.dtype])
    budget = options["vmem_limit_bytes"] or VMEM_BUDGET_BYTES
    if need > budget:
        return f"estimated VMEM working set {need} B for {rows} whole rows exceeds the {budget} B budget"
    return None


def _validate_options(options: Mapping[str, Any]) -> None:
    br = options["block_rows"]
    if not isinstance(br, int) or br < 1:
        raise RequestError(f"impl_options.block_rows must be a positive int, got {br!r}")
    lim = options["vmem_limit_bytes"]
    if lim is not None and (not isinstance(lim, int) or not 0 < lim <= VMEM_LIMIT_MAX_BYTES):
        raise RequestError(f"impl_options.vmem_limit_bytes must be in (0, {VMEM_LIMIT_MAX_BYTES}], got {lim!r}")


def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """All SPEC inputs -> (loss, logp, per_token_loss, kl, clipped, entropy, dlogits)."""
    if problem.level != "logits":
        raise ValueError("pallas_logits_2pass implements the logits level only")
    _validate_options(options)
    b, t, v = problem.b, problem.t, problem.v
    n = b * t
    rows = min(options["block_rows"], n)
    itemsize = ITEMSIZE[problem.dtype]
    cols = lambda c: pl.BlockSpec((rows, c), lambda i: (i, 0))  # noqa: E731
    tile = pl.BlockSpec((rows, v), lambda i: (i, 0))

    def kernel_call(z, ids, tok):
        return pl.pallas_call(
            functools.partial(_kernel, k=k),
            grid=(pl.cdiv(n, rows),),
            in_specs=[cols(1), cols(5), tile],
            out_specs=[cols(2), tile],
            out_shape=[jax.ShapeDtypeStruct((n, 2), f32), jax.ShapeDtypeStruct((n, v), z.dtype)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                                 vmem_limit_bytes=options["vmem_limit_bytes"]),
            cost_estimate=cost(n, v, rows, itemsize),
            interpret=_interpret(problem.platform, options),
            name="grpo_logp_2pass",
        )(ids, tok, z)

    def fn(logits, ids, old_logp, ref_logp, advantages, mask):
        m = mask.astype(f32)
        # The aggregation is linear in the per-token losses: its gradient is the weights.
        # Test-only mutant: the weights of another loss type (a stale normaliser).
        wk = k if not options.get("_unsafe_weight_loss_type") else dataclasses.replace(
            k, loss_type=options["_unsafe_weight_loss_type"])
        w = jax.grad(lambda pt: grpo_math.aggregate(pt, m, wk))(jnp.zeros((b, t), f32))
        adv = jnp.broadcast_to(advantages.astype(f32)[:, None], (b, t))
        tok = jnp.stack([old_logp.astype(f32), ref_logp.astype(f32), adv, m, w], axis=-1)
        out, dz = kernel_call(logits.reshape(n, v), ids.astype(jnp.int32).reshape(n, 1),
                              tok.reshape(n, 5))
        logp, entropy = out[:, 0].reshape(b, t), out[:, 1].reshape(b, t)
        loss, aux = grpo_math.grpo_from_logp(logp, old_logp, ref_logp, advantages, mask, k)
        return (jax.lax.stop_gradient(loss), logp, aux["per_token_loss"], aux["kl"],
                aux["clipped"], entropy, dz.reshape(b, t, v))
    return fn


IMPLEMENTATION = Implementation(
    id="pallas_logits_2pass",
    description="Pallas logits-level kernel reading whole rows: logp, entropy and dlogits "
                "(token-level gradient coefficient computed in-kernel) in one read and one "
                "write of the logits; row-major logits only",
    build=build,
    capabilities=Capabilities(levels=frozenset({"logits"}), platforms=frozenset({"cpu", "tpu"}), mosaic_tpu=True,
                              importance_sampling_levels=frozenset({"token"})),
    default_options={"block_rows": 8, "interpret": None, "vmem_limit_bytes": None},
    extra_check=extra_check,
    validate_options=_validate_options,
    search_space={"block_rows": (8, 16, 32)},
)
