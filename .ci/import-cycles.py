#!/usr/bin/env python3
"""Fails when a source file imports from a file that (directly or through
others) imports it.

For every crate root of the workspace (src/lib.rs, src/main.rs, src/bin/*,
tests/*, examples/*, benches/*) the module tree is read from its `mod`
declarations. Every path a file names (`use` trees, and `crate::`, `super::`,
`self::` paths in code) is resolved to the deepest module that has a file of
its own; that is an edge from the naming file to the file it names. A `mod x;`
declaration is not an edge; a `pub use x::Y` re-export is. Strongly
connected components of more than one file are cycles, and each is printed
with the references that close it.

    python3 .ci/import-cycles.py [workspace-root]
"""

import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(src):
    """Source text without comments, strings and char literals (same length
    of lines, so line numbers stay valid)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
            continue
        m = re.match(r'r(#*)"', src[i:i + 10])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
            continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", src[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def use_paths(tree):
    """Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas" + IDENT, "", tree)

    def expand(t):
        depth = 0
        for k, ch in enumerate(t):
            if ch == "{":
                prefix = t[:k]
                inner = t[k + 1:t.rindex("}")]
                parts, cur, d = [], "", 0
                for ch2 in inner:
                    if ch2 == "," and d == 0:
                        parts.append(cur)
                        cur = ""
                        continue
                    d += ch2 == "{"
                    d -= ch2 == "}"
                    cur += ch2
                parts.append(cur)
                res = []
                for p in parts:
                    if p:
                        res.extend(prefix + q for q in expand(p))
                return res
        return [t]

    return [p for p in expand(tree) if p]


