"""The cost of every Pallas TPU kernel of a function, derived from the kernel itself.

A kernel's ``pl.CostEstimate`` is whatever its author declares; XLA's cost analysis takes
it as is, so a kernel that under-declares looks free. This module reads instead what the
kernel does, from the ``pallas_call`` equations of the function's jaxpr:

* **HBM traffic** from the grid, the BlockSpecs and their index maps. The TPU pipeline
  visits the grid in row-major order (the last axis fastest); an input block is copied
  into VMEM when its block index differs from the previous step's (and at the first
  step), an output block is written back when its block index differs from the next
  step's (and at the last step). The index maps are evaluated for every grid step; the
  bytes of a copy are those of the block clipped to the array (a partial edge block moves
  only its in-bounds part). Operands in SMEM or whole-array VMEM count once per copy like
  any block; an operand left in HBM (``memory_space=ANY``) is moved by the kernel's own
  DMAs, which are counted where the body starts them (``dma_start``).
* **MXU work** from the ``dot_general``s of the body: 2·M·N·K per dot, per grid step
  that executes it, with the operand dtypes and precision (``matmul_pass_flops`` weighs
  an f32 matmul by its bf16 passes: 6 at HIGHEST, 3 at HIGH, 1 at XLA's DEFAULT; Mosaic's
  default for f32 operands is taken as 6, the fp32 contract).
* **Other FLOPs and transcendentals** with XLA's cost-analysis conventions: one flop per
  output element of an elementwise op (arithmetic, comparisons, selects, converts,
  bitwise), one per input element of a reduction; ``exp``, ``log``, ``tanh`` and the like
  count as transcendentals, not flops; reshapes, broadcasts, transposes, slices, iotas
  and VMEM loads and stores count nothing. Scalar (rank-0) work is the scalar unit's and
  counts nothing.

Work inside ``pl.when`` / ``lax.cond`` counts on the grid steps whose branch index says so
(the index is evaluated from ``program_id`` and ``num_programs`` for every step); work in
a ``fori_loop`` / ``scan`` counts once per trip. A construct the derivation cannot follow
is counted as if it ran on every step (an upper bound) and named in ``notes``.

What it cannot see: traffic between VMEM and the vector registers, whether DMAs overlap
the compute, MXU efficiency at small tiles, the fixed cost of a grid step. See
docs/tpu.md.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

# Bumped when a rule changes: records carry it, so figures from different rules are not
# compared as if they were one.
COST_MODEL_VERSION = 1

# lax primitives counted as transcendentals (XLA: exponential, log, tanh, ...).
TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "pow",
    "sqrt", "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "lgamma", "digamma",
})
# Elementwise primitives: one flop per output element.
ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign", "floor", "ceil",
    "round", "is_finite", "select_n", "clamp", "eq", "ne", "lt", "le", "gt", "ge", "and",
    "or", "not", "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "convert_element_type", "integer_pow", "square", "nextafter", "population_count",
    "clz", "reciprocal", "addupdate", "real", "imag", "conj", "copysign",
})
# Reductions: one flop per input element.
REDUCTION = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
})
# Data movement and bookkeeping inside a kernel: no flops, no HBM traffic.
FREE = frozenset({
    "broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice", "squeeze",
    "expand_dims", "concatenate", "iota", "pad", "rev", "bitcast_convert_type", "copy",
    "copy_p", "get", "swap", "load", "store", "masked_load", "masked_store",
    "program_id", "num_programs", "stop_gradient", "reduce_precision", "optimization_barrier",
    "dynamic_update_slice", "gather", "select_and_gather_add", "split", "sort",
    "dma_wait", "semaphore_wait", "semaphore_signal", "semaphore_read", "barrier",
    "delay", "run_scoped", "get_barrier_semaphore", "device_id", "axis_index",
    "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint",
})

# Scalar evaluation of index maps and branch indices: numpy over every grid step.
_SCALAR_OPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
    "neg": np.negative, "abs": np.abs, "not": np.logical_not, "sign": np.sign,
}


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32",
            "bool": "pred", "int8": "i8", "uint32": "u32", "int16": "i16",
            "uint8": "u8", "float64": "f64", "int64": "i64"}.get(name, name)


def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


def _eval_scalar(prim: str, params: dict, args: list) -> Optional[np.ndarray]:
    """A scalar primitive applied to per-step values (arrays over the grid), or None."""
    if prim in _SCALAR_OPS:
        return _SCALAR_OPS[prim](*args)
    if prim == "div":  # lax.div truncates integers toward zero
        a, b = args
        if np.issubdtype(np.asarray(a).dtype, np.integer):
            return np.trunc(np.true_divide(a, b)).astype(np.int64)
        return np.true_divide(a, b)
    if prim == "rem":
        return np.fmod(*args)
    if prim == "convert_element_type":
        dt = np.dtype(params["new_dtype"])
        return np.asarray(args[0]).astype(np.int64 if np.issubdtype(dt, np.integer) else dt)
    if prim == "select_n":
        which, *cases = args
        return np.choose(np.asarray(which).astype(np.int64), cases)
    if prim == "integer_pow":
        return np.power(args[0], params["y"])
    if prim == "clamp":
        lo, x, hi = args
        return np.clip(x, lo, hi)
    if prim in ("shift_left",):
        return np.left_shift(*args)
    if prim in ("shift_right_logical", "shift_right_arithmetic"):
        return np.right_shift(*args)
    return None


def _literal(v):
    from jax._src import core as jcore
    if isinstance(v, jcore.Literal):
        return np.asarray(v.val)
    return None


def _subjaxprs(params: dict):
    """(key, Jaxpr, consts) of every sub-jaxpr among an equation's parameters."""
    from jax._src import core as jcore
    for key, val in params.items():
        for s in (val if isinstance(val, (list, tuple)) else [val]):
            if isinstance(s, jcore.ClosedJaxpr):
                yield key, s.jaxpr, s.consts
            elif isinstance(s, jcore.Jaxpr):
                yield key, s, ()


