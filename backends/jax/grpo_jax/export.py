"""Exporter CLI: JSON requests in, cached StableHLO artifacts out.

    python -m grpo_jax.export --requests REQ.jsonl --cache-dir DIR [--protocol N]
    python -m grpo_jax.export --list-impls
    python -m grpo_jax.export --check-config [--protocol N] < ENTRIES.json

``--protocol N``: the protocol version the caller speaks (``protocol.PROTOCOL_VERSION``);
a different one is refused with one line on stderr and exit status 4.

Reads one JSON request per line (``-`` = stdin; blank lines skipped) and prints exactly one
JSON result line per request on stdout, in order, flushed after each. Anything else the
libraries print goes to stderr. A bad request yields an ``error`` line; the batch goes on.

Result: {"status":"ok","key","dir","manifest","cached"} | {"status":"unsupported","reason"}
| {"status":"not_applicable","reason"} (a case of a level the implementation does not have)
| {"status":"contract","message"} (outputs of SPEC's shapes in other dtypes: a FAIL)
      | {"status":"error","message","detail"}: ``message`` is one line (what, and where in the
implementation's own code), ``detail`` the traceback. Whatever an implementation does while
it is imported, built or traced (an exception, ``sys.exit``) is such an error line.

Progress on stderr (``protocol.READY_MARKER`` once the libraries are imported,
``protocol.CHECK_MARKER`` + index before each ``--check-config`` entry) lets the caller put
each implementation under a time limit and blame a hang or an ``os._exit`` on it. Results
go to the process's original stdout; file descriptor 1 is pointed at stderr, so nothing an
implementation writes (even from C) can corrupt the result stream.
The manifest lists every matmul with an f32 operand (``f32_dots``: operand types,
precision, the function or kernel it is in) and what the implementation declares about
reduced precision (``declared_precision``); a ``cpu`` export computes reduced-precision f32
matmuls as an accelerator would, and removes 16-bit round trips as XLA:GPU does, listing
each (``round_trips``; ``precision.py``).
Artifacts: ``<dir>/module.mlirbc`` (``Exported.mlir_module_serialized``: StableHLO portable
bytecode, one platform, unused arguments dropped) and ``<dir>/manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import IO, Callable, Iterable, NamedTuple, Optional

from . import cache, precision
from .errors import one_line
from .protocol import CHECK_MARKER, MISMATCH_EXIT, PROTOCOL_VERSION, READY_MARKER
from .spec import (Knobs, Problem, dtype_name, input_specs, normalize_request, output_specs,
                   problem_of)


class Built(NamedTuple):
    """A request resolved against the registry."""

    norm: dict            # the normalized request, impl_options with defaults merged
    impl: "Implementation"  # noqa: F821
    problem: Problem
    fn: Optional[Callable]  # None when unsupported
    reason: Optional[str]   # the unsupported reason, else None
    shardings: Optional[tuple] = None  # (in, out) NamedShardings for a multi-device case


def build_function(norm: dict) -> Built:
    """Look the implementation up, resolve its options, check support, build ``fn``."""
    from .impls import get
    impl = get(norm["impl"])
    problem = problem_of(norm)
    knobs = Knobs.from_json(norm["knobs"])
    options = impl.resolve_options(norm["impl_options"])
    norm = {**norm, "impl_options": options}
    reason = impl.support_reason(problem, knobs, options)
    devices, sharding = norm.get("devices", 1), norm.get("sharding")
    if reason is None and devices > 1:
        from .impls import sharded
        reason = sharded.support_reason(impl, problem, devices, sharding)
    if reason is not None:
        return Built(norm, impl, problem, None, reason)
    if devices > 1:
        from .impls import sharded
        fn = sharded.build(impl, problem, knobs, options, devices, sharding)
        return Built(norm, impl, problem, fn, None, sharded.shardings(problem, sharding, devices))
    return Built(norm, impl, problem, impl.build(problem, knobs, options), None)


def module_problem(norm: dict, problem: Problem) -> Problem:
    """The problem whose shapes the module has: SPEC's, except that vocab-sharded modules
    take and return [.., V] arrays padded to a multiple of the device count."""
    if norm.get("devices", 1) > 1:
        from .impls import sharded
        return sharded.module_problem(problem, norm["sharding"], norm["devices"])
    return problem


def export_function(fn, problem, shardings=None):
    """``jax.export`` of ``fn`` for the problem's single platform (over a device mesh when
    ``shardings`` is given: the module then carries ``mhlo.num_partitions``). ``problem``
    is the module's (``module_problem``)."""
    import jax
    args = [s.struct() for s in input_specs(problem)]
    if shardings is None:
        jitted = jax.jit(fn)
    else:
        jitted = jax.jit(fn, in_shardings=shardings[0], out_shardings=shardings[1])
    return jax.export.export(jitted, platforms=[problem.platform])(*args)