class Crate:
    def __init__(self, root_file):
        self.files = {}  # module path (tuple) -> file
        self.children = defaultdict(set)  # module path -> child names
        self.inline = {}  # (file, line range) handled in scan
        self.load(root_file, ())

    def load(self, path, modpath):
        if not os.path.exists(path):
            return
        self.files[modpath] = path
        src = strip(open(path, encoding="utf-8").read())
        base = os.path.dirname(path)
        name = os.path.basename(path)
        if name in ("lib.rs", "main.rs", "mod.rs") or modpath == ():
            subdir = base
        else:
            subdir = os.path.join(base, name[:-3])
        # Declarations at any inline depth: mod a { mod b; } is rare here;
        # track inline blocks to place nested declarations correctly.
        stack = []  # (name, depth)
        depth = 0
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*([;{])|[{}]", src):
            tok = m.group(0)
            if tok == "{":
                depth += 1
                continue
            if tok == "}":
                depth -= 1
                while stack and stack[-1][1] > depth:
                    stack.pop()
                continue
            mname, kind = m.group(1), m.group(2)
            inner = tuple(s for s, _ in stack)
            if kind == ";":
                here = os.path.join(subdir, *inner)
                cand = [os.path.join(here, mname + ".rs"), os.path.join(here, mname, "mod.rs")]
                # `#[path = "..."]` just before the declaration.
                pre = src[max(0, m.start() - 200):m.start()]
                pm = re.search(r'#\[path\s*=\s*\]\s*$', pre)
                for c in cand:
                    if os.path.exists(c):
                        self.children[modpath + inner].add(mname)
                        self.load(c, modpath + inner + (mname,))
                        break
            else:
                depth += 1
                self.children[modpath + inner].add(mname)
                stack.append((mname, depth))
                # An inline module shares its file.
                self.files.setdefault(modpath + inner + (mname,), path)

    def resolve(self, modpath, path):
        """The file of the deepest module `path` names, seen from module
        `modpath` (None for external crates)."""
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] == "crate":
            cur, segs = (), segs[1:]
        elif segs[0] in ("self", "super"):
            cur = modpath
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super":
                    cur = cur[:-1]
                segs = segs[1:]
        elif segs[0] in self.children.get(modpath, ()):
            cur = modpath
        else:
            return None
        best = self.files.get(cur)
        for s in segs:
            if s in self.children.get(cur, ()):
                cur = cur + (s,)
                best = self.files.get(cur, best)
            else:
                break
        return best

    def edges(self):
        out = defaultdict(list)  # file -> [(file, line, text)]
        for modpath, path in list(self.files.items()):
            if self.files.get(modpath[:-1]) == path and modpath:
                continue  # inline module: scanned with its file
            src = strip(open(path, encoding="utf-8").read())
            # Inline module ranges, to tell which module a line is in.
            ranges = []
            stack, depth = [], 0
            for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{|[{}]", src):
                tok = m.group(0)
                if tok == "{":
                    depth += 1
                elif tok == "}":
                    if stack and stack[-1][1] == depth:
                        name, d, start = stack.pop()
                        ranges.append((start, m.end(), name, len(stack)))
                    depth -= 1
                else:
                    depth += 1
                    stack.append((m.group(1), depth, m.start()))

            def module_at(pos):
                inner = sorted(
                    (r for r in ranges if r[0] <= pos < r[1]), key=lambda r: r[3]
                )
                return modpath + tuple(r[2] for r in inner)

            refs = []
            for m in re.finditer(r"\buse\s+([^;]+);", src):
                for p in use_paths(m.group(1)):
                    refs.append((m.start(), p.rstrip("*").rstrip(":")))
            code = re.sub(r"\buse\s+[^;]+;", lambda m: " " * len(m.group(0)), src)
            for m in re.finditer(r"\b(?:crate|super|self)(?:::" + IDENT + r")+", code):
                refs.append((m.start(), m.group(0)))
            for pos, p in refs:
                target = self.resolve(module_at(pos), p)
                if target and target != path:
                    line = src.count("\n", 0, pos) + 1
                    out[path].append((target, line, p))
        return out


def crate_roots(ws):
    roots = []
    for dp, dn, fn in os.walk(ws):
        dn[:] = [d for d in dn if d not in ("target", ".git") and not d.startswith(".")]
        if "Cargo.toml" not in fn or dp == ws and not os.path.isdir(os.path.join(dp, "src")):
            continue
        for rel in ("src/lib.rs", "src/main.rs"):
            if os.path.exists(os.path.join(dp, rel)):
                roots.append(os.path.join(dp, rel))
        for sub in ("src/bin", "tests", "examples", "benches"):
            d = os.path.join(dp, sub)
            if os.path.isdir(d):
                for f in sorted(os.listdir(d)):
                    if f.endswith(".rs"):
                        roots.append(os.path.join(d, f))
                    elif os.path.exists(os.path.join(d, f, "main.rs")):
                        roots.append(os.path.join(d, f, "main.rs"))
        # examples declared at the package root (path = "x.rs")
        for f in sorted(os.listdir(dp)):
            if f.endswith(".rs") and f != "build.rs":
                roots.append(os.path.join(dp, f))
    return roots


def sccs(graph):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    ws = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = 0
    seen = set()
    for root in crate_roots(ws):
        crate = Crate(root)
        edges = crate.edges()
        graph = {f: {t for t, _, _ in es} for f, es in edges.items()}
        for comp in sccs(graph):
            if len(comp) < 2:
                continue
            key = tuple(sorted(comp))
            if key in seen:
                continue
            seen.add(key)
            bad += 1
            comp_set = set(comp)
            print("import cycle between files:")
            for f in sorted(comp):
                for t, line, p in edges[f]:
                    if t in comp_set:
                        print(f"  {os.path.relpath(f, ws)}:{line} -> {os.path.relpath(t, ws)} ({p})")
    if bad:
        print(f"{bad} import cycle(s); make the dependency run one way (see docs/ARCHITECTURE.md)")
        sys.exit(1)
    print("no import cycles between files")


if __name__ == "__main__":
    main()