def _scalar_env(jaxpr, invals: list) -> dict:
    """Known per-step scalar values of a jaxpr's inputs (a dict var -> array)."""
    return {v: x for v, x in zip(jaxpr.invars, invals) if x is not None}


def _read(env: dict, v):
    lit = _literal(v)
    return lit if lit is not None else env.get(v)


def _shape_size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ()) or ()))


class _BodyCost:
    """Accumulates a kernel body's work over the grid."""

    def __init__(self, grid_ids: np.ndarray, grid: tuple, where: str):
        self.grid_ids = grid_ids   # [rank, steps]
        self.grid = grid
        self.where = where         # "mosaic" (kernel body)
        self.matmul_flops = 0.0
        self.matmul_pass_flops = 0.0
        self.other_flops = 0.0
        self.transcendentals = 0.0
        self.dma_bytes = 0.0
        self.dots: list = []
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def walk(self, jaxpr, weight: np.ndarray, env: dict) -> dict:
        """Counts ``jaxpr`` executed ``weight[s]`` times at grid step s; returns the env."""
        total = float(weight.sum())
        for eqn in jaxpr.eqns:
            prim = eqn.primitive.name
            ins = [_read(env, v) for v in eqn.invars]
            # Scalars known on every step (program ids and what is computed from them).
            if prim == "program_id":
                env[eqn.outvars[0]] = self.grid_ids[eqn.params["axis"]].astype(np.int64)
                continue
            if prim == "num_programs":
                env[eqn.outvars[0]] = np.full(self.grid_ids.shape[1], self.grid[eqn.params["axis"]],
                                              np.int64)
                continue
            scalar_out = all(getattr(v.aval, "shape", None) == () for v in eqn.outvars)
            if scalar_out and len(eqn.outvars) == 1 and all(x is not None for x in ins):
                val = _eval_scalar(prim, eqn.params, ins) if prim not in ("pjit", "closed_call") else None
                if val is not None:
                    env[eqn.outvars[0]] = np.broadcast_to(val, (self.grid_ids.shape[1],))
                    continue
            if prim == "cond":
                self._cond(eqn, ins, weight, env)
                continue
            if prim in ("scan",):
                length = eqn.params["length"]
                body = eqn.params["jaxpr"]
                nconst = eqn.params["num_consts"]
                sub = _scalar_env(body.jaxpr, ins[:nconst] + [None] * (len(body.jaxpr.invars) - nconst))
                self.walk(body.jaxpr, weight * length, sub)
                continue
            if prim == "while":
                trips = _fori_trips(eqn, ins)
                if trips is None:
                    self.note("a while loop with a data-dependent trip count is counted once per step")
                    trips = 1
                body = eqn.params["body_jaxpr"]
                nb = eqn.params["body_nconsts"]
                cn = eqn.params["cond_nconsts"]
                consts = ins[cn:cn + nb]
                sub = _scalar_env(body.jaxpr, consts + [None] * (len(body.jaxpr.invars) - nb))
                self.walk(body.jaxpr, weight * trips, sub)
                continue
            subs = list(_subjaxprs(eqn.params))
            if subs and prim not in ("pallas_call",):
                # pjit, closed_call, custom_jvp/vjp, remat, run_scoped: same multiplicity.
                for key, sj, _consts in subs:
                    if key in ("jvp_jaxpr_fun", "jvp_jaxpr_thunk", "fwd_jaxpr_thunk", "bwd"):
                        continue
                    if len(sj.invars) == len(ins):
                        sub = _scalar_env(sj, ins)
                    else:
                        sub = {}
                    out_env = self.walk(sj, weight, sub)
                    if len(sj.outvars) == len(eqn.outvars):
                        for o, so in zip(eqn.outvars, sj.outvars):
                            val = _read(out_env, so)
                            if val is not None:
                                env[o] = val
                    break
                continue
            if prim == "dot_general":
                self._dot(eqn, total)
                continue
            if prim == "dma_start":
                self._dma(eqn, total)
                continue
            out_elems = sum(_shape_size(v.aval) for v in eqn.outvars)
            rank = max((len(getattr(v.aval, "shape", ()) or ()) for v in eqn.outvars), default=0)
            if prim == "addupdate":  # ref[...] += x: one add per element of x
                value = eqn.invars[1].aval
                if getattr(value, "shape", ()):
                    self.other_flops += _shape_size(value) * total
            elif prim in TRANSCENDENTAL:
                if rank:
                    self.transcendentals += out_elems * total
            elif prim in ELEMENTWISE:
                if rank:
                    self.other_flops += out_elems * total
            elif prim in REDUCTION:
                self.other_flops += _shape_size(eqn.invars[0].aval) * total
            elif prim not in FREE:
                self.note(f"primitive `{prim}` is not counted")
        return env

    def _cond(self, eqn, ins, weight, env) -> None:
        branches = eqn.params["branches"]
        index = ins[0]
        ops = ins[1:]
        for k, br in enumerate(branches):
            if index is None:
                self.note("a branch whose index depends on data is counted on every step")
                w = weight
            else:
                idx = np.clip(np.asarray(index).astype(np.int64), 0, len(branches) - 1)
                w = weight * (idx == k)
            if not w.any():
                continue
            self.walk(br.jaxpr, w, _scalar_env(br.jaxpr, ops))

    def _dot(self, eqn, total: float) -> None:
        lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
        (lc, _rc), _batch = eqn.params["dimension_numbers"]
        k = int(math.prod(lhs.shape[d] for d in lc))
        flops = 2.0 * _shape_size(eqn.outvars[0].aval) * k
        passes = matmul_passes(_dtype_name(lhs.dtype), _dtype_name(rhs.dtype),
                               eqn.params.get("precision"), mosaic=True)
        self.matmul_flops += flops * total
        self.matmul_pass_flops += flops * passes * total
        self.dots.append({"lhs": list(lhs.shape), "rhs": list(rhs.shape),
                          "out": list(eqn.outvars[0].aval.shape),
                          "dtypes": [_dtype_name(lhs.dtype), _dtype_name(rhs.dtype)],
                          "passes": passes, "executions": total,
                          "precision": _precision_name(eqn.params.get("precision")),
                          "where": _where(eqn)})

    def _dma(self, eqn, total: float) -> None:
        # The copied region's bytes: the destination ref's shape after its transforms
        # (``buf.at[r]`` copies one [H, L] slice of a [g, H, L] scratch, not all of it).
        import jax
        try:
            refs = jax.tree_util.tree_unflatten(
                eqn.params["tree"], [getattr(v, "aval", v) for v in eqn.invars])
            dst = refs[1]
            nbytes = math.prod(dst.shape) * _itemsize(dst.dtype)
        except Exception:  # noqa: BLE001 - an unreadable DMA is named, not guessed
            self.note("a manual DMA whose size could not be read is not counted")
            return
        self.note("manual DMAs counted by the size of their destination ref")
        self.dma_bytes += nbytes * total