def manifest_for(norm: dict, key: str, exported, shardings=None) -> dict:
    """The manifest of an exported case; checks the module's avals against the SPEC names.

    Multi-device: ``num_partitions`` and, per input and output, ``shard_axis`` (the axis
    split evenly over the devices in device order, or null: every device holds it whole).
    ``shape`` is always SPEC's; a tensor the module takes or returns padded on its shard
    axis also has ``pad_to`` (the module's extent there) and, for inputs, ``pad_value``
    (what the caller writes into the padding; padded outputs must come back 0)."""
    problem = problem_of(norm)
    ins, outs = input_specs(problem), output_specs(problem)
    mod = module_problem(norm, problem)
    mins, mouts = input_specs(mod), output_specs(mod)
    _check_avals("input", mins, exported.in_avals)
    _check_avals("output", mouts, exported.out_avals)
    pad_values = {}
    if mod != problem:
        from .impls.sharded import pad_values as _pv
        pad_values = _pv(problem)
    kept = list(exported.module_kept_var_idx)
    jax_v, jaxlib_v = cache.versions()
    in_axes = out_axes = None
    if shardings is not None:
        from .impls.sharded import shard_axis
        in_axes = [shard_axis(s.spec) for s in shardings[0]]
        out_axes = [shard_axis(s.spec) for s in shardings[1]]
    def entry(spec, mspec, axis, is_input):
        e = dict(spec.to_json(), shard_axis=axis)
        if mspec.shape != spec.shape:
            e["pad_to"] = mspec.shape[axis]
            if is_input:
                e["pad_value"] = pad_values[spec.name]
        return e
    inputs = [entry(ins[i], mins[i], in_axes[i] if in_axes else None, True) for i in kept]
    outputs = [entry(o, mouts[j], out_axes[j] if out_axes else None, False)
               for j, o in enumerate(outs)]
    return {
        "impl": norm["impl"], "level": norm["level"], "platform": norm["platform"],
        "jax_version": jax_v, "jaxlib_version": jaxlib_v,
        "source_hash": cache.source_hash(), "key": key, "request": norm,
        "protocol": PROTOCOL_VERSION, "exporter_python": sys.executable,
        "num_partitions": exported.nr_devices,
        "inputs": inputs,
        "outputs": outputs,
        # Outputs the implementation cannot produce (e.g. a partial kernel's entropy): the
        # module returns a placeholder there, which the Rust side drops and never gates.
        "not_provided": sorted(built_not_provided(norm)),
    }


def derive_kernels(fn, problem) -> dict:
    """Manifest fields of a TPU export: ``kernels``, the derived cost of each Mosaic kernel
    (``kernel_cost``), and ``kernel_cost_model``; or ``kernel_cost_error`` (one line) when
    the derivation fails, which the Rust side reports instead of a figure."""
    from . import kernel_cost
    try:
        kernels = kernel_cost.kernel_costs(fn, [s.struct() for s in input_specs(problem)])
    except Exception as exc:  # noqa: BLE001 - reported as a missing figure, never a pass
        return {"kernels": [], "kernel_cost_model": kernel_cost.COST_MODEL_VERSION,
                "kernel_cost_error": " ".join(f"{type(exc).__name__}: {exc}".split())[:1000]}
    return {"kernels": kernels, "kernel_cost_model": kernel_cost.COST_MODEL_VERSION}


def built_not_provided(norm: dict) -> frozenset:
    from .impls import get
    return frozenset(get(norm["impl"]).not_provided)


class OutputContractError(Exception):
    """The exported module's outputs have SPEC's shapes but not its dtypes."""


