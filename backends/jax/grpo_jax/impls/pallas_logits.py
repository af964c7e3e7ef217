"""``pallas_logits`` / ``pallas_logits_jaxbwd``: logits-level Pallas kernels (SPEC.md).

Token rows: ``logits`` [B, T, V] is viewed as [N, V] with N = B*T (a free reshape). Rows are
not padded: the row grid is ``cdiv(N, block_rows)`` and a partial last row block only
computes rows whose results Pallas discards on write-back (rows are independent).
The vocab axis is never padded in HBM either: the last, partial vocab tile is masked
in-kernel (columns >= V are excluded from max, sum, entropy and the chosen logit; the
backward writes 0 there, and those columns are outside the array anyway).

Forward kernel, grid (row blocks "parallel", vocab blocks "arbitrary", vocab last), one
pass over the vocab with per-row running statistics in VMEM scratch:

    s   = f32(z) / tau                      (in-kernel upcast)
    m   = running max of s
    l   = sum exp(s - m)                     (rescaled by exp(m_old - m_new))
    a   = sum exp(s - m) * (s - m)           (a' = alpha * (a + (m_old - m_new) * l) + tile)
    c   = s[y], captured in the tile that holds y
    lse = m + log l,  logp = c - lse,  entropy = log l - a / l

Backward: ``jax.custom_vjp`` on (logp, entropy) as functions of the logits; entropy gets
no gradient. With g = d loss / d logp (from JAX autodiff of ``grpo_math``):
``dlogits = g * (onehot - exp(s - lse)) / tau`` in the logits dtype, computed either by a
second Pallas kernel that re-scans the vocab tiles (grid all "parallel"; ``bwd_impl=
"pallas"``) or in plain JAX from the saved lse (``bwd_impl="jax"``, the ``_jaxbwd`` id).

The GRPO terms and aggregation (ratio, SPEC tie rule, delta, k3 KL, loss types, sequence
level, masking) are ``grpo_math`` in JAX around the kernel; advantages never enter a kernel
(seed 004: rank-1 advantages blocks did not lower on TPU for B > 1).

TPU (``interpret=False``, Mosaic): the last two block dims must be divisible by 8 and 128
or equal the array dims (blocks larger than the array are clamped to it first), and the
estimated VMEM working set must fit a conservative 16 MiB (v5e's default scoped VMEM
limit; v6e's is 32 MiB). ``extra_check`` reports violations as unsupported.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..spec import Knobs, Problem, RequestError
from . import grpo_math
from .interface import Capabilities, Implementation

f32 = jnp.float32

SUBLANE, LANE = 8, 128
# Conservative VMEM budget for one kernel: v5e's default scoped limit (v6e: 32 MiB).
VMEM_BUDGET_BYTES = 16 * 1024 * 1024
# Initial running max: finite so that (m_old - m_new) * l_old is 0, never -inf * 0.
_M_INIT = -1e30
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}


# --------------------------------------------------------------------------- kernels

def _fwd_kernel(ids_ref, z_ref, lse_ref, logp_ref, ent_ref, m_sc, l_sc, a_sc, c_sc, *,
                v: int, block_v: int, temperature: float, mask_tail: bool):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, _M_INIT, f32)
        l_sc[...] = jnp.zeros(l_sc.shape, f32)
        a_sc[...] = jnp.zeros(a_sc.shape, f32)
        c_sc[...] = jnp.zeros(c_sc.shape, f32)

    s = z_ref[...].astype(f32) / temperature                        # [br, bv]
    col = j * block_v + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    if mask_tail:  # the last vocab tile runs past V: those columns are not logits
        s = jnp.where(col < v, s, -jnp.inf)
    m_old, l_old, a_old = m_sc[...], l_sc[...], a_sc[...]            # [br, 1]
    m_new = jnp.maximum(m_old, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_old - m_new)
    d = s - m_new
    e = jnp.exp(d)
    ed = jnp.where(e > 0, e * d, 0.0)  # e == 0 (masked column or -inf logit): no 0 * -inf
    l_sc[...] = alpha * l_old + jnp.sum(e, axis=1, keepdims=True)
    a_sc[...] = alpha * (a_old + (m_old - m_new) * l_old) + jnp.sum(ed, axis=1, keepdims=True)
    m_sc[...] = m_new
    hit = col == ids_ref[...]                                        # y is in [0, V)
    c_sc[...] += jnp.sum(jnp.where(hit, s, 0.0), axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        log_l = jnp.log(l_sc[...])
        lse = m_sc[...] + log_l
        lse_ref[...] = lse
        logp_ref[...] = c_sc[...] - lse
        ent_ref[...] = log_l - a_sc[...] / l_sc[...]


def _bwd_kernel(ids_ref, lse_ref, g_ref, z_ref, dz_ref, *,
                v: int, block_v: int, temperature: float, mask_tail: bool):
    j = pl.program_id(1)
    s = z_ref[...].astype(f32) / temperature
    col = j * block_v + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    p = jnp.exp(s - lse_ref[...])
    onehot = (col == ids_ref[...]).astype(f32)
    dz = g_ref[...] * (onehot - p) / temperature
    if mask_tail:  # columns >= V: outside the array (dropped on write-back); write 0 anyway
        dz = jnp.where(col < v, dz, 0.0)
    dz_ref[...] = dz.astype(dz_ref.dtype)


# --------------------------------------------------------------------------- config

def _blocks(n: int, v: int, options: Mapping[str, Any]) -> tuple[int, int]:
    """Effective (block_rows, block_v): clamped to the array (a block equal to a dim is legal)."""
    return min(int(options["block_rows"]), n), min(int(options["block_v"]), v)


def _interpret(platform: str, options: Mapping[str, Any]) -> bool:
    flag = options.get("interpret")
    return platform == "cpu" if flag is None else bool(flag)


def vmem_estimate(br: int, bv: int, dtype: str, bwd_pallas: bool) -> int:
    """Bytes of VMEM one kernel needs (the larger of fwd and bwd), conservatively.

    Double-buffered logits tile (and dlogits tile in the backward), ~4 f32 tile-sized
    temporaries (s, exp, products, iota), and per-row [br, 1] blocks padded to 128 lanes.
    """
    tile = br * bv
    rows = -(-br // SUBLANE) * SUBLANE * LANE * 4
    fwd = 2 * tile * _ITEMSIZE[dtype] + 4 * tile * 4 + 2 * 4 * rows + 4 * rows
    bwd = 4 * tile * _ITEMSIZE[dtype] + 4 * tile * 4 + 2 * 3 * rows
    return max(fwd, bwd) if bwd_pallas else fwd


def _validate_options(options: Mapping[str, Any]) -> None:
    for key in ("block_rows", "block_v"):
        val = options[key]
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise RequestError(f"impl_options.{key} must be a positive integer, got {val!r}")
    if options.get("bwd_impl", "pallas") not in ("pallas", "jax"):
        raise RequestError(f"impl_options.bwd_impl must be 'pallas' or 'jax', "
                           f"got {options['bwd_impl']!r}")
    if options["interpret"] not in (None, True, False):
        raise RequestError(f"impl_options.interpret must be true, false or null (auto), "
                           f"got {options['interpret']!r}")


def extra_check(p: Problem, k: Knobs, options: Mapping[str, Any]) -> Optional[str]:
    """Invalid options raise RequestError; Mosaic constraints give an unsupported reason."""
    del k
    _validate_options(options)
    if options.get("_unsafe_no_tail_mask"):
        raise RequestError("_unsafe_no_tail_mask is a test-only mutant option")
    interpret = _interpret(p.platform, options)
    if interpret:
        return None  # plain HLO: any block shape works
    if p.platform != "tpu":
        return f"Mosaic (interpret=false) needs platform tpu, not {p.platform!r}"
    n = p.b * p.t
    br, bv = _blocks(n, p.v, options)
    bad = []
    if br % SUBLANE and br != n:
        bad.append(f"block_rows={br} is neither a multiple of {SUBLANE} nor N=B*T={n}")
    if bv % LANE and bv != p.v:
        bad.append(f"block_v={bv} is neither a multiple of {LANE} nor V={p.v}")
    need = vmem_estimate(br, bv, p.dtype, options.get("bwd_impl", "pallas") == "pallas")
    if need > VMEM_BUDGET_BYTES:
        bad.append(f"estimated VMEM working set {need} B for blocks ({br}, {bv}) {p.dtype} "
                   f"exceeds the {VMEM_BUDGET_BYTES} B budget")
    return "; ".join(bad) if bad else None


# --------------------------------------------------------------------------- pallas calls

def _row_spec(br):
    return pl.BlockSpec((br, 1), lambda i, j: (i, 0))


def _fwd(z2, ids2, *, br, bv, temperature, interpret, mask_tail):
    n, v = z2.shape
    grid = (pl.cdiv(n, br), pl.cdiv(v, bv))
    kernel = functools.partial(_fwd_kernel, v=v, block_v=bv, temperature=temperature,
                               mask_tail=mask_tail and v % bv != 0)
    row = jax.ShapeDtypeStruct((n, 1), f32)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[_row_spec(br), pl.BlockSpec((br, bv), lambda i, j: (i, j))],
        out_specs=[_row_spec(br)] * 3,
        out_shape=[row] * 3,
        scratch_shapes=[pltpu.VMEM((br, 1), f32)] * 4,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
        name="grpo_logp_fwd",
    )(ids2, z2)


def _bwd_pallas(z2, ids2, lse, g, *, br, bv, temperature, interpret, mask_tail):
    n, v = z2.shape
    grid = (pl.cdiv(n, br), pl.cdiv(v, bv))
    kernel = functools.partial(_bwd_kernel, v=v, block_v=bv, temperature=temperature,
                               mask_tail=mask_tail and v % bv != 0)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[_row_spec(br)] * 3 + [pl.BlockSpec((br, bv), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((br, bv), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, v), z2.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=interpret,
        name="grpo_logp_bwd",
    )(ids2, lse, g, z2)


def _bwd_jax(z2, ids2, lse, g, *, temperature):
    s = z2.astype(f32) / temperature
    p = jnp.exp(s - lse)
    onehot = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) == ids2
    return (g * (onehot.astype(f32) - p) / temperature).astype(z2.dtype)


def make_logp_entropy(*, br, bv, temperature, interpret, bwd_impl, mask_tail=True):
    """(z2 [N, V], ids2 [N, 1] i32) -> (logp [N, 1], entropy [N, 1]), with SPEC's VJP."""
    fwd_kw = dict(br=br, bv=bv, temperature=temperature, interpret=interpret,
                  mask_tail=mask_tail)

    @jax.custom_vjp
    def logp_entropy(z2, ids2):
        _, logp, ent = _fwd(z2, ids2, **fwd_kw)
        return logp, ent

    def fwd_rule(z2, ids2):
        lse, logp, ent = _fwd(z2, ids2, **fwd_kw)
        return (logp, ent), (z2, ids2, lse)

    def bwd_rule(res, cts):
        z2, ids2, lse = res
        g, _ = cts  # entropy is a metric: its cotangent is ignored
        g = g.astype(f32)
        if bwd_impl == "pallas":
            dz = _bwd_pallas(z2, ids2, lse, g, **fwd_kw)
        else:
            dz = _bwd_jax(z2, ids2, lse, g, temperature=temperature)
        return dz, None

    logp_entropy.defvjp(fwd_rule, bwd_rule)
    return logp_entropy


