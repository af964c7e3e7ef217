"""Reproduces a shrunk failure without the suite: runs the implementation through the same
entry as the suite's configuration (request.json: the JAX exporter's request, or the torch
worker's; for the suite's own Rust variants, naive_f32+<Mutation>, which nothing outside the
suite runs, the outputs they wrote here) on the inputs beside this file, writes its outputs as out_<name>.npy, and prints
the comparison with the oracle's output beside the suite's gate line (gate.json: the output,
the suite's figures and its bounds' verdict there).

    PYTHONPATH=<the entry's pythonpath>:<grpo_jax or grpo_torch> <the entry's python> reproduce.py

Exit status: 1 when the failure reproduces (the same non-finite values, or the same error
norm as the suite's failing gate, to 1e-3), 0 when it does not, 2 when the implementation
does not run the case or does not give the output.
Written by `grpo-suite shrink --out` (docs/shrink.md)."""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    return np.load(os.path.join(HERE, name + ".npy"))


def run_jax(req):
    import jax
    import jax.numpy as jnp
    from grpo_jax import precision
    from grpo_jax.export import build_function
    from grpo_jax.spec import input_specs, normalize_request, output_specs

    built = build_function(normalize_request(req))
    if built.fn is None:
        print(f"{built.impl.id} does not run this case: {built.reason}")
        sys.exit(2)
    dtypes = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "i32": jnp.int32}
    args = [jnp.asarray(load(s.name)).astype(dtypes[s.dtype]) for s in input_specs(built.problem)]
    # The suite's export of a cpu module emulates its accelerator's f32 matmuls (precision.py).
    with precision.watch(req["platform"], req.get("emulates", "tpu")):
        compiled = jax.jit(built.fn).lower(*args).compile()
    outs = compiled(*args)
    names = [s.name for s in output_specs(built.problem)]
    if isinstance(outs, dict):
        return {n: np.asarray(outs[n], dtype=np.float32) for n in names if n in outs}
    return {n: np.asarray(o, dtype=np.float32) for n, o in zip(names, outs)}


def run_torch(req):
    from grpo_torch.worker import run

    ans = run({**req, "dir": HERE, "warmup": 0, "repeats": 1})
    if ans["status"] != "ok":
        print(f"{req['impl']}: {ans['status']}: {ans.get('reason') or ans.get('message')}")
        sys.exit(2)
    return {n: load("out_" + n) for n in ans["outputs"]}


def run_suite(spec):
    # The suite's own Rust variant (naive_f32+<Mutation>): nothing outside the suite runs
    # it, so the outputs it gave at this case were written beside this file; compare those.
    print(f"{spec['implementation']} is the suite's own Rust code: comparing the outputs it "
          "wrote here (out_<name>.npy), not rerunning it")
    return {n: load("out_" + n) for n in spec["outputs"]}


def main():
    spec = json.load(open(os.path.join(HERE, "request.json")))
    gate = json.load(open(os.path.join(HERE, "gate.json")))
    family = spec["family"]
    got = run_suite(spec) if family == "suite" else (
        run_torch if family == "torch" else run_jax)(spec["request"])
    for n, x in got.items():
        np.save(os.path.join(HERE, f"out_{n}.npy"), x)
    out = gate["output"]
    if out not in got:
        print(f"{out}: not provided by the implementation")
        sys.exit(2)
    want = load(out).astype(np.float64)
    g = got[out].astype(np.float64).reshape(want.shape)
    finite = np.isfinite(g)
    diff = np.where(finite, g - want, np.inf)
    nonfinite = int((~finite).sum())
    ref = float(np.linalg.norm(want))
    rel = float(np.linalg.norm(diff)) / ref if ref else float("inf")
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(diff))), diff.shape)) if diff.size else ()
    print(f"{out}: worst element {list(worst)}: got {g[worst]:.9e}, want {want[worst]:.9e}; "
          f"‖got − want‖/‖want‖ {rel:.3e}; non-finite {nonfinite}")
    print(f"the suite's gate at this case: {gate['message']}")
    # The same failure: the same non-finite values, or the same error norm (to 1e-3).
    suite = gate["norm_err"]
    same = (nonfinite > 0) if gate["non_finite"] else (
        suite is not None and np.isfinite(rel) and abs(rel - suite) <= 1e-3 * max(suite, 1e-30))
    print("FAIL: the failure reproduces" if same else
          f"DIFFERENT: rel {rel:.3e} here, {suite} in the suite")
    sys.exit(1 if same else 0)

if __name__ == "__main__":
    main()