def _check_avals(kind: str, specs, avals) -> None:
    """RuntimeError naming each argument or result whose shape or dtype is not SPEC's."""
    got = [(tuple(a.shape), dtype_name(a.dtype)) for a in avals]
    want = [(tuple(s.shape), s.dtype) for s in specs]
    if got == want:
        return

    def fmt(shape_dtype):
        shape, dtype = shape_dtype
        return f"{dtype}[{','.join(map(str, shape))}]"
    if kind == "output" and len(got) == len(want) and all(
            g[0] == w[0] for g, w in zip(got, want)):
        # Only dtypes differ: the module ran fine but breaks SPEC's output contract, which
        # is the implementation's failure on this case (a FAIL), not an export error.
        raise OutputContractError("; ".join(
            f"output `{s.name}` is {g[1]}, SPEC's is {w[1]}"
            for s, g, w in zip(specs, got, want) if g != w))
    if len(got) != len(want):
        raise RuntimeError(
            f"the module has {len(got)} {kind}s ({', '.join(map(fmt, got))}), SPEC has "
            f"{len(want)} ({', '.join(f'{s.name} {fmt(w)}' for s, w in zip(specs, want))})")
    raise RuntimeError("; ".join(
        f"{kind} `{s.name}` is {fmt(g)}, SPEC's is {fmt(w)}"
        for s, g, w in zip(specs, got, want) if g != w))


def handle_request(req, cache_dir: Path) -> dict:
    """One request -> one result dict (never raises for a bad request)."""
    try:
        cache_dir = Path(cache_dir).absolute()
        built = build_function(normalize_request(req))
        if built.fn is None:
            # A case of a level the implementation does not have is not applicable (the
            # suite neither shows nor counts it), anything else unsupported: said by the
            # status, never left to the reason's wording.
            status = ("not_applicable" if built.problem.level not in built.impl.capabilities.levels
                      else "unsupported")
            return {"status": status, "reason": f"{built.impl.id}: {built.reason}"}
        norm = built.norm
        key = cache.cache_key(norm)
        entry = cache_dir / key
        manifest = cache.lookup(cache_dir, key)
        if manifest is not None:
            return {"status": "ok", "key": key, "dir": str(entry), "manifest": manifest, "cached": True}
        mod = module_problem(norm, built.problem)
        with precision.watch(norm["platform"], norm.get("emulates", "tpu")) as dots:
            exported = export_function(built.fn, mod, built.shardings)
            round_trips = precision.round_trips()
        manifest = manifest_for(norm, key, exported, built.shardings)
        if norm["platform"] == "tpu":
            manifest.update(derive_kernels(built.fn, mod))
        manifest["f32_dots"] = (precision.summarize(dots)
                                + precision.kernel_dots(manifest.get("kernels", [])))
        manifest["round_trips"] = round_trips  # removed by the cpu emulation (precision.py)
        if "emulates" in norm:
            manifest["emulates"] = norm["emulates"]
        manifest["declared_precision"] = built.impl.declared_precision(norm["impl_options"])
        manifest["option_class"] = built.impl.declared_class(built.norm["impl_options"], norm["dtype"])
        cache.store(cache_dir, key, exported.mlir_module_serialized, manifest)
        return {"status": "ok", "key": key, "dir": str(entry), "manifest": manifest, "cached": False}
    except OutputContractError as exc:
        return {"status": "contract", "message": str(exc)}
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every failure is a result line
        return {"status": "error", "message": one_line(exc), "detail": traceback.format_exc()}


def run_batch(lines: Iterable[str], cache_dir: Path, out: IO[str]) -> int:
    """Handle every non-blank line; returns the number of non-ok results."""
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as exc:
            result = {"status": "error", "message": f"invalid JSON: {exc}",
                      "detail": traceback.format_exc()}
        else:
            result = handle_request(req, cache_dir)
        bad += result["status"] != "ok"
        out.write(json.dumps(result) + "\n")
        out.flush()
    return bad


def list_impls() -> list[dict]:
    """Registry summary (ids, capabilities, default options) as JSON-able dicts."""
    from .impls import IMPLEMENTATIONS
    rows = []
    for impl in IMPLEMENTATIONS.values():
        caps = {k: (sorted(v) if isinstance(v, frozenset) else v)
                for k, v in vars(impl.capabilities).items()}
        rows.append({"id": impl.id, "description": impl.description, "capabilities": caps,
                     "default_options": dict(impl.default_options),
                     "search_space": {k: list(v) for k, v in impl.search_space.items()}})
    return rows


