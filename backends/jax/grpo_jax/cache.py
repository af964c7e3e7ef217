"""Artifact cache: content-addressed directories ``<cache-dir>/<key>/``.

key = sha256 over (the package's source files, the canonical JSON of the normalized
request, jax and jaxlib versions; for a ``module:attribute`` implementation also the .py
files of its top-level package). An entry is complete when ``manifest.json`` exists in
its final directory; entries are assembled in a temporary sibling directory and renamed
into place, so a crash never leaves a half-written entry that looks complete.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

MODULE_FILE = "module.mlirbc"
MANIFEST_FILE = "manifest.json"
PACKAGE_DIR = Path(__file__).resolve().parent


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over every .py file of the grpo_jax package (relative path + bytes)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def versions() -> tuple[str, str]:
    import jax
    import jaxlib
    return jax.__version__, jaxlib.__version__


def cache_key(norm_request: dict) -> str:
    """The entry's key; an external implementation's own sources count too."""
    from .impls.registry import external_source_hash, is_external
    jax_v, jaxlib_v = versions()
    payload = {"source": source_hash(), "request": norm_request, "jax": jax_v,
               "jaxlib": jaxlib_v}
    if is_external(norm_request["impl"]):
        payload["external_source"] = external_source_hash(norm_request["impl"])
    payload = canonical_json(payload)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def lookup(cache_dir: Path, key: str) -> Optional[dict]:
    """The manifest of a complete entry, or None."""
    entry = Path(cache_dir) / key
    try:
        manifest = json.loads((entry / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (entry / MODULE_FILE).is_file() or manifest.get("key") != key:
        return None
    return manifest


def store(cache_dir: Path, key: str, module: bytes, manifest: dict) -> Path:
    """Write an entry atomically (module first, manifest last, then rename into place)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / key
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache_dir))
    try:
        os.chmod(tmp, 0o755)
        _write(tmp / MODULE_FILE, module)
        _write(tmp / MANIFEST_FILE, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        if final.exists():
            if lookup(cache_dir, key) is not None:  # a concurrent writer won
                shutil.rmtree(tmp)
                return final
            shutil.rmtree(final)  # stale, incomplete entry
        try:
            os.rename(tmp, final)
        except OSError:
            # Another exporter (a parallel test or run) stored the same key between the
            # check above and the rename: its complete entry is as good as ours.
            if lookup(cache_dir, key) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
