"""The precision of every matmul with an f32 operand, read while a module is lowered, and
the CPU emulation of what an accelerator computes for them (docs/spec.md, "Precision").

An f32 ``dot_general`` at ``lax.Precision.DEFAULT`` is not one function: XLA:CPU computes it
in f32, XLA:GPU on Ampere/Hopper in TF32 (operands rounded to 10 mantissa bits), XLA:TPU as
a single bf16 pass (operands rounded to 7 mantissa bits, products summed in f32). HIGH is
three bf16 passes on TPU and TF32 on GPU; HIGHEST is f32 everywhere. Mosaic (Pallas TPU)
computes a kernel's f32 dot at DEFAULT in fp32 (its ``contract_precision`` default).

``watch(platform, emulates)`` wraps jax's lowering rule of ``dot_general`` while one module
is lowered. Every dot with an f32 operand is recorded: operand types, precision (or dot
algorithm), the user function that wrote it, and the Pallas kernel it is in (CPU interpret
mode). On the ``cpu`` platform it also **emulates** one accelerator, named by ``emulates``
(``EMULATES``), so a CPU verdict is never kinder than the platform it stands for:

* ``tpu`` (the default): a dot with an f32 operand outside a Pallas kernel has its f32
  operands rounded to bf16 at DEFAULT (XLA:TPU's one pass) and to TF32 at HIGH (coarser
  than TPU's three bf16 passes: harsher, never kinder), then runs as before. 16-bit round
  trips (f32 -> bf16 -> f32) are kept, as XLA:TPU keeps them.
* ``gpu``: the same dots rounded to TF32 at DEFAULT and HIGH (Ampere/Hopper), and XLA:GPU's
  **excess precision**: a convert to f32 of a 16-bit value that was itself converted from
  f32 gives back the f32 value (``excess_precision``), as its ``SimplifyFPConversions``
  pass does under the default ``xla_allow_excess_precision``. A kernel that relies on
  that round trip's rounding (an error-free split ``x - f32(bf16(x))``, logits rounded
  to the input dtype by a round trip) computes on the CPU what it computed on an H100
  (docs/gpu.md, "Excess precision").

Rounded dots include ``mixed`` ones of one f32 and one narrower operand, whichever side
the f32 operand is on: jax's VJP of a bf16 einsum contracts the f32 cotangent with the bf16
operand that way, and at DEFAULT an accelerator rounds the cotangent (the H100 did, in
TF32: docs/gpu.md).

Not emulated: dots inside a Pallas kernel (Mosaic's DEFAULT is fp32), a narrower operand
that is not bf16 (an f16 operand's 10 mantissa bits are kept, as GPU's tensor cores do;
a TPU has no f16 MXU path), and the accumulation order of the MXU (f32 either way).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, Optional

# Bumped when what is emulated changes (every cpu export's cache key holds this module's
# source too). 2: mixed f32 × narrower dots are emulated; 3: excess precision; 4: one
# accelerator per export (``emulates``).
EMULATION_VERSION = 4

# The accelerators a cpu export can stand for; the first is the default.
EMULATES = ("tpu", "gpu")

# Precision classes: what an accelerator does with an f32×f32 dot.
REDUCED_BF16 = "bf16"   # DEFAULT: TPU one bf16 pass (GPU: TF32)
REDUCED_TF32 = "tf32"   # HIGH: TPU three bf16 passes, GPU TF32
FULL = "f32"            # HIGHEST, F32 algorithms

# Mantissa bits each reduced class keeps (f32's exponent range: 8 bits).
_MANTISSA = {REDUCED_BF16: 7, REDUCED_TF32: 10}

_state = threading.local()


def precision_name(p) -> str:
    """``DEFAULT``, ``HIGH``, ``HIGHEST`` or a dot algorithm's name, of a ``precision``
    parameter (None, a Precision, a pair of them, or a DotAlgorithmPreset)."""
    if p is None:
        return "DEFAULT"
    if isinstance(p, (tuple, list)):
        names = [precision_name(x) for x in p]
        for n in ("HIGHEST", "HIGH"):
            if n in names:
                return n
        return names[0] if names else "DEFAULT"
    return getattr(p, "name", str(p)).upper()


def precision_class(name: str) -> str:
    """What a TPU or an Ampere/Hopper GPU does with an f32×f32 dot at ``name``."""
    if name in ("DEFAULT", "BF16_BF16_F32", "BF16_BF16_BF16"):
        return REDUCED_BF16
    if name in ("HIGH", "TF32_TF32_F32", "BF16_BF16_F32_X3", "TF32_TF32_F32_X3"):
        return REDUCED_TF32
    return FULL


def _type(aval) -> str:
    from .kernel_cost import _dtype_name
    return f"{_dtype_name(aval.dtype)}[{','.join(map(str, aval.shape))}]"


def _where(traceback) -> str:
    """``function (file.py:line)`` of the user code that wrote the dot."""
    try:
        from jax._src import source_info_util
        frame = source_info_util.user_frame(traceback)
    except Exception:  # noqa: BLE001 - a missing location is said, never guessed
        frame = None
    if frame is None:
        return "unknown"
    return f"{frame.function_name} ({os.path.basename(frame.file_name)}:{frame.start_line})"


def _is_f32(aval) -> bool:
    import numpy as np
    return np.dtype(aval.dtype) == np.dtype("float32")


def _record(ctx, precision) -> Optional[dict]:
    """The dot's entry when an operand is f32, else None."""
    import numpy as np
    lhs, rhs = ctx.avals_in[0], ctx.avals_in[1]
    kinds = [np.dtype(a.dtype) == np.dtype("float32") for a in (lhs, rhs)]
    if not any(kinds):
        return None
    name = precision_name(precision)
    kernel = getattr(_state, "kernel", None)
    return {
        "lhs": _type(lhs), "rhs": _type(rhs), "out": _type(ctx.avals_out[0]),
        "precision": name, "where": _where(ctx.traceback), "kernel": kernel,
        "mixed": not all(kinds), "count": 1,
    }


