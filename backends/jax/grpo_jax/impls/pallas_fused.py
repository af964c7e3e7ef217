"""``pallas_fused``: the fused LM-head loss in Pallas kernels that never write [B, T, V].

Each logits tile ``z = hidden[token block] @ lm_head[:, vocab tile]`` is formed on the MXU
(f32 accumulation) inside a kernel, used, and dropped; only per-token statistics and the
gradients of the inputs reach HBM. N = B*T tokens (``hidden`` viewed as [N, H], a free
reshape), H whole in every block (H <= 8192 keeps a [block_tokens, H] block small).

Forward (``grpo_fused_fwd``), grid (token blocks "parallel", vocab tiles "arbitrary"):
the online logsumexp of the logits kernel, per token in VMEM scratch --

    s = round?(z) / tau      (round? = to the input dtype when logits_dtype == "input")
    m = running max,  l = sum exp(s - m),  a = sum exp(s - m) * (s - m),  c = s[y]
    lse = m + log l,  logp = c - lse,  entropy = log l - a / l

Backward (``jax.custom_vjp``; g = d loss / d logp from JAX autodiff of ``grpo_math``,
g_lse = d loss / d lse when the caller also differentiates lse, else 0): the tile is
recomputed and ``dz = (g * onehot - (g - g_lse) * exp(s - lse)) / tau`` (g_lse = 0: the
usual g * (onehot - p) / tau); lse, the two per-row coefficients and the chosen id (as
an f32, exact below 2^24) enter as one array. Per-token vectors live in HBM as lane-major
rows ([1, N] for ids, lse, logp and entropy; [8, N] for the backward's four) when
block_tokens is a multiple of 128 (``Plan.lane_rows``): on TPU an f32 [N, k] column
array is padded to 128 lanes, 2 MB at N = 4096 whatever k, a [k, N] row array to 8
sublanes, 128 KB; the kernels turn a row block into a column by a (128, bt) transpose.
With three such columns the vocab-sharded fused level sat at 1.126x its per-chip floor
at (4, 1024, 1024, 32768); with rows, 1.043x. Smaller blocks keep [N, 1] / [N, 4]
columns. Two kernels, each
owning its output tiles, so no output is accumulated across grid steps in HBM and each
has a "parallel" outer axis (megacore):

  ``grpo_fused_dhidden``, grid (token blocks "parallel", vocab tiles "arbitrary"):
      acc[bt, H] += dz @ W_tile^T, written as dhidden at the last vocab tile;
  ``grpo_fused_dlm_head``, grid (vocab tiles "parallel", token blocks "arbitrary"):
      acc[H, bv] += hidden_block^T @ dz, written as the dlm_head tile at the last token block.

The price is one more recomputation of the logits (5 matmuls of the logits' size in all,
against 3 for a materialising implementation); the gain is that neither kernel needs an
[N, H] or [H, V] f32 accumulator in HBM, nor atomics. ``bwd_dz_dtype`` says whether dz
enters the two backward matmuls in the input dtype (the MXU's native bf16 path; default)
or in f32, or (``x3_dlm_head``) dhidden's in the input dtype and dlm_head's as three
input-dtype terms t1 = round(dz), t2 = round(dz - t1), t3 = round(dz - t1 - t2), each a
single-pass matmul summed in f32 (7 single-pass matmuls in all: the lightest dz that
keeps the Adam trajectory, docs/implementations.md "xla_saved_logits").

``dhidden: forward`` (the memory corner at 6 single-pass matmuls with ``x3_dlm_head``,
against 7): the forward kernel also accumulates, per token block and online as flash
attention's output, ``r = alpha * r + p' @ W_tile^T`` with p' = exp(s - m) and the chosen
column zeroed, and writes pw = r / l = sum over the non-chosen columns of p_v W_v ([N, H],
in dz's dtype: one more input-sized array held until the backward). The backward then
forms dhidden in XLA without recomputing the logits:

    dhidden = (-g expm1(logp) + g_lse exp(logp)) / tau * W[:, y] - (g - g_lse) / tau * pw

(the chosen column's coefficient g - (g - g_lse) p_y written without cancellation as
p_y -> 1; no chosen term for an id outside the shard), and only the dlm_head kernel
runs. The forward's second matmul replaces the dhidden kernel's two, and one kernel
instead of two streams the LM head per token block. On tpu7x XLA runs the gather of W's
chosen columns on the SparseCore, which takes a transposed copy of the whole LM head
(docs/implementations.md, "The time-memory front"); ``chosen_gather: "dma"`` gathers them
by DMAs instead (chosen_columns.py).

Unaligned sizes are handled in-kernel, nothing is padded in HBM: the last vocab tile runs
past V (columns >= V are -inf in the forward, and both dz and the W tile are zeroed there
in the backward: the out-of-bounds part of a block is unspecified memory, NaN in
interpret mode, and 0 * NaN is NaN); the last token block runs past N (those rows of dz
and of the hidden block are zeroed before ``hidden^T @ dz``, the only place where rows
mix). H is always whole.

Layout: the LM head is read in its physical HBM order. XLA:TPU stores [H, V] as [V][H]
when that pads less (e.g. bf16 [4096, 151643]); the kernels then work on ``lm_head.T``
(a bitcast) with [block_v, H] tiles and write ``dlm_head.T`` (option ``lm_head_layout``;
auto = ``tpu_layout.tpu_default_order`` on tpu, "hv" elsewhere).

``impl_options``:
  block_tokens     256    tokens per block (clamped to N; Mosaic: a multiple of 8 or N)
  block_v          512    vocab entries per tile (clamped to V; a multiple of 128 or V)
  interpret        null   null = auto (True on cpu, False on tpu)
  lm_head_layout   null   "hv" | "vh" | null (auto, see Layout)
  bwd_dz_dtype     "input" | "f32" | "x3_dlm_head": dz's dtype in the backward matmuls
                          (x3_dlm_head: input for dhidden, three input-dtype terms for dlm_head)
  vmem_limit_bytes null   Mosaic scoped-VMEM limit per kernel; null = twice the estimated
                          working set, at least 32 MiB, at most 100 MiB (v5e/v6e have 128)
  dhidden      "kernel" | "forward": dhidden by its own backward kernel (recomputing the
                          logits) or from the forward's pw (see above)
  chosen_gather "xla" | "dma": with dhidden "forward", how the backward gets W's chosen
                          columns: XLA's gather, or the DMA kernel of chosen_columns.py
                          (W [H, V] only; on TPU V a multiple of 128): on tpu7x XLA's
                          gather copies the whole LM head transposed (see above)
  oob_fill     "unspecified" | "finite": what the out-of-bounds part of an edge block
                          holds. "unspecified" leaves it to the backend (NaN in interpret
                          mode, whatever is in memory on TPU). "finite" (interpret mode
                          only, a test aid) pads every operand to whole blocks with finite
                          garbage, as a TPU may hold, so that a missing row or column mask
                          shows on values rather than only through NaN.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..spec import Knobs, Problem, RequestError
from . import chosen_columns, grpo_math
from .dz_terms import product_of_terms
from .interface import Capabilities, Implementation
from .pallas_logits import _interpret
from .tpu_layout import ITEMSIZE, LANE, SUBLANE, tpu_default_order

f32 = jnp.float32
_M_INIT = -1e30  # finite initial max: (m_old - m_new) * l_old is then 0, never -inf * 0
MiB = 1024 * 1024
VMEM_LIMIT_MAX_BYTES = 128 * MiB
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}


class Plan(NamedTuple):
    """Static facts of one problem the kernels close over."""

    n: int              # tokens, B*T
    h: int              # hidden size
    v: int              # vocabulary
    bt: int             # tokens per block
    bv: int             # vocab entries per tile
    vocab_major: bool   # W is lm_head.T, [V, H]
    dtype: Any          # input dtype (jnp)
    temperature: float
    round_logits: bool  # logits_dtype == "input"
    dz_dtype: Any       # dtype of dz in the backward matmuls
    precision: Any      # lax.Precision of the matmuls
    dynamic_valid: bool = False  # a traced count of real columns comes in SMEM (vocab shards)
    # Per-token vectors (ids, lse, logp, entropy, the backward coefficients) in HBM as
    # lane-major rows [k, N] instead of columns [N, k]: on TPU an f32 [N, k] array is
    # padded to 128 lanes (2 MB at N = 4096), a [k, N] one to 8 sublanes (128 KB). The
    # kernels turn a (1, bt) row into a (bt, 1) column and back by a (128, bt) transpose.
    # Needs bt % 128 == 0 (the row block's lane dimension).
    lane_rows: bool = False
    # dz enters the dlm_head product as this many input-dtype terms t1 = round(dz),
    # t2 = round(dz - t1), ... (bwd_dz_dtype "x3_dlm_head": 3; else 1, dz_dtype's dz).
    dw_terms: int = 1
    # dhidden "forward": the forward kernel also accumulates, online as flash attention's
    # output, pw = sum over the non-chosen columns of p_v * W_v ([bt, H] f32 in VMEM,
    # rescaled with the running max; written to HBM in dz's dtype); the backward forms
    # dhidden from pw and W's chosen row in XLA, and only the dlm_head kernel recomputes
    # the logits.
    dh_in_fwd: bool = False
    # A test aid (a deliberately wrong forward): pw leaves out the last vocab tile.
    unsafe_pw_drop_last_tile: bool = False
    # chosen_gather "dma": W's chosen columns for dhidden_from_pw by the DMA kernel of
    # chosen_columns.py instead of XLA's gather (W [H, V] only).
    chosen_dma: bool = False

    @property
    def tok_blocks(self) -> int:
        return pl.cdiv(self.n, self.bt)

    @property
    def voc_tiles(self) -> int:
        return pl.cdiv(self.v, self.bv)

    @property
    def tail_v(self) -> bool:
        """Whether columns must be masked (a partial last tile, or padding of a shard)."""
        return self.v % self.bv != 0 or self.dynamic_valid

    @property
    def tail_n(self) -> bool:
        return self.n % self.bt != 0


# --------------------------------------------------------------------------- in-kernel math

def _logits(plan: Plan, h, w):
    """s = round?(h @ W_tile) / tau, f32 [bt, bv]."""
    dims = (((1,), (1,)), ((), ())) if plan.vocab_major else (((1,), (0,)), ((), ()))
    z = jax.lax.dot_general(h, w, dims, preferred_element_type=f32, precision=plan.precision)
    if plan.round_logits and plan.dtype == jnp.bfloat16:
        z = _round_to_bf16(z)
    elif plan.round_logits and plan.dtype != jnp.float32:
        # f16 runs in interpret mode only (see extra_check): XLA's reduce_precision.
        info = jnp.finfo(plan.dtype)
        z = jax.lax.reduce_precision(z, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    return z / plan.temperature


def _round_to_bf16(z):
    """f32 ``z`` rounded to the nearest bf16 (ties to even), kept in f32: integer ops on
    the bits, because Mosaic lowers neither ``reduce_precision`` nor a convert round trip
    that XLA would keep (finite values and +-inf map as a bf16 convert maps them)."""
    u = jax.lax.bitcast_convert_type(z, jnp.uint32)
    lsb = jax.lax.shift_right_logical(u, jnp.uint32(16)) & jnp.uint32(1)
    u = (u + jnp.uint32(0x7FFF) + lsb) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(u, f32)


def _cols(plan: Plan, j, shape):
    return j * plan.bv + jax.lax.broadcasted_iota(jnp.int32, shape, 1)


def _split(plan: Plan, refs):
    """(valid limit: the SMEM count or the static V, the kernel's other refs)."""
    if plan.dynamic_valid:
        return refs[0][0], refs[1:]
    return plan.v, refs


def _to_col(r):
    """A (1, bt) row as a (bt, 1) column (broadcast to (128, bt), transposed, sliced)."""
    return jnp.transpose(jnp.broadcast_to(r, (LANE, r.shape[1])))[:, 0:1]


def _to_row(c):
    """A (bt, 1) column as a (1, bt) row (the inverse of ``_to_col``)."""
    return jnp.transpose(jnp.broadcast_to(c, (c.shape[0], LANE)))[0:1, :]


def _row_stats(plan: Plan, rows_ref):
    """(lse, g, gp, id) as (bt, 1) columns from the backward's per-token block: [bt, 4]
    columns, or [8, bt] rows (lane_rows; rows 4..7 unused)."""
    r = rows_ref[...]
    if plan.lane_rows:
        return tuple(_to_col(r[k:k + 1, :]) for k in range(4))
    return r[:, 0:1], r[:, 1:2], r[:, 2:3], r[:, 3:4]


def _dz(plan: Plan, j, s, rows_ref, vlim):
    """(g * onehot - gp * exp(s - lse)) / tau for one tile (per token: lse, g, gp and the
    chosen id, from ``rows_ref``), 0 in columns >= vlim."""
    col = _cols(plan, j, s.shape)
    lse, g, gp, ids = _row_stats(plan, rows_ref)
    onehot = (col == ids.astype(jnp.int32)).astype(f32)
    dz = (g * onehot - gp * jnp.exp(s - lse)) / plan.temperature
    if plan.tail_v:
        dz = jnp.where(col < vlim, dz, 0.0)
    return dz


def _valid_w(plan: Plan, j, w, vlim):
    """The W tile with its out-of-bounds or padding vocab entries set to 0."""
    if not plan.tail_v:
        return w
    axis = 0 if plan.vocab_major else 1
    col = j * plan.bv + jax.lax.broadcasted_iota(jnp.int32, w.shape, axis)
    return jnp.where(col < vlim, w, jnp.zeros_like(w))


# --------------------------------------------------------------------------- kernels

def _fwd_kernel(*refs, plan: Plan):
    vlim, refs = _split(plan, refs)
    if plan.dh_in_fwd:
        ids_ref, h_ref, w_ref, lse_ref, logp_ref, ent_ref, pw_ref, m_sc, l_sc, a_sc, c_sc, \
            r_sc = refs
    else:
        ids_ref, h_ref, w_ref, lse_ref, logp_ref, ent_ref, m_sc, l_sc, a_sc, c_sc = refs
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, _M_INIT, f32)
        l_sc[...] = jnp.zeros(l_sc.shape, f32)
        a_sc[...] = jnp.zeros(a_sc.shape, f32)
        c_sc[...] = jnp.zeros(c_sc.shape, f32)
        if plan.dh_in_fwd:
            r_sc[...] = jnp.zeros(r_sc.shape, f32)

    w = w_ref[...]
    if plan.dh_in_fwd:  # its columns past V enter p @ W^T: 0, not unspecified memory
        w = _valid_w(plan, j, w, vlim)
    s = _logits(plan, h_ref[...].astype(plan.dtype), w)
    col = _cols(plan, j, s.shape)
    if plan.tail_v:
        s = jnp.where(col < vlim, s, -jnp.inf)
    m_old, l_old, a_old = m_sc[...], l_sc[...], a_sc[...]
    m_new = jnp.maximum(m_old, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_old - m_new)
    d = s - m_new
    e = jnp.exp(d)
    ed = jnp.where(e > 0, e * d, 0.0)  # e == 0 (masked or -inf logit): no 0 * -inf
    l_sc[...] = alpha * l_old + jnp.sum(e, axis=1, keepdims=True)
    a_sc[...] = alpha * (a_old + (m_old - m_new) * l_old) + jnp.sum(ed, axis=1, keepdims=True)
    m_sc[...] = m_new
    ids = _to_col(ids_ref[...]) if plan.lane_rows else ids_ref[...]
    c_sc[...] += jnp.sum(jnp.where(col == ids, s, 0.0), axis=1, keepdims=True)
    if plan.dh_in_fwd:
        # r = alpha * r + p' @ W_tile^T, p' = exp(s - m) without the chosen column.
        pe = jnp.where(col == ids, 0.0, e)
        if plan.unsafe_pw_drop_last_tile:
            pe = jnp.where(j == pl.num_programs(1) - 1, 0.0, pe)
        pe = pe.astype(plan.dz_dtype)
        dims = (((1,), (0,)), ((), ())) if plan.vocab_major else (((1,), (1,)), ((), ()))
        r_sc[...] = alpha * r_sc[...] + jax.lax.dot_general(
            pe, w.astype(plan.dz_dtype), dims, preferred_element_type=f32,
            precision=plan.precision)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        if plan.dh_in_fwd:
            pw_ref[...] = (r_sc[...] / l_sc[...]).astype(pw_ref.dtype)
        log_l = jnp.log(l_sc[...])
        lse = m_sc[...] + log_l
        out = _to_row if plan.lane_rows else (lambda c: c)
        lse_ref[...] = out(lse)
        logp_ref[...] = out(c_sc[...] - lse)
        ent_ref[...] = out(log_l - a_sc[...] / l_sc[...])