def check_config(entries: list) -> list[dict]:
    """Checks configured implementations without exporting: each entry ``{name, impl,
    impl_options}`` -> ``{name, ok, error}`` (unknown id, unknown option, bad value, a module
    that raises or exits while imported or checked: one line). Writes ``CHECK_MARKER`` +
    the entry's index on stderr before each entry."""
    from .impls import get
    from .spec import RequestError
    out = []
    for k, e in enumerate(entries):
        name, impl_id = e.get("name", e.get("impl")), e.get("impl")
        sys.stderr.write(f"{CHECK_MARKER}{k}\n")
        sys.stderr.flush()
        try:
            impl = get(impl_id)
        except (KeyError, RequestError) as exc:
            out.append({"name": name, "ok": False, "error": str(exc).strip('"')})
            continue
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own failure
            out.append({"name": name, "ok": False,
                        "error": f"loading {impl_id!r} raised {one_line(exc)}"})
            continue
        try:
            impl.check_options(e.get("impl_options") or {})
            out.append({"name": name, "ok": True, "error": None})
        except RequestError as exc:
            out.append({"name": name, "ok": False, "error": str(exc)})
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's option check
            out.append({"name": name, "ok": False,
                        "error": f"checking the options of {impl_id!r} raised {one_line(exc)}"})
    return out


def _private_stdout() -> IO[str]:
    """The original stdout for the results; file descriptor 1 then points at stderr, so
    output of an implementation's C code (or anything bypassing ``sys.stdout``) cannot
    corrupt the result stream."""
    sys.stdout.flush()
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return results


def main(argv=None, *, private_stdout: bool = False) -> int:
    """The command line; ``private_stdout`` (the ``python -m`` entry point) moves the
    results off file descriptor 1 (``_private_stdout``)."""
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", help="JSONL file of requests ('-' for stdin)")
    parser.add_argument("--cache-dir", help="artifact cache directory")
    parser.add_argument("--list-impls", action="store_true", help="print the registry as JSON")
    parser.add_argument("--check-config", action="store_true",
                        help="read a JSON list of {name, impl, impl_options} on stdin and print "
                             "one {name, ok, error} per entry (no export)")
    parser.add_argument("--protocol", type=int, help="the protocol version the caller speaks")
    args = parser.parse_args(argv)
    # Multi-device cases are exported over a mesh of (virtual) CPU devices; XLA reads the
    # flag when jax first initialises its backend.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=16").strip()
    if args.protocol is not None and args.protocol != PROTOCOL_VERSION:
        sys.stderr.write(
            f"protocol mismatch: the grpo_jax exporter in {sys.executable} speaks protocol "
            f"{PROTOCOL_VERSION}, the caller speaks {args.protocol}: reinstall it from this "
            f"suite's checkout: {sys.executable} -m pip install <grpo-conformance>/backends/jax\n")
        return MISMATCH_EXIT
    real_stdout = _private_stdout() if private_stdout else sys.stdout
    saved_stdout = sys.stdout
    sys.stdout = sys.stderr  # keep stray prints out of the result stream
    try:
        if args.list_impls:
            real_stdout.write(json.dumps(list_impls()) + "\n")
            return 0
        if args.check_config:
            real_stdout.write(json.dumps(check_config(json.load(sys.stdin))) + "\n")
            return 0
        if not args.requests or not args.cache_dir:
            parser.error("--requests and --cache-dir are required")
        cache_dir = Path(args.cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        from . import impls  # noqa: F401 - jax and the package: the start-up, before READY
        sys.stderr.write(READY_MARKER + "\n")
        sys.stderr.flush()
        if args.requests == "-":
            run_batch(sys.stdin, cache_dir, real_stdout)
        else:
            with open(args.requests) as f:
                run_batch(f, cache_dir, real_stdout)
        real_stdout.flush()
        return 0
    except BrokenPipeError:  # the reader went away: nothing left to report to
        os.dup2(os.open(os.devnull, os.O_WRONLY), real_stdout.fileno())
        return 1
    finally:
        sys.stdout = saved_stdout


if __name__ == "__main__":
    sys.exit(main(private_stdout=True))