def _round(x, mantissa: int):
    """``x`` (f32) rounded to ``mantissa`` bits, f32's exponent range, in the module."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir.dialects import hlo
    return hlo.reduce_precision(x, exponent_bits=mlir.i32_attr(8),
                                mantissa_bits=mlir.i32_attr(mantissa))


def emulated_class(name: str, emulates: str) -> str:
    """The rounding the ``emulates`` accelerator gives an f32 dot at ``name``: a GPU's
    reduced precision is TF32 at DEFAULT and HIGH alike."""
    cls = precision_class(name)
    return REDUCED_TF32 if emulates == "gpu" and cls == REDUCED_BF16 else cls


def _dot_rule(inner, emulates: Optional[str]):
    def rule(ctx, lhs, rhs, *, precision, **params):
        entry = _record(ctx, precision)
        if entry is not None:
            cls = emulated_class(entry["precision"], emulates or "tpu")
            entry["emulated"] = None
            if emulates and entry["kernel"] is None and cls in _MANTISSA:
                # Only the f32 operands: a 16-bit one holds its values already.
                if _is_f32(ctx.avals_in[0]):
                    lhs = _round(lhs, _MANTISSA[cls])
                if _is_f32(ctx.avals_in[1]):
                    rhs = _round(rhs, _MANTISSA[cls])
                entry["emulated"] = cls
            _state.dots.append(entry)
        return inner(ctx, lhs, rhs, precision=precision, **params)
    return rule


def _pallas_rule(inner):
    def rule(ctx, *args, **params):
        prev = getattr(_state, "kernel", None)
        info = params.get("name_and_src_info")
        _state.kernel = str(getattr(info, "name", None) or params.get("name") or "pallas_call")
        try:
            return inner(ctx, *args, **params)
        finally:
            _state.kernel = prev
    return rule


@contextlib.contextmanager
def watch(platform: str, emulates: str = EMULATES[0]) -> Iterator[list]:
    """While lowering for ``platform``: the list filled with every dot that has an f32
    operand (``summarize`` merges repeats); on ``cpu``, the ``emulates`` accelerator's
    reduced-precision f32 dots (and a GPU's excess precision) are emulated (module
    docstring). Restores jax's rules on exit."""
    if emulates not in EMULATES:
        raise ValueError(f"emulates must be one of {list(EMULATES)}, got {emulates!r}")
    from jax._src.interpreters import mlir
    from jax._src.lax import lax as lax_internal
    from jax._src.pallas import pallas_call as pc
    table = mlir._platform_specific_lowerings[platform]
    saved = {p: table.get(p) for p in (lax_internal.dot_general_p, pc.pallas_call_p)}

    def inner_rule(prim):
        e = saved[prim] or mlir._lowerings[prim]
        return e.rule

    # Lowered inline, each dot on its own: jax's per-module lowering cache would lower equal
    # dots once (no location, one record) whatever kernel they are in.
    was_uncacheable = lax_internal.dot_general_p in mlir._uncacheable_primitives
    mlir._uncacheable_primitives.add(lax_internal.dot_general_p)
    _state.dots = []
    _state.round_trips = []
    _state.kernel = None
    table[lax_internal.dot_general_p] = mlir.LoweringRuleEntry(
        _dot_rule(inner_rule(lax_internal.dot_general_p),
                  emulates if platform == "cpu" else None), True)
    table[pc.pallas_call_p] = mlir.LoweringRuleEntry(
        _pallas_rule(inner_rule(pc.pallas_call_p)), True)
    try:
        gpu = platform == "cpu" and emulates == "gpu"
        with excess_precision(platform) if gpu else contextlib.nullcontext():
            yield _state.dots
    finally:
        for prim, entry in saved.items():
            if entry is None:
                table.pop(prim, None)
            else:
                table[prim] = entry
        _state.kernel = None
        if not was_uncacheable:
            mlir._uncacheable_primitives.discard(lax_internal.dot_general_p)