def _dhidden_kernel(*refs, plan: Plan):
    vlim, (rows_ref, h_ref, w_ref, dh_ref, acc) = _split(plan, refs)
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        acc[...] = jnp.zeros(acc.shape, f32)

    w = _valid_w(plan, j, w_ref[...], vlim)
    s = _logits(plan, h_ref[...].astype(plan.dtype), w)
    dz = _dz(plan, j, s, rows_ref, vlim).astype(plan.dz_dtype)
    w = w.astype(plan.dz_dtype)
    # dh += dz @ W_tile^T, contracting the tile's vocab entries.
    dims = (((1,), (0,)), ((), ())) if plan.vocab_major else (((1,), (1,)), ((), ()))
    acc[...] += jax.lax.dot_general(dz, w, dims, preferred_element_type=f32,
                                    precision=plan.precision)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        dh_ref[...] = acc[...].astype(dh_ref.dtype)


def _dlm_head_kernel(*refs, plan: Plan):
    vlim, (rows_ref, h_ref, w_ref, dw_ref, acc) = _split(plan, refs)
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _init():
        acc[...] = jnp.zeros(acc.shape, f32)

    h = h_ref[...].astype(plan.dtype)
    if plan.tail_n:  # rows past N: unspecified memory; they must not enter h^T @ dz
        row = i * plan.bt + jax.lax.broadcasted_iota(jnp.int32, (h.shape[0], 1), 0)
        h = jnp.where(row < plan.n, h, jnp.zeros_like(h))
    s = _logits(plan, h, _valid_w(plan, j, w_ref[...], vlim))
    dz = _dz(plan, j, s, rows_ref, vlim)
    if plan.tail_n:
        dz = jnp.where(row < plan.n, dz, 0.0)

    def product(dz):
        # dW tile [H, bv] += h^T @ dz  (vocab major: dW^T tile [bv, H] += dz^T @ h).
        a, b = (dz, h) if plan.vocab_major else (h, dz)
        return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=f32,
                                   precision=plan.precision)

    if plan.dw_terms == 1:
        h = h.astype(plan.dz_dtype)
        upd = product(dz.astype(plan.dz_dtype))
    else:  # dz as input-dtype terms, each a single-pass matmul with h
        upd = product_of_terms(dz, plan.dtype, plan.dw_terms, product)
    acc[...] += upd

    @pl.when(i == pl.num_programs(1) - 1)
    def _finish():
        dw_ref[...] = acc[...].astype(dw_ref.dtype)


