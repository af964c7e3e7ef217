"""Exporter: manifest contents, round trip through the exported function, cache, CLI batches."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from grpo_jax import cache, export
from grpo_jax.impls import Capabilities, Implementation, baseline, registry
from grpo_jax.spec import Knobs, normalize_request, problem_of
from helpers import make_inputs

BACKEND_DIR = Path(__file__).resolve().parents[1]


def request(**over):
    req = {"impl": "jax_baseline", "level": "logits", "b": 3, "t": 8, "v": 2049, "h": None,
           "dtype": "bf16",
           "knobs": {"temperature": 1.0, "epsilon_low": 0.2, "epsilon_high": 0.28, "beta": 0.0,
                     "delta": None, "loss_type": "grpo", "max_completion_length": None,
                     "importance_sampling_level": "token", "logits_dtype": "f32"},
           "impl_options": {}, "platform": "cpu"}
    knobs = over.pop("knobs", {})
    req.update(over)
    req["knobs"] = {**req["knobs"], **knobs}
    return req


MLIR_TYPES = {"f32": "f32", "bf16": "bf16", "f16": "f16", "i32": "i32", "pred": "i1"}


def _main_args(text: str) -> list[str]:
    """Types of @main's arguments, e.g. ["tensor<3x8x2049xbf16>", ...]."""
    sig = re.search(r"func\.func public @main\((.*?)\) ->", text, re.S).group(1)
    return re.findall(r"%arg\d+: (tensor<[^>]*>)", sig)


def _main_arg_count(exported) -> int:
    return len(_main_args(exported.mlir_module()))


