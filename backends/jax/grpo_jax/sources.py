"""What an external implementation's export is built from, as one digest (part of the
export cache key, ``cache.cache_key``), so an edited kernel is always exported again.

Three parts, each deterministic (independent of what else the exporter imported first):

* **the module's own tree**: every ``.py`` file of its top-level package (or the module
  file), also the ones it imports lazily;
* **the code it reaches**: from the module, every module it references (module globals,
  the ``__module__`` of its functions and classes, the functions an ``Implementation`` or
  a ``functools.partial`` holds and their closures), followed transitively. A module whose
  file lies outside the interpreter's standard library and outside any ``site-packages``
  (a checkout on ``pythonpath``, an editable install) is hashed by its bytes, and the walk
  goes on through it;
* **installed distributions**: the name and version of every distribution installed in
  the exporting interpreter (a module the walk reaches under ``site-packages`` ends the
  walk there; a kernel may import any installed package lazily).

* **the entry's ``pythonpath``**: every ``.py`` file under the directories the suite names
  in ``GRPO_ENTRY_PYTHONPATH`` (the entry's ``pythonpath``), imported or not, so a helper
  module imported inside a function, or a sibling module nothing imports yet, is part of
  the key (hidden directories, ``__pycache__``, ``site-packages`` and virtual
  environments are skipped).

Not seen: a module outside the top-level package and outside the entry's ``pythonpath``
that the implementation imports only inside a function (lazily).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import sys
import sysconfig
import types
from pathlib import Path
from typing import Iterable, Optional

_OWN = "grpo_jax"  # hashed as a whole by cache.source_hash


@functools.lru_cache(maxsize=None)
def _roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(standard library directories, site-packages directories), resolved."""
    paths = sysconfig.get_paths()
    std = {paths.get("stdlib"), paths.get("platstdlib")}
    site = {paths.get("purelib"), paths.get("platlib")}
    try:
        import site as _site
        site.update(_site.getsitepackages())
    except Exception:  # noqa: BLE001 - a venv without getsitepackages
        pass
    res = lambda xs: tuple(sorted(str(Path(x).resolve()) for x in xs if x))  # noqa: E731
    return res(std), res(site)


def origin(file: Optional[str]) -> str:
    """``builtin`` (no file), ``stdlib``, ``site`` (an installed distribution) or
    ``source`` (anything else: a checkout, an editable install)."""
    if not file:
        return "builtin"
    p = str(Path(file).resolve())
    std, site = _roots()
    if "/site-packages/" in p or "/dist-packages/" in p or any(
            p.startswith(s + "/") for s in site):
        return "site"
    if any(p.startswith(s + "/") for s in std):
        return "stdlib"
    return "source"


@functools.lru_cache(maxsize=None)
def _distributions() -> dict:
    from importlib import metadata
    try:
        return metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - old importlib.metadata
        return {}


def distribution_versions(top_level: str) -> list[str]:
    """``name==version`` of the distributions that provide ``top_level``."""
    from importlib import metadata
    out = []
    for dist in sorted(set(_distributions().get(top_level, []))):
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except Exception:  # noqa: BLE001 - metadata without a version
            out.append(f"{dist}==?")
    return out or [f"{top_level}==?"]


def _modules_of(value, depth: int = 0) -> Iterable[str]:
    """Names of the modules a global value belongs to or holds code of."""
    if isinstance(value, types.ModuleType):
        yield value.__name__
        return
    mod = getattr(value, "__module__", None)
    if isinstance(mod, str):
        yield mod
    if depth >= 3:
        return
    if isinstance(value, functools.partial):
        yield from _modules_of(value.func, depth + 1)
        for a in list(value.args) + list(value.keywords.values()):
            yield from _modules_of(a, depth + 1)
    elif isinstance(value, types.FunctionType):
        for cell in value.__closure__ or ():
            try:
                yield from _modules_of(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                pass
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _modules_of(getattr(value, f.name, None), depth + 1)
    elif isinstance(value, (tuple, list)) and depth < 2:
        for x in value[:64]:
            yield from _modules_of(x, depth + 1)


def reached(module: types.ModuleType) -> tuple[dict, set]:
    """(module name -> file of every ``source`` module reached, names of the top-level
    packages of the ``site`` modules reached), walking from ``module``."""
    files: dict = {}
    dists: set = set()
    seen: set = set()
    stack = [module.__name__]
    while stack:
        name = stack.pop()
        if name in seen or name.split(".")[0] == _OWN:
            continue
        seen.add(name)
        m = sys.modules.get(name)
        if m is None:
            continue
        file = getattr(m, "__file__", None)
        kind = origin(file)
        if kind == "site":
            dists.add(name.split(".")[0])
            continue
        if kind != "source":
            continue
        files[name] = file
        if "." in name:
            stack.append(name.rsplit(".", 1)[0])
        for value in list(vars(m).values()):
            stack.extend(_modules_of(value))
    return files, dists


def _tree(module: types.ModuleType) -> list[Path]:
    """The .py files of ``module``'s top-level package (or the module file)."""
    top = importlib.import_module(module.__name__.split(".")[0])
    if getattr(top, "__path__", None):
        files = []
        for d in top.__path__:
            files += [p for p in Path(d).rglob("*.py") if "__pycache__" not in p.parts]
        return sorted(files)
    return [Path(top.__file__)] if getattr(top, "__file__", None) else []


def digest(module: types.ModuleType) -> str:
    """The digest of everything ``module`` (an external implementation's) is built from."""
    h = hashlib.sha256()
    tree = _tree(module)
    root = tree[0].parent if tree else Path(".")
    for f in tree:
        h.update(b"tree\0" + str(f.relative_to(root) if f.is_relative_to(root) else f.name)
                 .encode() + b"\0" + f.read_bytes() + b"\0")
    files, _dists = reached(module)
    for name in sorted(files):
        h.update(b"module\0" + name.encode() + b"\0" + Path(files[name]).read_bytes() + b"\0")
    for v in installed():
        h.update(b"dist\0" + v.encode() + b"\0")
    h.update(b"pythonpath\0" + pythonpath_digest(os.environ.get(ENTRY_PYTHONPATH, "")).encode())
    return h.hexdigest()


ENTRY_PYTHONPATH = "GRPO_ENTRY_PYTHONPATH"
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "node_modules"}


def pythonpath_files(dirs: str) -> list[Path]:
    """Every ``.py`` file under the ``:``-separated ``dirs``, sorted, skipping hidden
    directories, caches, installed packages and virtual environments."""
    out = []
    for d in [Path(x) for x in dirs.split(":") if x]:
        for root, subdirs, names in os.walk(d):
            subdirs[:] = sorted(x for x in subdirs if not x.startswith(".") and x not in _SKIP_DIRS
                                and not (Path(root) / x / "pyvenv.cfg").exists())
            out += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
    return out


@functools.lru_cache(maxsize=None)
def pythonpath_digest(dirs: str) -> str:
    """The digest of every ``.py`` file under ``dirs`` (path relative to its directory,
    and bytes); once per exporter process."""
    h = hashlib.sha256()
    for d in [x for x in dirs.split(":") if x]:
        for f in pythonpath_files(d):
            h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def installed() -> tuple[str, ...]:
    """``name==version`` of every distribution the interpreter can import, sorted."""
    from importlib import metadata
    out = set()
    for d in metadata.distributions():
        name = d.metadata["Name"] if d.metadata else None
        if name:
            out.add(f"{name.lower()}=={d.version}")
    return tuple(sorted(out))