def _where(eqn) -> str:
    from .precision import _where as where
    return where(eqn.source_info.traceback)


def _precision_name(p) -> str:
    if p is None:
        return "DEFAULT"
    if isinstance(p, (tuple, list)):
        names = {_precision_name(x) for x in p}
        return "HIGHEST" if "HIGHEST" in names else "HIGH" if "HIGH" in names else "DEFAULT"
    return getattr(p, "name", str(p)).upper()


def matmul_passes(lhs: str, rhs: str, precision, *, mosaic: bool) -> int:
    """bf16 MXU passes of one matmul: 1 unless an operand is f32; then 6 at HIGHEST, 3 at
    HIGH, and at DEFAULT 1 in XLA (one bf16 pass) and 6 in Mosaic (taken as fp32)."""
    if "f32" not in (lhs, rhs):
        return 1
    name = _precision_name(precision)
    if name == "HIGHEST":
        return 6
    if name == "HIGH":
        return 3
    return 6 if mosaic else 1


def _fori_trips(eqn, ins) -> Optional[int]:
    """Trip count of a while loop of the fori pattern (i < upper, i += 1), when known."""
    cj = eqn.params["cond_jaxpr"].jaxpr
    cn = eqn.params["cond_nconsts"]
    nb = eqn.params["body_nconsts"]
    carry = ins[cn + nb:]
    if len(cj.eqns) != 1 or cj.eqns[0].primitive.name != "lt":
        return None
    a, b = cj.eqns[0].invars
    env = {v: x for v, x in zip(cj.invars, ins[:cn] + carry) if x is not None}
    lo, hi = _read(env, a), _read(env, b)
    if lo is None or hi is None:
        return None
    lo, hi = np.asarray(lo).ravel(), np.asarray(hi).ravel()
    if lo.min() != lo.max() or hi.min() != hi.max():
        return None
    return max(0, int(hi[0]) - int(lo[0]))


