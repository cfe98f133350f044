#!/usr/bin/env python3
"""Fails when a module map holds code, or a module file breaks the layout.

A *module map* is every `mod.rs`, and every `lib.rs` that declares a module
in a file of its own. A map may hold only:

* `mod` declarations, with their attributes (`#[cfg(...)]`, `#[allow(...)]`,
  `#[macro_use]`, docs): `#[cfg(test)] mod tests;` among them;
* `use` and `pub use` items (re-exports, and the imports they need);
* inline modules whose body is itself a map (`pub mod store { pub use ...; }`,
  a namespace of re-exports);
* doc comments and attributes, inner (`//!`, `#![...]`) or outer;
* in a `lib.rs` only: items under `#[cfg(doctest)]` (a unit struct that
  carries a Markdown file's examples as doctests).

Anything else (a `fn`, `struct`, `enum`, `trait`, `impl`, `type`, `const`,
`static`, `macro_rules!`, a macro call) is reported with its file and line.

A map's doc comment names every file it declares (`tests` excepted), in
backticks (`name`, `path::name`) or as a link ([`name`]), so that a reader
of the map finds every file.

One module-file style: a module with files of its own is a folder with a
`mod.rs` (a program of several files: a folder with a `main.rs`). A file
`x.rs` beside a folder `x/` of Rust files fails, and so does `#[path = ...]`
on a module declaration anywhere.

Every finding fails the check: there is no list of exceptions.

    python3 .ci/module-maps.py [workspace-root]
"""

import importlib.util
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
VIS = r"(?:pub(?:\s*\([^)]*\))?\s+)?"

def load_strip():
    """`strip` of import-cycles.py: source without comments, strings and
    char literals, lines kept."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "import-cycles.py")
    spec = importlib.util.spec_from_file_location("import_cycles", here)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.strip


strip = load_strip()


def rust_files(ws):
    for dp, dn, fn in os.walk(ws):
        dn[:] = sorted(d for d in dn if d != "target" and not d.startswith("."))
        for f in sorted(fn):
            if f.endswith(".rs"):
                yield os.path.join(dp, f)


def balanced(src, i):
    """Index just past the bracket group that opens at src[i]."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[src[i]]]
    j = i + 1
    while j < len(src) and stack:
        c = src[j]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
        j += 1
    return j


def items(src, start, end):
    """The items between start and end of stripped source: a list of
    (position of the item, its attributes, its text)."""
    out = []
    i = start
    attrs = []
    while i < end:
        while i < end and src[i].isspace():
            i += 1
        if i >= end:
            break
        if src.startswith("#![", i) or src.startswith("#[", i):
            j = balanced(src, src.index("[", i))
            attrs.append(src[i:j])
            i = j
            continue
        if src[i] == ";":
            i += 1
            continue
        # An item: to its `;` at depth 0, or to the end of its first
        # top-level `{}` block (and a `;` right after it).
        j = i
        while j < end:
            c = src[j]
            if c in "([":
                j = balanced(src, j)
                continue
            if c == "{":
                head = src[i:j]
                j = balanced(src, j)
                if re.match(VIS + r"use\b", head.strip()):
                    continue  # a use tree: its `;` comes later
                k = j
                while k < end and src[k].isspace():
                    k += 1
                if k < end and src[k] == ";":
                    j = k + 1
                break
            if c == ";":
                j += 1
                break
            j += 1
        out.append((i, attrs, src[i:j]))
        attrs = []
        i = j
    if attrs:
        out.append((i, attrs, ""))
    return out


def describe(text):
    """What an item is, for a message: "fn `name`", "impl `Foo for Bar`"."""
    t = re.sub(r"\s+", " ", text).strip()
    t = re.sub(r"^" + VIS, "", t)
    t = re.sub(r"^(?:(?:const|async|unsafe|default|extern(?: \w+)?) )+(?=fn |trait |impl )", "", t)
    m = re.match(r"(fn|struct|enum|union|trait|type|const|static(?: mut)?|mod) (" + IDENT + ")", t)
    if m:
        return f"{m.group(1)} `{m.group(2)}`"
    m = re.match(r"impl\b\s*(?:<[^{]*?>)?\s*([^{;]*)", t)
    if m:
        return f"impl `{m.group(1).strip()}`"
    m = re.match(r"macro_rules ?! ?(" + IDENT + ")", t)
    if m:
        return f"macro_rules! `{m.group(1)}`"
    m = re.match(r"(" + IDENT + r"(?:::" + IDENT + r")*) ?!", t)
    if m:
        return f"macro call `{m.group(1)}!`"
    return f"`{t[:40]}`"


