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
      | {"status":"error","message","detail"}.
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

from . import cache
from .protocol import MISMATCH_EXIT, PROTOCOL_VERSION
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


def _check_avals(kind: str, specs, avals) -> None:
    got = [(tuple(a.shape), dtype_name(a.dtype)) for a in avals]
    want = [(tuple(s.shape), s.dtype) for s in specs]
    if got != want:
        raise RuntimeError(f"exported {kind}s {got} differ from the SPEC's {want}")


def handle_request(req, cache_dir: Path) -> dict:
    """One request -> one result dict (never raises for a bad request)."""
    try:
        cache_dir = Path(cache_dir).absolute()
        built = build_function(normalize_request(req))
        if built.fn is None:
            return {"status": "unsupported", "reason": f"{built.impl.id}: {built.reason}"}
        norm = built.norm
        key = cache.cache_key(norm)
        entry = cache_dir / key
        manifest = cache.lookup(cache_dir, key)
        if manifest is not None:
            return {"status": "ok", "key": key, "dir": str(entry), "manifest": manifest, "cached": True}
        mod = module_problem(norm, built.problem)
        exported = export_function(built.fn, mod, built.shardings)
        manifest = manifest_for(norm, key, exported, built.shardings)
        if norm["platform"] == "tpu":
            manifest.update(derive_kernels(built.fn, mod))
        cache.store(cache_dir, key, exported.mlir_module_serialized, manifest)
        return {"status": "ok", "key": key, "dir": str(entry), "manifest": manifest, "cached": False}
    except Exception as exc:  # noqa: BLE001 - every failure becomes a result line
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        return {"status": "error", "message": message[:2000], "detail": traceback.format_exc()}


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
    impl_options}`` -> ``{name, ok, error}`` (unknown id, unknown option, bad value)."""
    from .impls import get
    from .spec import RequestError
    out = []
    for e in entries:
        name, impl_id = e.get("name", e.get("impl")), e.get("impl")
        try:
            impl = get(impl_id)
        except (KeyError, RequestError) as exc:
            out.append({"name": name, "ok": False, "error": str(exc).strip('"')})
            continue
        try:
            impl.check_options(e.get("impl_options") or {})
            out.append({"name": name, "ok": True, "error": None})
        except RequestError as exc:
            out.append({"name": name, "ok": False, "error": str(exc)})
    return out


def main(argv=None) -> int:
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
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    if args.protocol is not None and args.protocol != PROTOCOL_VERSION:
        sys.stderr.write(
            f"protocol mismatch: the grpo_jax exporter in {sys.executable} speaks protocol "
            f"{PROTOCOL_VERSION}, the caller speaks {args.protocol}: reinstall it from this "
            f"suite's checkout: {sys.executable} -m pip install <grpo-conformance>/backends/jax\n")
        return MISMATCH_EXIT
    real_stdout = sys.stdout
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
        sys.stdout = real_stdout


if __name__ == "__main__":
    sys.exit(main())