def _block_extent(bdim, size: int, index: np.ndarray) -> np.ndarray:
    """Elements of a block along one array dim at each step's block index."""
    from jax._src.pallas import core as pcore
    if isinstance(bdim, pcore.Squeezed) or bdim is None:
        return np.ones_like(index)
    bs = getattr(bdim, "block_size", None)
    if bs is None:
        return np.full_like(index, size)
    if isinstance(bdim, pcore.Blocked):
        return np.clip(size - index * bs, 0, bs)
    # Element / BoundedSlice: the index is an element offset
    return np.clip(size - index, 0, bs)


def _eval_index_map(bm, grid_ids: np.ndarray) -> Optional[np.ndarray]:
    """[array rank, steps] block indices of a BlockMapping at every grid step, or None when
    the index map reads data (scalar prefetch)."""
    closed = bm.index_map_jaxpr
    jaxpr = closed.jaxpr
    steps = grid_ids.shape[1]
    nprog = grid_ids.shape[0]
    if len(jaxpr.invars) != nprog:
        return None
    env = {v: grid_ids[i].astype(np.int64) for i, v in enumerate(jaxpr.invars)}
    for v, c in zip(jaxpr.constvars, closed.consts):
        env[v] = np.asarray(c)
    for eqn in jaxpr.eqns:
        ins = [_read(env, v) for v in eqn.invars]
        if any(x is None for x in ins):
            return None
        if eqn.primitive.name in ("pjit", "closed_call"):
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            vals = _eval_jaxpr_values(sub, ins, steps)
            if vals is None or any(x is None for x in vals):
                return None
            for o, val in zip(eqn.outvars, vals):
                env[o] = val
            continue
        val = _eval_scalar(eqn.primitive.name, eqn.params, ins)
        if val is None:
            return None
        env[eqn.outvars[0]] = np.broadcast_to(val, (steps,))
    outs = [_read(env, v) for v in jaxpr.outvars]
    if any(o is None for o in outs):
        return None
    return np.stack([np.broadcast_to(np.asarray(o).astype(np.int64), (steps,)) for o in outs])


def _eval_jaxpr_values(closed, ins, steps) -> Optional[list]:
    jaxpr = closed.jaxpr
    env = {v: x for v, x in zip(jaxpr.invars, ins)}
    for v, c in zip(jaxpr.constvars, closed.consts):
        env[v] = np.asarray(c)
    for eqn in jaxpr.eqns:
        vals = [_read(env, v) for v in eqn.invars]
        if any(x is None for x in vals):
            return None
        val = _eval_scalar(eqn.primitive.name, eqn.params, vals)
        if val is None:
            return None
        env[eqn.outvars[0]] = np.broadcast_to(val, (steps,))
    return [_read(env, v) for v in jaxpr.outvars]


def _memory_space(bm) -> str:
    ms = getattr(bm.transformed_block_aval, "memory_space", None)
    return str(ms).lower() if ms is not None else "default"


def _changes(idx: np.ndarray) -> np.ndarray:
    """[steps] bool: the block index differs from the previous step's (step 0: True)."""
    diff = np.ones(idx.shape[1], bool)
    if idx.shape[1] > 1:
        diff[1:] = np.any(idx[:, 1:] != idx[:, :-1], axis=0)
    return diff