# --------------------------------------------------------------------------- builder

def _builder(bwd_impl_fixed: Optional[str]):
    def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
        """All SPEC inputs in order -> (loss, metrics..., dlogits)."""
        if problem.level != "logits":
            raise ValueError("pallas_logits implements the logits level only")
        _validate_options({"interpret": None, **options})
        b, t, v = problem.b, problem.t, problem.v
        n = b * t
        br, bv = _blocks(n, v, options)
        kernel = make_logp_entropy(
            br=br, bv=bv, temperature=k.temperature,
            interpret=_interpret(problem.platform, options),
            bwd_impl=bwd_impl_fixed or options["bwd_impl"],
            mask_tail=not options.get("_unsafe_no_tail_mask", False))

        def loss_fn(logits, chosen_ids, old_logp, ref_logp, advantages, mask):
            z2 = logits.reshape(n, v)
            ids2 = chosen_ids.reshape(n, 1).astype(jnp.int32)
            logp2, ent2 = kernel(z2, ids2)
            logp = logp2.reshape(b, t)
            entropy = jax.lax.stop_gradient(ent2.reshape(b, t))
            loss, aux = grpo_math.grpo_from_logp(logp, old_logp, ref_logp, advantages, mask, k)
            return loss, (jax.lax.stop_gradient(logp), aux, entropy)

        def fn(logits, chosen_ids, old_logp, ref_logp, advantages, mask):
            (loss, (logp, aux, entropy)), dlogits = jax.value_and_grad(loss_fn, has_aux=True)(
                logits, chosen_ids, old_logp, ref_logp, advantages, mask)
            return (loss, logp, aux["per_token_loss"], aux["kl"], aux["clipped"], entropy,
                    dlogits)
        return fn
    return build


_CAPS = Capabilities(levels=frozenset({"logits"}), platforms=frozenset({"cpu", "tpu"}))
_COMMON_OPTIONS = {"block_rows": 128, "block_v": 2048, "interpret": None}

IMPLEMENTATION = Implementation(
    id="pallas_logits",
    description="Pallas logits-level kernel: vocab-tiled online logsumexp + entropy, "
                "masked last vocab tile; custom_vjp with a Pallas (or JAX) dlogits backward",
    build=_builder(None),
    capabilities=_CAPS,
    default_options={**_COMMON_OPTIONS, "bwd_impl": "pallas"},
    extra_check=extra_check,
)

IMPLEMENTATION_JAXBWD = Implementation(
    id="pallas_logits_jaxbwd",
    description="pallas_logits forward kernel; dlogits in plain JAX from the saved lse",
    build=_builder("jax"),
    capabilities=_CAPS,
    default_options=dict(_COMMON_OPTIONS),
    extra_check=extra_check,
)