def _stored_module_text(path: Path) -> str:
    """Deserialize the stored StableHLO portable artifact back to MLIR text."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    with mlir.make_ir_context():
        return str(_jax.mlir.deserialize_portable_artifact(path.read_bytes()))


def _tensor_type(spec: dict) -> str:
    dims = "".join(f"{d}x" for d in spec["shape"])
    return f"tensor<{dims}{MLIR_TYPES[spec['dtype']]}>"


@pytest.mark.parametrize("beta,level", [(0.0, "logits"), (0.04, "logits"), (0.0, "fused")])
def test_export_round_trip(tmp_path, beta, level):
    req = request(knobs={"beta": beta, "temperature": 0.8}, level=level,
                  h=16 if level == "fused" else None)
    result = export.handle_request(req, tmp_path)
    assert result["status"] == "ok", result
    assert result["cached"] is False
    manifest = result["manifest"]
    entry = Path(result["dir"])
    assert entry == tmp_path / result["key"]
    assert json.loads((entry / "manifest.json").read_text()) == manifest
    names = [i["name"] for i in manifest["inputs"]]
    head = ["logits"] if level == "logits" else ["hidden", "lm_head"]
    kept_ref = ["ref_logp"] if beta != 0 else []
    assert names == head + ["chosen_ids", "old_logp"] + kept_ref + ["advantages", "mask"]
    assert manifest["inputs"][0]["dtype"] == "bf16"
    assert {i["name"]: i["dtype"] for i in manifest["inputs"]}["chosen_ids"] == "i32"
    outs = {o["name"]: (tuple(o["shape"]), o["dtype"]) for o in manifest["outputs"]}
    assert outs["loss"] == ((), "f32")
    for name in ("per_token_logp", "per_token_loss", "kl", "clipped", "entropy"):
        assert outs[name] == ((3, 8), "f32")
    if level == "logits":
        assert list(outs)[-1] == "dlogits" and outs["dlogits"] == ((3, 8, 2049), "bf16")
    else:
        assert outs["dhidden"] == ((3, 8, 16), "bf16")
        assert outs["dlm_head"] == ((16, 2049), "bf16")
    for k in ("impl", "level", "platform", "jax_version", "jaxlib_version", "source_hash", "key",
              "request"):
        assert k in manifest
    assert manifest["jax_version"] == jax.__version__

    # The artifact is the StableHLO bytecode, with the unused arguments really dropped.
    norm = normalize_request(req)
    built = export.build_function(norm)
    fn, problem = built.fn, built.problem
    exported = export.export_function(fn, problem)
    # (bytes differ from a re-export only in source locations)
    assert _main_arg_count(exported) == len(manifest["inputs"])
    stored = _main_args(_stored_module_text(entry / "module.mlirbc"))
    assert stored == [_tensor_type(i) for i in manifest["inputs"]]

    # Exported function == direct call.
    inputs = make_inputs(problem, seed=11)
    direct = jax.jit(fn)(*inputs.values())
    via_export = exported.call(*inputs.values())
    for a, b in zip(direct, via_export):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-6, atol=1e-7)


def test_cache_hit_and_normalisation(tmp_path):
    first = export.handle_request(request(), tmp_path)
    mtime = (Path(first["dir"]) / "module.mlirbc").stat().st_mtime_ns
    second = export.handle_request(request(), tmp_path)
    assert second["cached"] is True and second["key"] == first["key"]
    assert second["manifest"] == first["manifest"]
    assert (Path(first["dir"]) / "module.mlirbc").stat().st_mtime_ns == mtime
    # Same request with default knobs left out (and ints for floats) -> same key.
    sparse = {k: v for k, v in request().items() if k != "knobs"}
    sparse["knobs"] = {"epsilon_high": 0.28, "temperature": 1}
    assert export.handle_request(sparse, tmp_path)["key"] == first["key"]
    # Any knob change -> another key.
    other = export.handle_request(request(knobs={"temperature": 0.9}), tmp_path)
    assert other["key"] != first["key"] and other["cached"] is False
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_incomplete_entry_is_not_a_hit(tmp_path):
    # The key of the request as the exporter builds it (its options resolved).
    key = cache.cache_key(export.build_function(normalize_request(request())).norm)
    stale = tmp_path / key
    stale.mkdir()
    (stale / "module.mlirbc").write_bytes(b"half")  # crashed writer: no manifest
    result = export.handle_request(request(), tmp_path)
    assert result["status"] == "ok" and result["cached"] is False and result["key"] == key
    assert (stale / "manifest.json").is_file()
    assert (stale / "module.mlirbc").read_bytes() != b"half"


def test_tpu_export_on_cpu_machine(tmp_path):
    for level, h in (("logits", None), ("fused", 32)):
        result = export.handle_request(request(platform="tpu", level=level, h=h,
                                               knobs={"beta": 0.04}), tmp_path)
        assert result["status"] == "ok", result.get("detail")
        assert result["manifest"]["platform"] == "tpu"
    norm = normalize_request(request(platform="tpu"))
    built = export.build_function(norm)
    exported = export.export_function(built.fn, built.problem)
    assert exported.platforms == ("tpu",)
    assert _main_arg_count(exported) == 5  # no platform-index argument, ref_logp dropped


def test_cuda_export_on_cpu_machine_and_no_mosaic_kernel_for_a_gpu(tmp_path):
    """pjrt-gpu's modules are exported for ``cuda`` here (no GPU needed); a Pallas TPU
    kernel is unsupported there with its reason, never run in interpret mode."""
    for impl, level, h in (("jax_baseline", "fused", 32), ("xla_chunked", "fused", 32)):
        result = export.handle_request(request(impl=impl, platform="cuda", level=level, h=h),
                                       tmp_path)
        assert result["status"] == "ok", result.get("detail")
        assert result["manifest"]["platform"] == "cuda"
    for impl, level, h in (("pallas_fused", "fused", 32), ("pallas_logits", "logits", None),
                           ("pallas_logits_2pass", "logits", None)):
        result = export.handle_request(request(impl=impl, platform="cuda", level=level, h=h),
                                       tmp_path)
        assert result["status"] == "unsupported", result
        assert "Mosaic TPU kernel (no GPU lowering)" in result["reason"], result["reason"]
    # Elsewhere the reason stays the plain platform one.
    caps = Capabilities(platforms=frozenset({"cpu"}), mosaic_tpu=True)
    assert caps.reason(problem_of(normalize_request(request(platform="tpu"))), Knobs()) \
        == "not supported: platform 'tpu'"


def test_batch_with_unsupported_and_errors(tmp_path, monkeypatch):
    limited = Implementation(
        id="limited", description="test-only: logits level, f32, no beta",
        build=baseline.build,
        capabilities=Capabilities(levels=frozenset({"logits"}), dtypes=frozenset({"f32"}),
                                  beta=False),
        default_options={"block_v": 512},
        extra_check=lambda p, k, o: None if p.v % o["block_v"] == 0 else
        f"V={p.v} is not a multiple of block_v={o['block_v']}")
    monkeypatch.setitem(registry.IMPLEMENTATIONS, "limited", limited)
    lines = [
        json.dumps(request()),
        json.dumps(request(impl="limited")),                                   # bf16
        json.dumps(request(impl="limited", dtype="f32", knobs={"beta": 0.1})),  # beta
        json.dumps(request(impl="limited", dtype="f32")),                      # 2049 % 512
        json.dumps(request(impl="limited", dtype="f32", v=2048)),              # ok
        json.dumps(request(impl="limited", dtype="f32", impl_options={"bogus": 1})),
        json.dumps(request(knobs={"loss_type": "ppo"})),
        "{not json",
        "",
        json.dumps(request(impl="missing")),
        json.dumps(request(knobs={"delta": 1.1})),  # delta must exceed 1 + epsilon_high
        json.dumps(request(v=0)),
        json.dumps(request(knobs={"temperature": 0.5})),
        json.dumps(request(impl="limited", dtype="f32", level="fused", h=32)),  # no fused level
    ]
    out = io.StringIO()
    export.run_batch(lines, tmp_path, out)
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    statuses = [r["status"] for r in results]
    assert statuses == ["ok", "unsupported", "unsupported", "unsupported", "ok", "error",
                        "error", "error", "error", "error", "error", "ok", "not_applicable"]
    assert results[12]["reason"] == "limited: not applicable: level 'fused'", results[12]
    assert "dtype 'bf16'" in results[1]["reason"]
    assert "beta" in results[2]["reason"]
    assert "block_v" in results[3]["reason"]
    assert results[4]["manifest"]["request"]["impl_options"] == {"block_v": 512}  # defaults merged
    for r in results:
        if r["status"] == "error":
            assert "\n" not in r["message"] and r["detail"]


def test_cli_subprocess(tmp_path):
    reqs = tmp_path / "req.jsonl"
    reqs.write_text("\n".join([
        json.dumps(request()),
        json.dumps(request(impl="missing")),
        json.dumps(request(dtype="f64")),
        json.dumps(request()),
    ]) + "\n")
    cmd = [sys.executable, "-m", "grpo_jax.export", "--requests", str(reqs),
           "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=BACKEND_DIR, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["status"] for r in results] == ["ok", "error", "error", "ok"]
    assert results[0]["cached"] is False and results[3]["cached"] is True
    assert (Path(results[0]["dir"]) / "module.mlirbc").is_file()

    listing = subprocess.run([sys.executable, "-m", "grpo_jax.export", "--list-impls"],
                             capture_output=True, text=True, cwd=BACKEND_DIR, timeout=300)
    impls = json.loads(listing.stdout)
    assert "jax_baseline" in [i["id"] for i in impls]


def test_key_depends_on_versions_and_source(monkeypatch):
    norm = normalize_request(request())
    key = cache.cache_key(norm)
    monkeypatch.setattr(cache, "versions", lambda: ("0.0.0", "0.0.0"))
    assert cache.cache_key(norm) != key
    monkeypatch.undo()
    monkeypatch.setattr(cache, "source_hash", lambda: "0" * 64)
    assert cache.cache_key(norm) != key


def test_problem_of_normalised_request():
    norm = normalize_request(request(level="fused", h=64))
    p = problem_of(norm)
    assert (p.level, p.b, p.t, p.v, p.h, p.dtype, p.platform) == ("fused", 3, 8, 2049, 64, "bf16", "cpu")
    assert Knobs.from_json(norm["knobs"]).epsilon_high == 0.28


def test_check_config_names_each_bad_entry():
    from grpo_jax.export import check_config
    out = check_config([
        {"name": "a", "impl": "jax_baselin"},
        {"name": "b", "impl": "pallas_logits", "impl_options": {"blockrows": 8}},
        {"name": "c", "impl": "pallas_logits", "impl_options": {"block_rows": 0}},
        {"name": "d", "impl": "pallas_logits_jaxbwd", "impl_options": {"block_rows": 8, "block_v": 512}},
    ])
    assert [o["ok"] for o in out] == [False, False, False, True]
    assert "unknown implementation id 'jax_baselin'" in out[0]["error"]
    assert "blockrows" in out[1]["error"]
    assert "block_rows must be a positive integer" in out[2]["error"]


def test_store_tolerates_a_concurrent_writer_of_the_same_key(tmp_path, monkeypatch):
    # Two exporters (parallel tests) export the same module: the second one's rename finds
    # the first one's complete entry in place ("Directory not empty"); that is success.
    from grpo_jax import cache
    real_rename = cache.os.rename
    manifest = {"key": "k1"}

    def racing_rename(src, dst):
        monkeypatch.setattr(cache.os, "rename", real_rename)
        cache.store(tmp_path, "k1", b"winner", manifest)  # the other writer wins the race
        real_rename(src, dst)  # raises: the directory is there and not empty

    monkeypatch.setattr(cache.os, "rename", racing_rename)
    final = cache.store(tmp_path, "k1", b"loser", manifest)
    assert (final / cache.MODULE_FILE).read_bytes() == b"winner"
    assert cache.lookup(tmp_path, "k1") == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["k1"]  # no temporary left behind
