"""sources.py: an external implementation's digest covers the code it is built from,
wherever that code lives, and nothing else."""

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

WRAPPER = '''
import dataclasses
from grpo_jax.impls import baseline
from kernellib import core

IMPLEMENTATION = dataclasses.replace(baseline.IMPLEMENTATION, id="wrapped",
                                     build=core.build)
'''
KERNEL = '''
from grpo_jax.impls import baseline

def build(problem, knobs, options):
    return baseline.build(problem, knobs, options)
'''


def _layout(tmp: Path) -> tuple[Path, Path]:
    """wrapper/wrapped.py in one directory, kernellib/core.py (a 'checkout') in another."""
    (tmp / "wrap").mkdir()
    (tmp / "wrap" / "wrapped.py").write_text(WRAPPER)
    (tmp / "lib" / "kernellib").mkdir(parents=True)
    (tmp / "lib" / "kernellib" / "__init__.py").write_text("")
    (tmp / "lib" / "kernellib" / "core.py").write_text(KERNEL)
    (tmp / "lib" / "kernellib" / "unused.py").write_text("X = 1\n")
    (tmp / "lib" / "other.py").write_text("Y = 1\n")
    return tmp / "wrap", tmp / "lib"


def _digest(tmp: Path, first: str = "", entry_pythonpath: str = "") -> str:
    """The digest in a fresh interpreter (as the exporter computes it), after importing
    ``first`` (order independence), with the suite's ``GRPO_ENTRY_PYTHONPATH``."""
    wrap, lib = _layout(tmp) if not (tmp / "wrap").exists() else (tmp / "wrap", tmp / "lib")
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(wrap)!r}, {str(lib)!r}]
        {f"import {first}" if first else ""}
        from grpo_jax.impls.registry import external_source_hash
        print(external_source_hash("wrapped:IMPLEMENTATION"))
    """)
    import os
    env = dict(os.environ, GRPO_ENTRY_PYTHONPATH=entry_pythonpath)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    return out.stdout.strip().splitlines()[-1]


def test_editing_a_kernel_outside_the_wrappers_package_changes_the_digest(tmp_path):
    a = _digest(tmp_path)
    assert a == _digest(tmp_path, first="kernellib.core"), "depends on import order"
    core = tmp_path / "lib" / "kernellib" / "core.py"
    core.write_text(core.read_text() + "\nSCALE = 2.0\n")
    b = _digest(tmp_path)
    assert b != a
    # A file the implementation does not reach changes nothing.
    (tmp_path / "lib" / "other.py").write_text("Y = 2\n")
    assert _digest(tmp_path) == b


def test_every_py_file_under_the_entrys_pythonpath_is_in_the_digest(tmp_path):
    """A helper imported inside a function, or a sibling nothing imports yet, is not
    reached by the walk; under the entry's pythonpath it is part of the key anyway."""
    lib = str(tmp_path / "lib")
    a = _digest(tmp_path, entry_pythonpath=lib)
    (tmp_path / "lib" / "other.py").write_text("Y = 2\n")  # reached by nothing
    b = _digest(tmp_path, entry_pythonpath=lib)
    assert b != a
    # Outside the entry's pythonpath the walk alone decides, as before.
    c = _digest(tmp_path)
    (tmp_path / "lib" / "other.py").write_text("Y = 3\n")
    assert _digest(tmp_path) == c
    # Caches and hidden directories are not sources.
    (tmp_path / "lib" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "lib" / "__pycache__" / "x.py").write_text("Z = 1\n")
    (tmp_path / "lib" / ".hidden").mkdir()
    (tmp_path / "lib" / ".hidden" / "y.py").write_text("Z = 1\n")
    d = _digest(tmp_path, entry_pythonpath=lib)
    (tmp_path / "lib" / "__pycache__" / "x.py").write_text("Z = 2\n")
    (tmp_path / "lib" / ".hidden" / "y.py").write_text("Z = 2\n")
    assert _digest(tmp_path, entry_pythonpath=lib) == d


def test_the_walk_reaches_the_checkout_and_stops_at_installed_packages(tmp_path):
    wrap, lib = _layout(tmp_path)
    sys.path[:0] = [str(wrap), str(lib)]
    try:
        from grpo_jax import sources
        m = importlib.import_module("wrapped")
        files, dists = sources.reached(m)
        assert set(files) == {"wrapped", "kernellib", "kernellib.core"}, files
        assert sources.origin(np_file()) == "site"
        assert sources.origin(importlib.__file__) == "stdlib"
        assert any(v.startswith("jax==") for v in sources.installed())
    finally:
        sys.path[:] = [p for p in sys.path if p not in (str(wrap), str(lib))]
        for name in ("wrapped", "kernellib", "kernellib.core"):
            sys.modules.pop(name, None)


def np_file() -> str:
    import numpy
    return numpy.__file__
