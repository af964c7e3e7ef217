"""``pallas_logits`` / ``pallas_logits_jaxbwd``: logits-level Pallas kernels (SPEC.md).

HBM layout. The kernels read ``logits`` [B, T, V] and write ``dlogits`` [B, T, V] in the
*physical* order of the entry parameter / result, so that no relayout copy of either
array is needed (a copy of a [B, T, V] array doubles peak HBM). XLA:TPU does not store
an entry array row-major: with the default layout mode it picks the "compact" layout,
the dimension order (and small second-minor tile, 1/2/4/8 rows) of least padded size.
For an unaligned vocabulary this is rarely [B][T][V]: bf16 [1, 2048, 151643] is stored
[B][V][T] and f32 [4, 1024, 151643] is [V][B][T] (T minor, no padding at all). A Mosaic
kernel only reads row-major operands, so the kernel is given ``transpose(logits, perm)``
with ``perm`` the physical order (option ``logits_layout``; auto = ``tpu_default_layout``,
which reproduces XLA:TPU's choice) and XLA turns the transposes into bitcasts. Measured
(deviceless libtpu compile, v5e/v6e): peak HBM 2.00x arguments+outputs before, 1.00x now.

Blocks (``make_plan``). Row-major logits whose [B, T, V] -> [N, V] reshape is free
(N = B*T; always off TPU, on TPU when B = 1 or T % 8 == 0) are tiled as before the
layout fix: (block_rows, block_v) blocks of the [N, V] view. Otherwise the vocab axis gets
``block_v`` and the two token axes (in their physical order) together ``block_rows``
tokens: the inner token axis takes min(block_rows, its size), the outer one the rest;
with the vocab major the vocab block is rescaled to keep the padded tile size. Nothing
is padded in HBM: partial blocks on any axis compute values that Pallas discards on
write-back (tokens are independent), and the last, partial vocab tile is masked
in-kernel (vocab entries >= V are excluded from max, sum, entropy and the chosen logit;
the backward writes 0 there, and they are outside the array).

Forward kernel, grid (token blocks, one axis per token dim with more than one block:
"parallel"; vocab blocks "arbitrary", last), one pass over the vocab with per-token
running statistics in VMEM scratch (reductions run along the vocab axis of the tile,
wherever it is):

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
Both kernels carry a ``pl.CostEstimate`` so XLA's cost analysis sees them.

The GRPO terms and aggregation (ratio, SPEC tie rule, delta, k3 KL, loss types, sequence
level, masking) are ``grpo_math`` in JAX around the kernel; advantages never enter a kernel
(seed 004: rank-1 advantages blocks did not lower on TPU for B > 1).

``impl_options`` (defaults in ``_COMMON_OPTIONS``):
  block_rows      128   tokens per block (clamped to the array; see Blocks)
  block_v         2048  vocab entries per block (clamped to V; rescaled if the vocab is
                        the major dim, see Blocks)
  interpret       null  null = auto (True on cpu, False on tpu)
  bwd_impl        "pallas" | "jax" (``pallas_logits`` only)
  logits_layout   null  physical order of logits/dlogits, major to minor, one of
                        ``LAYOUTS`` ("btv" = row-major); null = auto (on tpu
                        ``tpu_default_layout``, else "btv"). Any value computes the same
                        function; a value other than XLA's choice costs relayout copies.
  vmem_limit_bytes null Mosaic scoped-VMEM limit per kernel (``pltpu.CompilerParams``);
                        null = the compiler default (v5e 16 MiB, v6e 32 MiB). Also the
                        budget ``extra_check`` applies (default ``VMEM_BUDGET_BYTES``).

TPU (``interpret=False``, Mosaic): the last two block dims must be divisible by 8 and 128
or equal the array dims (blocks larger than the array are clamped to it first), and the
estimated VMEM working set must fit the budget: a conservative 16 MiB (v5e's default
scoped VMEM limit; v6e's is 32 MiB) unless ``vmem_limit_bytes`` is set (at most
``VMEM_LIMIT_MAX_BYTES``: the 128 MiB of VMEM v5e and v6e have). ``extra_check`` reports
violations as unsupported.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..spec import Knobs, Problem, RequestError
from . import grpo_math
from .interface import Capabilities, Implementation
from .tpu_layout import tpu_default_order

f32 = jnp.float32

SUBLANE, LANE = 8, 128
# Conservative VMEM budget for one kernel: v5e's default scoped limit (v6e: 32 MiB).
VMEM_BUDGET_BYTES = 16 * 1024 * 1024
# Largest accepted vmem_limit_bytes: the physical VMEM of v5e and v6e (128 MiB).
VMEM_LIMIT_MAX_BYTES = 128 * 1024 * 1024
# Initial running max: finite so that (m_old - m_new) * l_old is 0, never -inf * 0.
_M_INIT = -1e30
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}

# Logical axes of the logits and the physical orders (major to minor) a kernel can read.
AXES = "btv"
LAYOUTS = tuple("".join(p) for p in itertools.permutations(AXES))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def tpu_default_layout(shape, dtype: str) -> str:
    """The physical order (major to minor, e.g. "bvt") XLA:TPU gives a [B, T, V] entry
    parameter or result of this shape and dtype (``tpu_layout.tpu_default_order``)."""
    return "".join(AXES[i] for i in tpu_default_order(shape, dtype))


# --------------------------------------------------------------------------- kernels
# Refs are the kernel's view of one block: logits/dlogits tiles of rank 2 or 3 with the
# vocab axis at ``kv``; per-token refs (ids, lse, g, outputs, scratch) have the same rank
# with size 1 at ``kv``. Reductions over ``kv`` with keepdims map one onto the other.

def _fwd_kernel(ids_ref, z_ref, lse_ref, logp_ref, ent_ref, m_sc, l_sc, a_sc, c_sc, *,
                v: int, block_v: int, kv: int, vgrid: int, temperature: float,
                mask_tail: bool):
    j = pl.program_id(vgrid)  # the vocab grid axis (the last one)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, _M_INIT, f32)
        l_sc[...] = jnp.zeros(l_sc.shape, f32)
        a_sc[...] = jnp.zeros(a_sc.shape, f32)
        c_sc[...] = jnp.zeros(c_sc.shape, f32)

    s = z_ref[...].astype(f32) / temperature                        # the tile
    col = j * block_v + jax.lax.broadcasted_iota(jnp.int32, s.shape, kv)
    if mask_tail:  # the last vocab tile runs past V: those entries are not logits
        s = jnp.where(col < v, s, -jnp.inf)
    m_old, l_old, a_old = m_sc[...], l_sc[...], a_sc[...]            # per token
    m_new = jnp.maximum(m_old, jnp.max(s, axis=kv, keepdims=True))
    alpha = jnp.exp(m_old - m_new)
    d = s - m_new
    e = jnp.exp(d)
    ed = jnp.where(e > 0, e * d, 0.0)  # e == 0 (masked entry or -inf logit): no 0 * -inf
    l_sc[...] = alpha * l_old + jnp.sum(e, axis=kv, keepdims=True)
    a_sc[...] = alpha * (a_old + (m_old - m_new) * l_old) + jnp.sum(ed, axis=kv, keepdims=True)
    m_sc[...] = m_new
    hit = col == ids_ref[...]                                        # y is in [0, V)
    c_sc[...] += jnp.sum(jnp.where(hit, s, 0.0), axis=kv, keepdims=True)

    @pl.when(j == pl.num_programs(vgrid) - 1)
    def _finish():
        log_l = jnp.log(l_sc[...])
        lse = m_sc[...] + log_l
        lse_ref[...] = lse
        logp_ref[...] = c_sc[...] - lse
        ent_ref[...] = log_l - a_sc[...] / l_sc[...]


def _bwd_kernel(ids_ref, lse_ref, g_ref, z_ref, dz_ref, *,
                v: int, block_v: int, kv: int, vgrid: int, temperature: float,
                mask_tail: bool):
    j = pl.program_id(vgrid)
    s = z_ref[...].astype(f32) / temperature
    col = j * block_v + jax.lax.broadcasted_iota(jnp.int32, s.shape, kv)
    p = jnp.exp(s - lse_ref[...])
    onehot = (col == ids_ref[...]).astype(f32)
    dz = g_ref[...] * (onehot - p) / temperature
    if mask_tail:  # entries >= V: outside the array (dropped on write-back); write 0 anyway
        dz = jnp.where(col < v, dz, 0.0)
    dz_ref[...] = dz.astype(dz_ref.dtype)


# --------------------------------------------------------------------------- config

class Plan(NamedTuple):
    """How the kernels tile one problem. ``shape``, ``block`` and dims are those of the
    kernel operand: ``transpose(logits, perm)`` (major to minor), or its free reshape to
    [N, V] (N = B*T) for the row-major layout ("flat")."""

    layout: str     # e.g. "bvt"
    perm: tuple     # physical dim i holds logical axis perm[i] (0=B, 1=T, 2=V)
    shape: tuple    # the kernel operand's shape: 3-D physical, or [N, V] when flat
    kv: int         # the vocab dim of the operand
    block: tuple    # block shape (ints)
    squeeze: tuple  # dims whose size-1 block is squeezed out of the kernel's view

    @property
    def flat(self) -> bool:
        return len(self.shape) == 2

    @property
    def token_dims(self) -> tuple:
        return tuple(p for p in range(len(self.shape)) if p != self.kv)

    @property
    def grid_token_dims(self) -> tuple:
        """Token dims with more than one block: one grid axis each (major first)."""
        return tuple(p for p in self.token_dims if self.shape[p] > self.block[p])

    @property
    def grid(self) -> tuple:
        """(token blocks per grid_token_dims..., vocab blocks): the vocab axis is last."""
        return tuple(pl.cdiv(self.shape[p], self.block[p])
                     for p in self.grid_token_dims + (self.kv,))

    @property
    def dim_names(self) -> tuple:
        return ("N", "V") if self.flat else tuple(self.layout.upper())

    @property
    def kernel_block(self) -> tuple:
        """The block as the kernel sees it (squeezed dims dropped)."""
        return tuple(b for p, b in enumerate(self.block) if p not in self.squeeze)

    @property
    def kernel_kv(self) -> int:
        """The vocab axis in the kernel's (squeezed) view of a block."""
        return self.kv - sum(p < self.kv for p in self.squeeze)