# --------------------------------------------------------------------------- pallas calls

def _w_spec(plan: Plan, tile_of):
    """BlockSpec of W's tile number ``tile_of(*grid)``."""
    if plan.vocab_major:
        return pl.BlockSpec((plan.bv, plan.h), lambda *g: (tile_of(*g), 0))
    return pl.BlockSpec((plan.h, plan.bv), lambda *g: (0, tile_of(*g)))


def _params(semantics, limit):
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=limit)


def vmem_estimate(plan: Plan) -> int:
    """Bytes of VMEM the largest of the three kernels needs, conservatively: double-
    buffered input and output blocks, the f32 accumulator, ~4 f32 [bt, bv] temporaries
    and the W tile's masked/cast copies, all padded to (8, 128) tiles."""
    it = ITEMSIZE[{jnp.float32: "f32", jnp.bfloat16: "bf16", jnp.float16: "f16"}[plan.dtype]]

    def tile(rows, cols, size):
        sub = SUBLANE * (4 // size)
        return -(-rows // sub) * sub * (-(-cols // LANE) * LANE) * size

    hb = tile(plan.bt, plan.h, it)
    wt = tile(plan.bv, plan.h, it) if plan.vocab_major else tile(plan.h, plan.bv, it)
    wt32 = wt * 4 // it
    zt = tile(plan.bt, plan.bv, 4)
    stats = tile(plan.bt, 1, 4)
    fwd = 2 * hb + 2 * wt + 4 * zt + 12 * stats
    if plan.dh_in_fwd:  # pw's scratch and double-buffered output block, W's masked copy
        pw = tile(plan.bt, plan.h, jnp.dtype(plan.dz_dtype).itemsize)
        fwd += tile(plan.bt, plan.h, 4) + 2 * pw + 2 * wt
    dh = 2 * hb + 2 * wt + 2 * wt + 2 * hb + tile(plan.bt, plan.h, 4) + 4 * zt + 6 * stats
    dw = 2 * hb + 2 * wt + 2 * wt + 2 * wt + wt32 + 4 * zt + 6 * stats
    return max(fwd, dh, dw)


def _limit(plan: Plan, limit: Optional[int]) -> int:
    if limit is not None:
        return limit
    return int(min(max(2 * vmem_estimate(plan), 32 * MiB), 100 * MiB))


def _counts(plan: Plan):
    """(grid steps, executed tile elements bt*bv*steps, rounding ops per element, mask)."""
    steps = plan.tok_blocks * plan.voc_tiles
    rnd = 5 if plan.round_logits and plan.dtype == jnp.bfloat16 else 0
    return steps, steps * plan.bt * plan.bv, rnd, int(plan.tail_v)


def fwd_cost(plan: Plan, hidden_dtype=None) -> pl.CostEstimate:
    """The forward kernel's cost, counted by hand from ``_fwd_kernel`` (XLA conventions:
    one flop per elementwise result, one per reduced element, exp/log transcendental;
    partial edge tiles count whole). MXU: 2*bt*bv*H per step. Per tile element: /tau,
    column add, [< V, select], max, s - m, exp, e > 0, e * d, select, sum e, sum e * d,
    == id, select, sum: 12 (+5 integer ops when rounding logits to bf16, +2 for the vocab
    mask). Per token and vocab tile: 10 running-statistics ops and an exp; per token at
    the end: log and 4 ops. Bytes: hidden once, the LM head once per token block, ids in,
    lse, logp and entropy out. ``hidden_dtype`` (default the input dtype): the hidden
    the kernel is given (the vocab-sharded wrapper passes f32 chunks; each step then
    converts its block to the input dtype)."""
    steps, tiles, rnd, m = _counts(plan)
    tok = plan.tok_blocks * plan.bt
    it = jnp.dtype(plan.dtype).itemsize
    hd = jnp.dtype(hidden_dtype or plan.dtype)
    hconv = int(hd != jnp.dtype(plan.dtype))
    n, h, v = plan.n, plan.h, plan.v
    pw_flops = pw_bytes = 0
    if plan.dh_in_fwd:
        # p' @ W^T per step; per tile element the chosen column's select (and p's convert);
        # per step W's mask (3 per W element when V is masked) and convert, and
        # r = alpha * r + ... (2 per r element); per token block r / l.
        pconv = int(plan.dz_dtype != f32)
        wconv = int(plan.dz_dtype != plan.dtype)
        pw_flops = (2 * plan.bt * plan.bv * h * steps + (1 + pconv) * tiles
                    + steps * plan.bv * h * (3 * m + wconv) + 2 * steps * plan.bt * h
                    + tok * h * (1 + pconv))
        pw_bytes = jnp.dtype(plan.dz_dtype).itemsize * n * h
    return pl.CostEstimate(
        flops=2 * plan.bt * plan.bv * h * steps + (12 + rnd + 2 * m) * tiles
        + 10 * tok * plan.voc_tiles + 4 * tok + steps * plan.bt * h * hconv + pw_flops,
        transcendentals=tiles + tok * plan.voc_tiles + tok,
        bytes_accessed=hd.itemsize * n * h + it * plan.tok_blocks * h * v + 16 * n + pw_bytes)


def _bwd_elem_ops(plan: Plan) -> int:
    """Per tile element of both backward kernels: /tau (and rounding) of the recomputed
    logits, then dz: column add, == id, convert, g * onehot, s - lse, exp, gp *, -, /tau,
    [< V, select], and dz's convert to the input dtype."""
    _, _, rnd, m = _counts(plan)
    return 1 + rnd + 8 + 2 * m + (plan.dz_dtype != f32)


def dhidden_cost(plan: Plan, hidden_dtype=None) -> pl.CostEstimate:
    """The dhidden kernel's cost, counted by hand from ``_dhidden_kernel``: two MXU
    matmuls per step (the logits and dz @ W^T), the per-element ops of
    ``_bwd_elem_ops``, per step the W tile's mask (iota add, compare, select: 3 per W
    element when V is masked; a convert when dz is f32 and W is not) and the accumulator
    add (bt*H), per token block dhidden's convert. Bytes: the per-token rows and hidden
    once per token block, the LM head once per token block, dhidden out (in hidden's
    dtype; a hidden of another dtype than the input's adds a convert per block element
    and step)."""
    steps, tiles, _, m = _counts(plan)
    it = jnp.dtype(plan.dtype).itemsize
    hd = jnp.dtype(hidden_dtype or plan.dtype)
    hconv = int(hd != jnp.dtype(plan.dtype))
    n, h, v, bt, bv = plan.n, plan.h, plan.v, plan.bt, plan.bv
    wconv = int(plan.dz_dtype != plan.dtype)
    rows = (8 if plan.lane_rows else 4) * 4 * n
    return pl.CostEstimate(
        flops=4 * bt * bv * h * steps + _bwd_elem_ops(plan) * tiles
        + steps * bv * h * (3 * m + wconv) + steps * bt * h * (1 + hconv)
        + plan.tok_blocks * bt * h * (hd != jnp.dtype(f32)),
        transcendentals=tiles,
        bytes_accessed=hd.itemsize * 2 * n * h + it * plan.tok_blocks * h * v + rows)


def dlm_head_cost(plan: Plan, hidden_dtype=None) -> pl.CostEstimate:
    """The dlm_head kernel's cost, counted by hand from ``_dlm_head_kernel``: two MXU
    matmuls per step (the logits and h^T @ dz), the per-element ops of
    ``_bwd_elem_ops`` (+1 select when the last token block is partial), per step the
    hidden block's mask (a select per element when partial; a convert when dz is f32 and
    hidden is not), the W tile's mask (3 per W element when V is masked) and the
    accumulator add (bv*H), per vocab tile dlm_head's convert. Bytes: the per-token rows
    and hidden once per vocab tile (in hidden's dtype: a convert per element and step when
    it is not the input's), the LM head and dlm_head once."""
    steps, tiles, _, m = _counts(plan)
    it = jnp.dtype(plan.dtype).itemsize
    hd = jnp.dtype(hidden_dtype or plan.dtype)
    n, h, v, bt, bv = plan.n, plan.h, plan.v, plan.bt, plan.bv
    tn = int(plan.tail_n)
    hconv = int(plan.dz_dtype != plan.dtype) + int(hd != jnp.dtype(plan.dtype))
    rows = (8 if plan.lane_rows else 4) * 4 * n
    extra = plan.dw_terms - 1  # per more term: a matmul, convert back and subtract, convert
    return pl.CostEstimate(
        flops=(4 + 2 * extra) * bt * bv * h * steps + (_bwd_elem_ops(plan) + tn + 3 * extra) * tiles
        + steps * (bt * h * (tn + hconv) + bv * h * (3 * m + 1 + extra))
        + plan.voc_tiles * bv * h * (plan.dtype != f32),
        transcendentals=tiles,
        bytes_accessed=hd.itemsize * plan.voc_tiles * n * h + it * 2 * h * v + plan.voc_tiles * rows)


def finite_garbage(shape, dtype, salt: int, v: int):
    """Deterministic finite filler for out-of-bounds block parts ("oob_fill": "finite"):
    floats in [-2, 2), integers in [0, v) (ids of real columns)."""
    i = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
    for ax in range(1, len(shape)):
        i = i * jnp.uint32(shape[ax]) + jax.lax.broadcasted_iota(jnp.uint32, shape, ax)
    x = ((i + jnp.uint32(salt)) * jnp.uint32(2654435761)) >> 16  # Knuth's multiplicative hash
    if jnp.issubdtype(dtype, jnp.floating):
        return (x.astype(f32) / 16384.0 - 2.0).astype(dtype)
    return (x % jnp.uint32(max(v, 1))).astype(dtype)


def _pad_axis(x, axis: int, size: int, salt: int, v: int):
    """x padded on ``axis`` up to ``size`` with ``finite_garbage``."""
    extra = size - x.shape[axis]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[axis] = extra
    return jnp.concatenate([x, finite_garbage(tuple(shape), x.dtype, salt, v)], axis=axis)


def make_logp_entropy(plan: Plan, *, interpret: bool, vmem_limit_bytes: Optional[int],
                      oob_fill: str = "unspecified"):
    """(hidden2 [N, H], W, ids, valid) -> (logp, entropy, lse), with ids and the outputs
    [1, N] rows when plan.lane_rows, else [N, 1] columns; with
    SPEC's VJP in logp and lse's own (entropy carries no gradient). W is lm_head [H, V], or lm_head.T if vocab_major."""
    limit = _limit(plan, vmem_limit_bytes)
    n, h, v, bt, bv = plan.n, plan.h, plan.v, plan.bt, plan.bv
    if plan.lane_rows:  # per-token vectors as [1, N] rows; the backward's as [8, N]
        row = pl.BlockSpec((1, bt), lambda i, j: (0, i))
        col = jax.ShapeDtypeStruct((1, n), f32)
        rows_of = lambda grid_tok: pl.BlockSpec((8, bt), lambda *g: (0, g[grid_tok]))  # noqa: E731
    else:
        row = pl.BlockSpec((bt, 1), lambda i, j: (i, 0))
        col = jax.ShapeDtypeStruct((n, 1), f32)
        rows_of = lambda grid_tok: pl.BlockSpec((bt, 4), lambda *g: (g[grid_tok], 0))  # noqa: E731
    hid = pl.BlockSpec((bt, h), lambda i, j: (i, 0))

    smem = [pl.BlockSpec(memory_space=pltpu.SMEM)] if plan.dynamic_valid else []

    def pre(valid):  # the SMEM count, first operand of every kernel (vocab shards)
        return [valid.reshape(1).astype(jnp.int32)] if plan.dynamic_valid else []

    # oob_fill "finite": operands padded to whole blocks (tokens and vocab tiles) with
    # finite garbage; the kernels still mask by plan.n and plan.v.
    finite = oob_fill == "finite"
    n_pad, v_pad = plan.tok_blocks * bt, plan.voc_tiles * bv
    row_axis = 1 if plan.lane_rows else 0
    w_axis = 0 if plan.vocab_major else 1

    def tok(x, axis, salt):
        return _pad_axis(x, axis, n_pad, salt, v) if finite else x

    def voc(w):
        return _pad_axis(w, w_axis, v_pad, 3, v) if finite else w

    def forward(hidden, w, ids, valid):
        """(lse, logp, entropy[, pw [N, H] in dz's dtype when plan.dh_in_fwd])."""
        pw_out = [hid] if plan.dh_in_fwd else []
        pw_shape = [jax.ShapeDtypeStruct((n, h), plan.dz_dtype)] if plan.dh_in_fwd else []
        pw_scratch = [pltpu.VMEM((bt, h), f32)] if plan.dh_in_fwd else []
        return pl.pallas_call(
            functools.partial(_fwd_kernel, plan=plan),
            grid=(plan.tok_blocks, plan.voc_tiles),
            in_specs=smem + [row, hid, _w_spec(plan, lambda i, j: j)],
            out_specs=[row] * 3 + pw_out,
            out_shape=[col] * 3 + pw_shape,
            scratch_shapes=[pltpu.VMEM((bt, 1), f32)] * 4 + pw_scratch,
            compiler_params=_params(("parallel", "arbitrary"), limit),
            cost_estimate=fwd_cost(plan, hidden.dtype),
            interpret=interpret,
            name="grpo_fused_fwd",
        )(*pre(valid), tok(ids, row_axis, 1), tok(hidden, 0, 2), voc(w))

    def dhidden(hidden, w, rows, valid):
        return pl.pallas_call(
            functools.partial(_dhidden_kernel, plan=plan),
            grid=(plan.tok_blocks, plan.voc_tiles),
            in_specs=smem + [rows_of(0), hid, _w_spec(plan, lambda i, j: j)],
            out_specs=hid,
            out_shape=jax.ShapeDtypeStruct((n, h), hidden.dtype),
            scratch_shapes=[pltpu.VMEM((bt, h), f32)],
            compiler_params=_params(("parallel", "arbitrary"), limit),
            cost_estimate=dhidden_cost(plan, hidden.dtype),
            interpret=interpret,
            name="grpo_fused_dhidden",
        )(*pre(valid), tok(rows, row_axis, 4), tok(hidden, 0, 2), voc(w))

    def dlm_head(hidden, w, rows, valid):
        thid = pl.BlockSpec((bt, h), lambda j, i: (i, 0))
        wspec = _w_spec(plan, lambda j, i: j)
        acc = (bv, h) if plan.vocab_major else (h, bv)
        w_in = voc(w)
        out = pl.pallas_call(
            functools.partial(_dlm_head_kernel, plan=plan),
            grid=(plan.voc_tiles, plan.tok_blocks),
            in_specs=smem + [rows_of(1), thid, wspec],
            out_specs=wspec,
            out_shape=jax.ShapeDtypeStruct(w_in.shape, w.dtype),
            scratch_shapes=[pltpu.VMEM(acc, f32)],
            compiler_params=_params(("parallel", "arbitrary"), limit),
            cost_estimate=dlm_head_cost(plan, hidden.dtype),
            interpret=interpret,
            name="grpo_fused_dlm_head",
        )(*pre(valid), tok(rows, row_axis, 4), tok(hidden, 0, 2), w_in)
        return jax.lax.slice_in_dim(out, 0, v, axis=w_axis) if out.shape != w.shape else out

    def dhidden_from_pw(hidden, w, ids, valid, logp, pw, g, g_lse):
        """dhidden = sum_v dz_v W_v with dz = (g onehot - (g - g_lse) p) / tau, from the
        forward's pw = sum over the non-chosen columns of p_v W_v: the chosen column's
        coefficient (g - (g - g_lse) p_y) / tau = (-g expm1(logp) + g_lse p_y) / tau
        (no cancellation as p_y -> 1) times W's chosen row, less (g - g_lse) / tau * pw.
        An id outside [0, valid) (another shard's column, or -1) has no chosen term."""
        idv = ids.reshape(n)
        vlim = valid.reshape(()) if plan.dynamic_valid else v
        mine = (idv >= 0) & (idv < vlim)
        lp = logp.reshape(n)
        gv, glv = g.reshape(n), g_lse.reshape(n)
        a = jnp.where(mine, (-gv * jnp.expm1(lp) + glv * jnp.exp(lp)) / plan.temperature, 0.0)
        b = (gv - glv) / plan.temperature
        y = jnp.clip(idv, 0, w.shape[w_axis] - 1)
        if plan.chosen_dma:
            wy = chosen_columns.gather(w, y, interpret=interpret).astype(f32)
        else:
            wy = (w[y, :] if plan.vocab_major else w[:, y].T).astype(f32)
        return (a[:, None] * wy - b[:, None] * pw.astype(f32)).astype(hidden.dtype)

    @jax.custom_vjp
    def logp_entropy_lse(hidden, w, ids, valid):
        lse, logp, ent = forward(hidden, w, ids, valid)[:3]
        return logp, ent, lse

    def fwd_rule(hidden, w, ids, valid):
        out = forward(hidden, w, ids, valid)
        lse, logp, ent = out[:3]
        pw = (logp, out[3]) if plan.dh_in_fwd else None
        return (logp, ent, lse), (hidden, w, ids, valid, lse, pw)

    def bwd_rule(res, cts):
        hidden, w, ids, valid, lse, pw = res
        g = cts[0].astype(f32)  # entropy's cotangent is ignored (a metric)
        parts = [lse, g, g - cts[2].astype(f32), ids.astype(f32)]
        if plan.lane_rows:  # [8, N]: four rows and four of padding to the sublane tile
            rows = jnp.concatenate(parts + [jnp.zeros((4, n), f32)], axis=0)
        else:
            rows = jnp.concatenate(parts, axis=1)
        if plan.dh_in_fwd:
            dh = dhidden_from_pw(hidden, w, ids, valid, pw[0], pw[1], g, cts[2].astype(f32))
        else:
            dh = dhidden(hidden, w, rows, valid)
        return dh, dlm_head(hidden, w, rows, valid), None, None

    logp_entropy_lse.defvjp(fwd_rule, bwd_rule)
    return logp_entropy_lse


# --------------------------------------------------------------------------- config

def _validate_options(options: Mapping[str, Any]) -> None:
    for key in ("block_tokens", "block_v"):
        val = options[key]
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise RequestError(f"impl_options.{key} must be a positive integer, got {val!r}")
    if options["interpret"] not in (None, True, False):
        raise RequestError(f"impl_options.interpret must be true, false or null (auto), "
                           f"got {options['interpret']!r}")
    if options["lm_head_layout"] not in (None, "hv", "vh"):
        raise RequestError(f"impl_options.lm_head_layout must be null (auto), 'hv' or 'vh', "
                           f"got {options['lm_head_layout']!r}")
    if options["bwd_dz_dtype"] not in ("input", "f32", "x3_dlm_head"):
        raise RequestError(f"impl_options.bwd_dz_dtype must be 'input', 'f32' or "
                           f"'x3_dlm_head', got {options['bwd_dz_dtype']!r}")
    if options["dhidden"] not in ("kernel", "forward"):
        raise RequestError(f"impl_options.dhidden must be 'kernel' or 'forward', "
                           f"got {options['dhidden']!r}")
    if options["chosen_gather"] not in chosen_columns.GATHERS:
        raise RequestError(f"impl_options.chosen_gather must be one of "
                           f"{list(chosen_columns.GATHERS)}, got {options['chosen_gather']!r}")
    if options["oob_fill"] not in ("unspecified", "finite"):
        raise RequestError(f"impl_options.oob_fill must be 'unspecified' or 'finite', "
                           f"got {options['oob_fill']!r}")
    limit = options["vmem_limit_bytes"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or not 0 < limit <= VMEM_LIMIT_MAX_BYTES):
        raise RequestError(f"impl_options.vmem_limit_bytes must be null or an integer in "
                           f"(0, {VMEM_LIMIT_MAX_BYTES}], got {limit!r}")


def make_plan(p: Problem, k: Knobs, options: Mapping[str, Any],
              dynamic_valid: bool = False) -> Plan:
    """Block sizes (clamped to the arrays), W's orientation and the in-kernel dtypes."""
    n = p.b * p.t
    layout = options["lm_head_layout"] or (
        "".join("hv"[i] for i in tpu_default_order((p.h, p.v), p.dtype))
        if p.platform == "tpu" else "hv")
    dtype = _DTYPES[p.dtype]
    return Plan(
        n=n, h=p.h, v=p.v, bt=min(options["block_tokens"], n), bv=min(options["block_v"], p.v),
        vocab_major=layout == "vh", dtype=dtype, temperature=k.temperature,
        round_logits=k.logits_dtype == "input",
        dz_dtype=f32 if options["bwd_dz_dtype"] == "f32" else dtype,
        precision=(jax.lax.Precision.HIGHEST if p.dtype == "f32" or options["bwd_dz_dtype"] == "f32"
                   else jax.lax.Precision.DEFAULT),
        dynamic_valid=dynamic_valid,
        lane_rows=min(options["block_tokens"], n) % LANE == 0,
        dw_terms=3 if options["bwd_dz_dtype"] == "x3_dlm_head" and p.dtype != "f32" else 1,
        dh_in_fwd=options["dhidden"] == "forward",
        chosen_dma=options["chosen_gather"] == "dma")


def extra_check(p: Problem, k: Knobs, options: Mapping[str, Any]) -> Optional[str]:
    """Invalid options raise RequestError; Mosaic constraints give an unsupported reason."""
    _validate_options(options)
    plan = make_plan(p, k, options)
    if plan.chosen_dma:
        if not plan.dh_in_fwd:
            return "chosen_gather 'dma' gathers for dhidden 'forward' (the dhidden kernel gathers nothing)"
        if plan.vocab_major:
            return ("chosen_gather 'dma' reads W [H, V]; this LM head is vocab-major, whose "
                    "chosen rows XLA gathers without a copy")
    if _interpret(p.platform, options):
        return None  # plain HLO: any block shape works
    if options["oob_fill"] != "unspecified":
        return ("oob_fill 'finite' pads the operands in HBM: a test aid of interpret mode, "
                "not a TPU kernel")
    if p.platform != "tpu":
        return f"Mosaic (interpret=false) needs platform tpu, not {p.platform!r}"
    if p.dtype == "f16":
        return "Mosaic cannot load f16 vectors on TPU v5e/v6e/tpu7x (\"Invalid vector type for load\")"
    bad = []
    if plan.bt % SUBLANE and plan.bt != plan.n:
        bad.append(f"block_tokens={options['block_tokens']} is neither a multiple of "
                   f"{SUBLANE} nor N=B*T={plan.n}")
    if plan.bv % LANE and plan.bv != plan.v:
        bad.append(f"block_v={options['block_v']} is neither a multiple of {LANE} nor V={plan.v}")
    misaligned = plan.chosen_dma and chosen_columns.unsupported_on_tpu(plan.v)
    if misaligned:
        bad.append(misaligned)
    need, limit = vmem_estimate(plan), _limit(plan, options["vmem_limit_bytes"])
    if need > limit:
        bad.append(f"estimated VMEM working set {need} B (block_tokens={plan.bt}, "
                   f"block_v={plan.bv}, H={plan.h}) exceeds the {limit} B limit")
    return "; ".join(bad) if bad else None


def per_token(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """(hidden [B, T, H], lm_head [H, V], ids [B, T], valid_v=None, with_lse=False) ->
    (logp, entropy[, lse]) [B, T]; columns >= valid_v (a traced count, passed to the
    kernels in SMEM) are padding; an id of -1 selects no column; lse (logsumexp of the
    row) is differentiable too when asked for."""
    if problem.level != "fused":
        raise ValueError("pallas_fused implements the fused level only")
    _validate_options(options)
    b, t, h = problem.b, problem.t, problem.h
    kernels = {}

    def kernel_for(dynamic: bool):
        if dynamic not in kernels:
            plan = make_plan(problem, k, options, dynamic_valid=dynamic)
            kernels[dynamic] = (plan, make_logp_entropy(
                plan, interpret=_interpret(problem.platform, options),
                vmem_limit_bytes=options["vmem_limit_bytes"], oob_fill=options["oob_fill"]))
        return kernels[dynamic]

    def f(hidden, lm_head, chosen_ids, valid_v=None, with_lse=False):
        plan, kernel = kernel_for(valid_v is not None)
        # lm_head.T is a bitcast when [V][H] is its physical order (no copy).
        w = lm_head.T if plan.vocab_major else lm_head
        ids = chosen_ids.reshape((1, plan.n) if plan.lane_rows else (plan.n, 1)).astype(jnp.int32)
        logp, ent, lse = kernel(hidden.reshape(plan.n, h), w, ids, valid_v)
        out = (logp.reshape(b, t), jax.lax.stop_gradient(ent.reshape(b, t)))
        return out + (lse.reshape(b, t),) if with_lse else out
    return f


def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """All SPEC inputs in order -> (loss, metrics..., dhidden, dlm_head)."""
    return grpo_math.spec_function(per_token(problem, k, options), k, nhead=2)


IMPLEMENTATION = Implementation(
    id="pallas_fused",
    description="Pallas fused LM head: logits tiles formed on the MXU in VMEM, online "
                "logsumexp; backward recomputes tiles in a dhidden kernel (token-parallel) "
                "and a dlm_head kernel (vocab-parallel)",
    build=build,
    capabilities=Capabilities(levels=frozenset({"fused"}), platforms=frozenset({"cpu", "tpu"}), mosaic_tpu=True),
    default_options={"block_tokens": 256, "block_v": 512, "interpret": None,
                     "lm_head_layout": None, "bwd_dz_dtype": "input", "vmem_limit_bytes": None,
                     "oob_fill": "unspecified", "dhidden": "kernel", "chosen_gather": "xla"},
    extra_check=extra_check,
    validate_options=_validate_options,
    per_token=per_token,
    search_space={"block_tokens": (128, 256, 512, 1024), "block_v": (256, 512, 1024, 2048),
                  "bwd_dz_dtype": ("input", "f32"), "dhidden": ("kernel", "forward"),
                  "chosen_gather": ("xla", "dma")},
    # dz rounded to the input dtype is one bf16 term; f32 dz is shown by its dots.
    option_class=lambda o, dtype: (None if dtype == "f32" else
                                   {"input": "bf16", "x3_dlm_head": "bf16x3"}.get(o["bwd_dz_dtype"])),
)
