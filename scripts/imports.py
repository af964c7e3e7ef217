#!/usr/bin/env python3
"""The import graph of src/: which file uses which, its circles and its floors.

Each `crate::a::b::...` path (in `use` lines and in code) and each `super::...` path is
resolved to the file that defines the longest module prefix of it. Prints the largest
import circles (strongly connected components), the floors (files ordered so that a
file imports only files on lower floors, circles being one floor each) and the imports
that run back up: those inside a circle that go from a file to one found earlier in a
depth-first walk. Usage: scripts/imports.py [SRC_DIR] [--max-circle N --max-back N]
(exit 1 when a limit is passed); --top counts each entry of SRC_DIR (a file, or a
folder with all it holds) as one node."""
import os
import re
import sys
from collections import defaultdict


def modules(src):
    """module path (tuple) -> file."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            out[tuple(rel)] = p
    return out


PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"use\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def strip_tests(text):
    """The code without comments (a doc link is not an import) and without the items under
    `#[cfg(test)]` (tests do not shape the architecture): a `mod x;` line, or a module,
    function or impl block up to its matching brace, wherever it is in the file."""
    text = "\n".join(line.split("//")[0] for line in text.split("\n"))
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = j + len("#[cfg(test)]")
        semi, brace = text.find(";", k), text.find("{", k)
        if brace < 0 or (0 <= semi < brace):
            i = semi + 1 if semi >= 0 else len(text)   # `mod tests;` or a `use`
            continue
        depth, m = 0, brace
        while m < len(text):
            depth += {"{": 1, "}": -1}.get(text[m], 0)
            m += 1
            if depth == 0:
                break
        i = m


def edges(src):
    mods = modules(src)
    graph = defaultdict(set)
    for mod, path in mods.items():
        if mod and mod[-1] == "tests":
            continue
        text = strip_tests(open(path, encoding="utf-8").read())
        here = mod if path.endswith(("mod.rs", "lib.rs", "main.rs")) else mod[:-1]
        paths = [(m.group(1), m.group(2)) for m in PATH.finditer(text)]
        for g in USE_GROUP.finditer(text):
            for item in re.split(r",", g.group(3)):
                item = item.strip().split(" as ")[0].split("::{")[0].strip()
                if item and item != "self":
                    paths.append((g.group(1), g.group(2) + "::" + item))
        for root, rest in paths:
            parts = [p for p in rest.split("::") if p]
            if root == "crate":
                base = []
            else:
                base = list(here)
                while parts and parts[0] == "super":
                    parts.pop(0)
                    base = base[:-1]
                base = base[:-1] if base else base
                if root == "super" and not base and not here:
                    continue
            full = tuple(base + parts)
            for k in range(len(full), 0, -1):
                if full[:k] in mods:
                    target = mods[full[:k]]
                    if target != path and not full[:k][-1:] == ("tests",):
                        graph[path].add(target)
                    break
    return mods, graph


def sccs(nodes, graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main(argv):
    src = "src"
    limits = {}
    top = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--top":
            top = True
        elif a in ("--max-circle", "--max-back"):
            limits[a] = int(args.pop(0))
        else:
            src = a
    mods, graph = edges(src)
    if top:
        # One node per entry of src/: a file, or a folder with everything under it.
        def entry(p):
            return os.path.relpath(p, src).split(os.sep)[0]
        g2 = defaultdict(set)
        for v, ws in graph.items():
            for w in ws:
                if entry(v) != entry(w):
                    g2[os.path.join(src, entry(v))].add(os.path.join(src, entry(w)))
        graph = g2
        nodes = sorted({os.path.join(src, entry(p)) for p in mods.values()})
    else:
        nodes = sorted(set(mods.values()))
    comps = sccs(nodes, graph)
    comp_of = {v: k for k, c in enumerate(comps) for v in c}
    # Floors: tarjan emits components in reverse topological order (imported first).
    floor = {}
    for k, c in enumerate(comps):
        below = [floor[comp_of[w]] for v in c for w in graph.get(v, ()) if comp_of[w] != k]
        floor[k] = 1 + max(below, default=0)
    # Imports back up: inside a circle, an edge to a file already on the DFS stack.
    back = []
    for k, c in enumerate(comps):
        if len(c) < 2:
            continue
        members = set(c)
        seen, stack_set = set(), set()

        def dfs(v):
            seen.add(v)
            stack_set.add(v)
            for w in sorted(graph.get(v, ())):
                if w not in members:
                    continue
                if w in stack_set:
                    back.append((v, w))
                elif w not in seen:
                    dfs(w)
            stack_set.discard(v)

        for v in sorted(c):
            if v not in seen:
                dfs(v)
    imports = sum(len(v) for v in graph.values())
    big = sorted((c for c in comps if len(c) > 1), key=len, reverse=True)
    print(f"{len(nodes)} files, {imports} imports, {max(floor.values())} floors, "
          f"largest circle {len(big[0]) if big else 1} files, {len(back)} imports back up")
    for c in big:
        print(f"circle of {len(c)}: " + ", ".join(sorted(os.path.relpath(p, src) for p in c)))
    for v, w in sorted(back):
        print(f"back up: {os.path.relpath(v, src)} -> {os.path.relpath(w, src)}")
    bad = (limits.get("--max-circle") is not None and big and len(big[0]) > limits["--max-circle"]) or (
        limits.get("--max-back") is not None and len(back) > limits["--max-back"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