def map_findings(src, start, end, is_lib, out):
    """Appends (position, what) for each item of a map that is code."""
    for pos, attrs, text in items(src, start, end):
        t = text.strip()
        if not t:
            continue
        if re.match(VIS + r"mod\s+" + IDENT + r"\s*;", t):
            continue
        m = re.match(VIS + r"mod\s+" + IDENT + r"\s*\{", t)
        if m:
            body = pos + text.index("{", m.start()) + 1
            map_findings(src, body, pos + len(text.rstrip().rstrip(";")) - 1, is_lib, out)
            continue
        if re.match(VIS + r"use\s", t):
            continue
        if is_lib and any(re.search(r"\bcfg\s*\(\s*doctest\s*\)", a) for a in attrs):
            continue
        out.append((pos, describe(t)))


def declared_files(src, path):
    """Names of the modules a file declares with `mod x;` (not `tests`)."""
    names = []
    for pos, attrs, text in items(src, 0, len(src)):
        m = re.match(VIS + r"mod\s+(" + IDENT + r")\s*;", text.strip())
        if m and m.group(1) != "tests":
            names.append(m.group(1))
    return names


def inner_docs(raw):
    """The text of a file's `//!` lines."""
    return "\n".join(
        line.strip()[3:] for line in raw.splitlines() if line.strip().startswith("//!")
    )


def main():
    ws = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    findings = []  # messages, each naming its file

    def report(msg):
        findings.append(msg)

    for path in rust_files(ws):
        rel = os.path.relpath(path, ws)
        raw = open(path, encoding="utf-8").read()
        src = strip(raw)
        line = lambda pos: src.count("\n", 0, pos) + 1  # noqa: E731

        for m in re.finditer(r"#\[\s*path\s*=", src):
            report(
                f"{rel}:{line(m.start())}: `#[path = ...]` on a module: put the file "
                f"where its declaration finds it (a folder `x/` with `x/mod.rs`, or "
                f"`x/main.rs` for a program of several files) and drop the attribute")

        base, name = os.path.dirname(path), os.path.basename(path)
        folder = path[:-3]
        if name not in ("mod.rs", "lib.rs", "main.rs", "build.rs") and os.path.isdir(folder) \
                and any(f.endswith(".rs") for f in os.listdir(folder)):
            # A target's root (src/bin/, examples/, tests/, benches/, or an
            # example at the package root) becomes x/main.rs.
            target = "main.rs" if os.path.basename(base) in ("bin", "examples", "tests", "benches") \
                or os.path.exists(os.path.join(base, "Cargo.toml")) else "mod.rs"
            report(
                f"{rel}: `{name}` beside the folder `{name[:-3]}/`: the workspace keeps a "
                f"module's files in its folder, with `{name[:-3]}/{target}` as its "
                f"{'root' if target == 'main.rs' else 'map'}: "
                f"`git mv {rel} {os.path.join(os.path.relpath(folder, ws), target)}`"
                + (" (and its path in Cargo.toml)" if target == "main.rs" else
                   ", then move its code into files of that folder"))

        is_map = name == "mod.rs" or (name == "lib.rs" and declared_files(src, path))
        if not is_map:
            continue
        code = []
        map_findings(src, 0, len(src), name == "lib.rs", code)
        for pos, what in code:
            report(
                f"{rel}:{line(pos)}: {what} is code in a module map; a {name} only "
                f"declares its files and re-exports (docs/ARCHITECTURE.md, \"Layers\"): "
                f"move it into a file of {os.path.relpath(base, ws)}/ named for what it "
                f"holds, declare that file here and `pub use` what others name")
        docs = inner_docs(raw)
        for mname in declared_files(src, path):
            if not re.search(r"`(?:[A-Za-z_:]*::)?" + mname + r"(?:`|::)|\[`?" + mname + r"`?\]", docs):
                report(
                    f"{rel}: its docs do not name its file `{mname}`: say in the "
                    f"map's `//!` docs what `{mname}` holds")

    for msg in findings:
        print(msg)
    bad = len(findings)
    if bad:
        print(f"{bad} finding(s): module maps hold only declarations and re-exports, "
              f"one module-file style (docs/ARCHITECTURE.md, \"Layers\")")
        sys.exit(1)
    print("module maps only map; one module-file style")


if __name__ == "__main__":
    main()