def _layout(problem: Problem, options: Mapping[str, Any]) -> str:
    layout = options.get("logits_layout")
    if layout is not None:
        return layout
    if problem.platform == "tpu":
        return tpu_default_layout((problem.b, problem.t, problem.v), problem.dtype)
    return "btv"


def make_plan(problem: Problem, options: Mapping[str, Any]) -> Plan:
    """Physical layout and block shape (blocks are clamped to the array).

    Row-major ("btv") with a free [B, T, V] -> [N, V] reshape (always off TPU; on TPU when
    B = 1 or T is a multiple of 8, the rows of a tile): blocks (block_rows, block_v) of
    the [N, V] view. Other orders with the vocab minor or second-minor ("btv", "tbv",
    "bvt", "tvb"): the vocab block is ``block_v``, the inner token dim takes
    min(block_rows, size), the outer one block_rows // that (at least 1). Vocab major
    ("vbt", "vtb", XLA's choice e.g. for f32 [4, 1024, 151643]): the tokens fill the lanes
    (min(block_rows, size)) and the second-minor token dim is squeezed if it has size 1,
    else taken whole or in multiples of 8 (each slab is padded to 8 sublanes in VMEM); the
    vocab block (a leading dim) is then scaled so the padded tile keeps
    block_rows x block_v elements.
    """
    layout = _layout(problem, options)
    perm = tuple(AXES.index(c) for c in layout)
    b, t, v = problem.b, problem.t, problem.v
    rows, block_v = int(options["block_rows"]), int(options["block_v"])
    if layout == "btv" and (problem.platform != "tpu" or b == 1 or t % SUBLANE == 0):
        n = b * t
        return Plan(layout, perm, (n, v), 1, (min(rows, n), min(block_v, v)), ())
    shape = tuple((b, t, v)[a] for a in perm)
    kv = perm.index(2)
    block = [0, 0, 0]
    pa, pb = (p for p in range(3) if p != kv)
    block[pb] = min(rows, shape[pb])
    outer = min(max(1, rows // block[pb]), shape[pa])
    if pa == 1 and outer % SUBLANE and outer != shape[pa]:
        # A sublane dim takes a multiple of 8 or the whole dim: round to one (may exceed rows).
        outer = min(shape[pa], max(SUBLANE, outer // SUBLANE * SUBLANE))
    block[pa] = outer
    if kv == 0:
        padded = (1 if shape[1] == 1 else _round_up(block[1], SUBLANE)) * _round_up(block[2], LANE)
        block_v = max(1, rows * block_v // padded)
    block[kv] = min(block_v, shape[kv])
    # Size-1 blocks squeezed out of the kernel's view: the leading dim (tokens), and a
    # second-minor token dim of size 1 (V major): the kernel then works on 2-D tiles.
    if kv == 0:
        squeeze = (1,) if shape[1] == 1 else ()
    else:
        squeeze = (0,) if block[0] == 1 else ()
    return Plan(layout, perm, shape, kv, tuple(block), squeeze)


def _interpret(platform: str, options: Mapping[str, Any]) -> bool:
    flag = options.get("interpret")
    return platform == "cpu" if flag is None else bool(flag)


def _vmem_bytes(block, itemsize: int) -> int:
    """VMEM footprint of a block: minor dim padded to 128 lanes, second-minor to the
    sublane tile (8 rows of 32 bits: 16 rows for 16-bit types)."""
    *lead, second, minor = block
    rows = SUBLANE * (4 // itemsize)
    return math.prod(lead) * _round_up(second, rows) * _round_up(minor, LANE) * itemsize


def vmem_estimate(block, kv: int, dtype: str, bwd_pallas: bool) -> int:
    """Bytes of VMEM one kernel needs (the larger of fwd and bwd), conservatively.

    ``block`` is the kernel's view of a logits tile (``Plan.kernel_block``, major to
    minor) and ``kv`` its vocab axis. Double-buffered logits tile (and dlogits tile in the
    backward), ~4 f32 tile-sized temporaries (s, exp, products, iota), and per-token
    blocks (the tile with size 1 on the vocab axis), all padded to (8, 128) tiles.
    """
    block = tuple(block)
    stats = block[:kv] + (1,) + block[kv + 1:]
    tile_in, tile_f32 = _vmem_bytes(block, _ITEMSIZE[dtype]), _vmem_bytes(block, 4)
    rows = _vmem_bytes(stats, 4)
    fwd = 2 * tile_in + 4 * tile_f32 + 2 * 4 * rows + 4 * rows
    bwd = 4 * tile_in + 4 * tile_f32 + 2 * 3 * rows
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
    layout = options.get("logits_layout")
    if layout is not None and layout not in LAYOUTS:
        raise RequestError(f"impl_options.logits_layout must be null (auto) or one of "
                           f"{list(LAYOUTS)}, got {layout!r}")
    limit = options.get("vmem_limit_bytes")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or not 0 < limit <= VMEM_LIMIT_MAX_BYTES):
        raise RequestError(f"impl_options.vmem_limit_bytes must be null or an integer in "
                           f"(0, {VMEM_LIMIT_MAX_BYTES}], got {limit!r}")


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
    if p.dtype == "f16":
        # Measured with libtpu 0.0.42.1 (tpu-aot, v5e, v6e and tpu7x): "Mosaic failed to compile
        # TPU kernel: Invalid vector type for load" on the f16 logits block.
        return "Mosaic cannot load f16 vectors on TPU v5e/v6e/tpu7x (\"Invalid vector type for load\")"
    plan = make_plan(p, options)
    bad = []
    rank = len(plan.shape)
    for dim, unit in ((rank - 2, SUBLANE), (rank - 1, LANE)):
        blk, size = plan.block[dim], plan.shape[dim]
        if blk % unit and blk != size:
            key = "block_v" if dim == plan.kv else "block_rows"
            where = "lane" if dim == rank - 1 else "sublane"
            view = "[N, V] view" if plan.flat else f"{plan.layout!r} layout"
            bad.append(f"{key}={options[key]} is neither a multiple of {unit} nor "
                       f"{plan.dim_names[dim]}={size} (block {blk} on the {where} axis of "
                       f"the logits' {view})")
    need = vmem_estimate(plan.kernel_block, plan.kernel_kv, p.dtype,
                         options.get("bwd_impl", "pallas") == "pallas")
    budget = options.get("vmem_limit_bytes") or VMEM_BUDGET_BYTES
    if need > budget:
        bad.append(f"estimated VMEM working set {need} B for blocks {plan.block} "
                   f"({plan.layout}) {p.dtype} exceeds the {budget} B budget")
    return "; ".join(bad) if bad else None


# --------------------------------------------------------------------------- pallas calls

def _spec(plan: Plan, *, stats: bool) -> pl.BlockSpec:
    """BlockSpec of a logits-shaped (stats=False) or per-token (stats=True) operand."""
    kv, tokens = plan.kv, plan.grid_token_dims
    block = list(plan.block)
    if stats:
        block[kv] = 1
    for p in plan.squeeze:
        block[p] = None

    def index_map(*g):  # grid (token blocks..., vocab blocks); see Plan.grid
        idx = [0] * len(block)
        for p, i in zip(tokens, g):
            idx[p] = i
        idx[kv] = 0 if stats else g[-1]
        return tuple(idx)
    return pl.BlockSpec(tuple(block), index_map)


def _stats_shape(plan: Plan) -> tuple:
    return plan.shape[:plan.kv] + (1,) + plan.shape[plan.kv + 1:]


def _compiler_params(semantics, vmem_limit_bytes):
    return pltpu.CompilerParams(dimension_semantics=semantics,
                                vmem_limit_bytes=vmem_limit_bytes)


def _executed(plan: Plan) -> int:
    """Elements of the logits tiles the grid computes (a partial edge block counts whole:
    the kernel runs on the full tile and Pallas drops the rest on write-back)."""
    return math.prod(pl.cdiv(s, b) * b for s, b in zip(plan.shape, plan.block))


def fwd_cost(plan: Plan, itemsize: int, masked: bool, bytes_scale: float = 1.0) -> pl.CostEstimate:
    """The forward kernel's cost, counted by hand from ``_fwd_kernel`` (XLA conventions:
    one flop per elementwise result, one per reduced element; exp/log transcendental).
    Per tile element: convert (non-f32 input), /tau, column add, [< V, select], max,
    s - m, exp, e > 0, e * d, select, sum e, sum e * d, == id, select, sum: 12 (+1 for a
    convert, +2 for the tail mask). Per token and vocab tile: 10 running-statistics ops
    and one exp (alpha); per token at the end: log and 4 ops. Bytes: the logits once
    (clipped to the array), ids in, lse, logp and entropy out."""
    v = plan.shape[plan.kv]
    vtiles = plan.grid[-1]
    ex = _executed(plan)
    tok = ex // (vtiles * plan.block[plan.kv])
    per_elem = 12 + (itemsize != 4) + 2 * masked
    n = math.prod(plan.shape) // v
    return pl.CostEstimate(
        flops=per_elem * ex + 10 * tok * vtiles + 4 * tok,
        transcendentals=ex + tok * vtiles + tok,
        bytes_accessed=int(bytes_scale * (n * v * itemsize + 4 * n + 3 * 4 * n)))


def bwd_cost(plan: Plan, itemsize: int, masked: bool) -> pl.CostEstimate:
    """The Pallas backward kernel's cost, counted by hand from ``_bwd_kernel``. Per tile
    element: convert (non-f32 input), /tau, column add, s - lse, exp, == id, convert,
    onehot - p, g *, /tau, convert out (non-f32), [< V, select]: 8 (+2 converts, +2 for
    the tail mask). Bytes: logits in, dlogits out, ids, lse and g."""
    v = plan.shape[plan.kv]
    ex = _executed(plan)
    n = math.prod(plan.shape) // v
    return pl.CostEstimate(
        flops=(8 + 2 * (itemsize != 4) + 2 * masked) * ex, transcendentals=ex,
        bytes_accessed=2 * n * v * itemsize + 3 * 4 * n)


def _fwd(zp, idsp, *, plan, temperature, interpret, mask_tail, vmem_limit_bytes,
         declared_bytes_scale=1.0):
    v = plan.shape[plan.kv]
    bv = plan.block[plan.kv]
    kernel = functools.partial(_fwd_kernel, v=v, block_v=bv, kv=plan.kernel_kv,
                               vgrid=len(plan.grid) - 1, temperature=temperature,
                               mask_tail=mask_tail and v % bv != 0)
    row = jax.ShapeDtypeStruct(_stats_shape(plan), f32)
    rows = _spec(plan, stats=True)
    scratch = tuple(b for b in rows.block_shape if b is not None)  # the kernel's view
    cost = fwd_cost(plan, zp.dtype.itemsize, mask_tail and v % bv != 0, declared_bytes_scale)
    return pl.pallas_call(
        kernel,
        grid=plan.grid,
        in_specs=[rows, _spec(plan, stats=False)],
        out_specs=[rows] * 3,
        out_shape=[row] * 3,
        scratch_shapes=[pltpu.VMEM(scratch, f32)] * 4,
        compiler_params=_compiler_params(
            ("parallel",) * (len(plan.grid) - 1) + ("arbitrary",), vmem_limit_bytes),
        cost_estimate=cost,
        interpret=interpret,
        name="grpo_logp_fwd",
    )(idsp, zp)


def _bwd_pallas(zp, idsp, lse, g, *, plan, temperature, interpret, mask_tail,
                vmem_limit_bytes):
    v = plan.shape[plan.kv]
    bv = plan.block[plan.kv]
    kernel = functools.partial(_bwd_kernel, v=v, block_v=bv, kv=plan.kernel_kv,
                               vgrid=len(plan.grid) - 1, temperature=temperature,
                               mask_tail=mask_tail and v % bv != 0)
    cost = bwd_cost(plan, zp.dtype.itemsize, mask_tail and v % bv != 0)
    tile = _spec(plan, stats=False)
    return pl.pallas_call(
        kernel,
        grid=plan.grid,
        in_specs=[_spec(plan, stats=True)] * 3 + [tile],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(zp.shape, zp.dtype),
        compiler_params=_compiler_params(("parallel",) * len(plan.grid), vmem_limit_bytes),
        cost_estimate=cost,
        interpret=interpret,
        name="grpo_logp_bwd",
    )(idsp, lse, g, zp)


def _bwd_jax(zp, idsp, lse, g, *, kv, temperature):
    s = zp.astype(f32) / temperature
    p = jnp.exp(s - lse)
    onehot = jax.lax.broadcasted_iota(jnp.int32, s.shape, kv) == idsp
    return (g * (onehot.astype(f32) - p) / temperature).astype(zp.dtype)


def make_logp_entropy(*, plan, temperature, interpret, bwd_impl, mask_tail=True,
                      vmem_limit_bytes=None, declared_bytes_scale=1.0):
    """(zp, idsp) -> (logp, entropy), with SPEC's VJP, in ``plan``'s order:
    zp = transpose(logits, plan.perm) reshaped to plan.shape, idsp the same of
    ids[..., None] (i32, size 1 on the vocab dim); outputs f32 shaped like idsp.
    ``declared_bytes_scale`` scales the forward kernel's declared bytes (1: honest; the
    test variant ``tests/data/misdeclared.py`` declares half)."""
    fwd_kw = dict(plan=plan, temperature=temperature, interpret=interpret,
                  mask_tail=mask_tail, vmem_limit_bytes=vmem_limit_bytes)

    @jax.custom_vjp
    def logp_entropy(zp, idsp):
        _, logp, ent = _fwd(zp, idsp, **fwd_kw, declared_bytes_scale=declared_bytes_scale)
        return logp, ent

    def fwd_rule(zp, idsp):
        lse, logp, ent = _fwd(zp, idsp, **fwd_kw, declared_bytes_scale=declared_bytes_scale)
        return (logp, ent), (zp, idsp, lse)

    def bwd_rule(res, cts):
        zp, idsp, lse = res
        g, _ = cts  # entropy is a metric: its cotangent is ignored
        g = g.astype(f32)
        if bwd_impl == "pallas":
            dz = _bwd_pallas(zp, idsp, lse, g, **fwd_kw)
        else:
            dz = _bwd_jax(zp, idsp, lse, g, kv=plan.kv, temperature=temperature)
        return dz, None

    logp_entropy.defvjp(fwd_rule, bwd_rule)
    return logp_entropy


# --------------------------------------------------------------------------- builder

def _per_token_builder(bwd_impl_fixed: Optional[str], declared_bytes_scale: float = 1.0):
    def per_token(problem: Problem, k: Knobs, options: Mapping[str, Any]):
        """(logits [B, T, V], ids [B, T]) -> (logp, entropy) [B, T], through the kernels."""
        if problem.level != "logits":
            raise ValueError("pallas_logits implements the logits level only")
        _validate_options({"interpret": None, **options})
        b, t, v = problem.b, problem.t, problem.v
        plan = make_plan(problem, options)
        inverse = tuple(plan.perm.index(a) for a in range(3))
        physical = tuple((b, t, v)[a] for a in plan.perm)          # transpose(logits, perm)
        stats3 = tuple(1 if a == 2 else n for a, n in zip(plan.perm, physical))
        kernel = make_logp_entropy(
            plan=plan, temperature=k.temperature,
            interpret=_interpret(problem.platform, options),
            bwd_impl=bwd_impl_fixed or options["bwd_impl"],
            mask_tail=not options.get("_unsafe_no_tail_mask", False),
            vmem_limit_bytes=options.get("vmem_limit_bytes"),
            declared_bytes_scale=declared_bytes_scale)

        def per_token_out(x):  # kernel per-token output -> [B, T]
            return jnp.transpose(x.reshape(stats3), inverse).reshape(b, t)

        def f(logits, chosen_ids):
            # The transposes (and the flat [N, V] reshape) are bitcasts when plan.layout is
            # the arrays' physical order: no copy of logits or dlogits.
            zp = jnp.transpose(logits, plan.perm).reshape(plan.shape)
            idsp = jnp.transpose(chosen_ids.astype(jnp.int32)[..., None], plan.perm)
            logp_p, ent_p = kernel(zp, idsp.reshape(_stats_shape(plan)))
            return per_token_out(logp_p), jax.lax.stop_gradient(per_token_out(ent_p))
        return f
    return per_token


def _builder(bwd_impl_fixed: Optional[str], declared_bytes_scale: float = 1.0):
    per_token = _per_token_builder(bwd_impl_fixed, declared_bytes_scale)

    def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
        """All SPEC inputs in order -> (loss, metrics..., dlogits)."""
        return grpo_math.spec_function(per_token(problem, k, options), k, nhead=1)
    return build


_CAPS = Capabilities(levels=frozenset({"logits"}), platforms=frozenset({"cpu", "tpu"}), mosaic_tpu=True)
# What `grpo-suite sweep` compares: blocks of 64 to 512 tokens by 512 to 4096 vocab entries.
_SPACE = {"block_rows": (64, 128, 256, 512), "block_v": (512, 1024, 2048, 4096)}
_COMMON_OPTIONS = {"block_rows": 128, "block_v": 2048, "interpret": None,
                   "logits_layout": None, "vmem_limit_bytes": None}

IMPLEMENTATION = Implementation(
    id="pallas_logits",
    description="Pallas logits-level kernel: vocab-tiled online logsumexp + entropy, "
                "masked last vocab tile, logits read in their physical HBM order; "
                "custom_vjp with a Pallas (or JAX) dlogits backward",
    build=_builder(None),
    capabilities=_CAPS,
    default_options={**_COMMON_OPTIONS, "bwd_impl": "pallas"},
    extra_check=extra_check,
    validate_options=_validate_options,
    per_token=_per_token_builder(None),
    search_space=_SPACE,
)

IMPLEMENTATION_JAXBWD = Implementation(
    id="pallas_logits_jaxbwd",
    description="pallas_logits forward kernel; dlogits in plain JAX from the saved lse",
    build=_builder("jax"),
    capabilities=_CAPS,
    default_options=dict(_COMMON_OPTIONS),
    extra_check=extra_check,
    validate_options=_validate_options,
    per_token=_per_token_builder("jax"),
    search_space=_SPACE,
)