def _excess_rule(inner):
    import numpy as np

    def rule(ctx, operand, **params):
        src, dst = (np.dtype(a.dtype) for a in (ctx.avals_in[0], ctx.avals_out[0]))
        owner = getattr(operand, "owner", None)  # an op, or a block for an argument
        if (dst == np.float32 and src.itemsize == 2 and getattr(_state, "kernel", None) is None
                and getattr(owner, "name", None) == "stablehlo.convert"):
            from jax._src.interpreters import mlir
            x = owner.operands[0]
            if x.type == mlir.aval_to_ir_type(ctx.module_context, ctx.avals_out[0]):  # f32, same shape
                trips = getattr(_state, "round_trips", None)
                if trips is not None:
                    trips.append({"type": _type(ctx.avals_in[0]), "where": _where(ctx.traceback),
                                  "count": 1})
                return [x]
        return inner(ctx, operand, **params)
    return rule


@contextlib.contextmanager
def excess_precision(platform: str = "cpu") -> Iterator[None]:
    """While lowering for ``platform``: a convert to f32 of a 16-bit value that was itself
    converted from f32 gives the f32 value, as XLA:GPU's ``SimplifyFPConversions`` does
    under its default ``xla_allow_excess_precision`` (outside Pallas kernels). A kernel
    that forms a residual as ``x - f32(bf16(x))`` then sees zero, as it did on an H100
    (docs/gpu.md, "Excess precision"); XLA:CPU keeps the pair."""
    from jax._src.interpreters import mlir
    from jax._src.lax import lax as lax_internal
    prim = lax_internal.convert_element_type_p
    table = mlir._platform_specific_lowerings[platform]
    saved = table.get(prim)
    inner = (saved or mlir._lowerings[prim]).rule
    # Lowered inline: a cached lowering would see its operand as a function argument.
    was_uncacheable = prim in mlir._uncacheable_primitives
    mlir._uncacheable_primitives.add(prim)
    table[prim] = mlir.LoweringRuleEntry(_excess_rule(inner), True)
    try:
        yield
    finally:
        if saved is None:
            table.pop(prim, None)
        else:
            table[prim] = saved
        if not was_uncacheable:
            mlir._uncacheable_primitives.discard(prim)


def round_trips() -> list:
    """The 16-bit round trips the excess-precision emulation removed while the current
    ``watch`` lowered its module (``type``: the 16-bit value's, ``where``, ``count``)."""
    return summarize(getattr(_state, "round_trips", None) or [])


def summarize(dots: list) -> list:
    """Equal entries merged, with their count, in first-seen order."""
    out: dict = {}
    for d in dots:
        key = tuple((k, d[k]) for k in sorted(d) if k != "count")
        if key in out:
            out[key]["count"] += d["count"]
        else:
            out[key] = dict(d)
    return list(out.values())


def kernel_dots(kernels: list) -> list:
    """Entries for the f32 dots inside Mosaic kernels of a TPU export (from
    ``kernel_cost``'s walk, which sees the kernel bodies the module holds as opaque
    custom calls)."""
    out = []
    for k in kernels:
        for d in k.get("dots", []):
            if "f32" not in d["dtypes"]:
                continue
            out.append({
                "lhs": f"{d['dtypes'][0]}[{','.join(map(str, d['lhs']))}]",
                "rhs": f"{d['dtypes'][1]}[{','.join(map(str, d['rhs']))}]",
                "out": f"f32[{','.join(map(str, d['out']))}]",
                "precision": d.get("precision", "DEFAULT"), "where": d.get("where", "unknown"),
                "kernel": k.get("name"), "mixed": d["dtypes"][0] != d["dtypes"][1],
                "emulated": None, "count": 1,
            })
    return summarize(out)