def derive_kernel(eqn) -> dict:
    """The derived (and declared) cost of one ``pallas_call`` equation."""
    p = eqn.params
    gm = p["grid_mapping"]
    grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1 for g in gm.grid)
    notes: list[str] = []
    if any(g < 0 for g in grid):
        notes.append("a dynamic grid size: counted as one step")
        grid = tuple(max(g, 1) for g in grid)
    steps = int(math.prod(grid)) if grid else 1
    grid_ids = (np.indices(grid).reshape(len(grid), -1) if grid
                else np.zeros((0, 1), np.int64))
    nin, nout = gm.num_inputs, gm.num_outputs
    blocks, read, written = [], 0.0, 0.0
    for k, bm in enumerate(gm.block_mappings):
        is_out = k >= nin
        shape = tuple(bm.array_aval.shape)
        item = _itemsize(bm.array_aval.dtype)
        space = _memory_space(bm)
        entry = {"operand": f"{'out' if is_out else 'in'}{k - nin if is_out else k}",
                 # Position among the custom call's operands (after scalar-prefetch
                 # operands) or results: the HLO walk drops a copy whose array XLA keeps
                 # in VMEM from the HBM bytes.
                 ("hlo_result" if is_out else "hlo_operand"):
                     (k - nin) if is_out else gm.num_index_operands + k,
                 "shape": list(shape), "dtype": _dtype_name(bm.array_aval.dtype),
                 "block": [getattr(b, "block_size", None) for b in bm.block_shape],
                 "memory_space": space}
        if "any" in space or "hbm" in space:
            entry.update(copies=0, bytes=0.0)
            notes.append(f"{entry['operand']} stays in HBM: moved only by the kernel's own DMAs")
            blocks.append(entry)
            continue
        idx = _eval_index_map(bm, grid_ids)
        if idx is None:
            notes.append(f"{entry['operand']}: the index map reads data; a copy per step is assumed")
            idx = np.arange(steps)[None, :].repeat(max(1, len(shape)), 0)
            ext = np.full(steps, float(math.prod(
                b if isinstance(b, int) else (getattr(b, "block_size", 1) or 1)
                for b in bm.block_shape)))
            mask = np.ones(steps, bool)
        else:
            ext = np.ones(steps)
            for d, bdim in enumerate(bm.block_shape):
                ext = ext * _block_extent(bdim, shape[d], idx[d])
            if is_out:  # written back when the next step's block differs, and at the end
                mask = np.ones(steps, bool)
                if steps > 1:
                    mask[:-1] = np.any(idx[:, 1:] != idx[:, :-1], axis=0)
            else:
                mask = _changes(idx)
        nbytes = float((ext * mask).sum() * item)
        entry.update(copies=int(mask.sum()), bytes=nbytes)
        if is_out:
            written += nbytes
        else:
            read += nbytes
        blocks.append(entry)
    body = _BodyCost(grid_ids, grid, "mosaic")
    body.walk(p["jaxpr"], np.ones(steps), {})
    notes.extend(body.notes)
    read += body.dma_bytes
    declared = p.get("cost_estimate")
    operands = [{"shape": list(v.aval.shape), "dtype": _dtype_name(v.aval.dtype)} for v in eqn.invars]
    results = [{"shape": list(v.aval.shape), "dtype": _dtype_name(v.aval.dtype)} for v in eqn.outvars]
    return {
        "name": str(p.get("name") or "pallas_call"),
        "grid": list(grid),
        "steps": steps,
        "operands": operands,
        "results": results,
        "derived": {
            "matmul_flops": body.matmul_flops,
            "matmul_pass_flops": body.matmul_pass_flops,
            "other_flops": body.other_flops,
            "transcendentals": body.transcendentals,
            "hbm_bytes": read + written,
            "bytes_read": read,
            "bytes_written": written,
        },
        "declared": None if declared is None else {
            "flops": float(declared.flops), "transcendentals": float(declared.transcendentals),
            "bytes_accessed": float(declared.bytes_accessed)},
        "blocks": blocks,
        "dots": body.dots,
        "notes": notes,
    }


def _kernels_in(jaxpr, out: list) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            if not eqn.params.get("interpret"):
                out.append(derive_kernel(eqn))
            continue
        for _key, sj, _c in _subjaxprs(eqn.params):
            _kernels_in(sj, out)


def kernel_costs(fn, args) -> list[dict]:
    """The derived cost of every Mosaic (non-interpret) ``pallas_call`` that ``fn`` runs on
    ``args`` (ShapeDtypeStructs), once per distinct kernel (name, operands, results)."""
    import jax
    closed = jax.make_jaxpr(fn)(*args)
    found: list[dict] = []
    _kernels_in(closed.jaxpr, found)
    unique, seen = [], set()
    for k in found:
        key = (k["name"], repr(k["operands"]), repr(k["results"]))
        if key not in seen:
            seen.add(key)
            unique.append(k)
    return unique
