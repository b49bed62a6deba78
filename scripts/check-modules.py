#!/usr/bin/env python3
"""Checks that the modules of a crate depend one way: no cycle between any two files.

A file depends on another when it names it: `use crate::a::b`, `crate::a::b::f()`,
`super::b` (from a sibling), `b::f()` for a child module it declares. Test modules
(`#[cfg(test)] mod tests`) are left out. Prints the cycles found and exits 1, or prints the
order in which the files depend on each other (leaves first) and exits 0.

    scripts/check-modules.py src gateway/src
"""
import os
import re
import sys


def module_path(root, path):
    """`src/schema/cache.rs` -> ("schema", "cache"); `src/schema/mod.rs` -> ("schema",)."""
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def without_tests(text):
    """The text before the first `#[cfg(test)]` module, and without comments."""
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+", text)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"//[^\n]*", "", text)
    return text


def references(module, text, modules):
    """The modules `text` (of `module`) names."""
    found = set()
    # crate::a::b::... and use crate::{a, b::c}
    for m in re.finditer(r"crate::((?:\w+::)*\w+|\{[^}]*\})", text):
        body = m.group(1)
        paths = []
        if body.startswith("{"):
            for part in re.split(r",", body[1:-1]):
                part = part.strip()
                if part:
                    paths.append(part.split("::"))
        else:
            paths.append(body.split("::"))
        for p in paths:
            p = [x.strip("{} ") for x in p]
            for n in range(len(p), -1, -1):
                # an item of the crate root (`crate::App`) is the root's
                if tuple(p[:n]) in modules:
                    found.add(tuple(p[:n]))
                    break
    # super::x and self::x
    parent = module[:-1]
    for m in re.finditer(r"\bsuper::(\w+)", text):
        target = parent + (m.group(1),)
        found.add(target if target in modules else parent)
    for m in re.finditer(r"\bsuper::\{([^}]*)\}", text):
        for part in m.group(1).split(","):
            name = part.strip().split("::")[0]
            target = parent + (name,)
            found.add(target if target in modules else parent)
    # a child module used by its name: `catalog::load(...)`, `use catalog::Relation`
    for m in re.finditer(r"(?<![\w:])(\w+)::", text):
        target = module + (m.group(1),)
        if target in modules:
            found.add(target)
    found.discard(module)
    return found


def cycles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def check(root):
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                files[module_path(root, path)] = path
    modules = set(files)
    graph = {}
    for module, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = without_tests(f.read())
        # A parent (mod.rs, lib.rs) declares its children; declaring is not depending.
        graph[module] = {r for r in references(module, text, modules) if r[: len(module)] != module or r == module}
        # ... but a parent that calls into a child does depend on it.
        graph[module] |= {
            r for r in references(module, text, modules)
            if r[: len(module)] == module and len(r) == len(module) + 1
            and re.search(r"(?<![\w:])" + r[-1] + r"::", text)
        }
    return graph, cycles(graph)


def main():
    failed = False
    for root in sys.argv[1:] or ["src"]:
        graph, found = check(root)
        name = lambda m: "::".join(m) or "(crate root)"
        if found:
            failed = True
            for component in found:
                print(f"{root}: modules in a cycle: {', '.join(name(m) for m in component)}")
                for m in component:
                    inside = sorted(name(t) for t in graph[m] if t in component)
                    print(f"    {name(m)} -> {', '.join(inside)}")
        else:
            print(f"{root}: {len(graph)} files, no cycles")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
