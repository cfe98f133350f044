#!/usr/bin/env python3
"""Lists the public API of the `chorus` crate, one item per line, sorted.

Every path by which a user of `chorus` can name an item is listed, with the
item's kind: modules, types, traits, functions, constants, statics,
macros; the fields of public structs, the variants of enums, the methods
and associated items of inherent impls and of traits; and the trait
implementations of chorus's types (`impl Trait for Type`, auto traits and
blanket implementations left out). Items that chorus re-exports from the
crates below it (`chorus-core`, `chorus-gpu`, `chorus-store`) are listed
under the path chorus gives them, with their members.

Items only present with an opt-in feature (`profile`, `test-util`) end in
`[feature]`. `#[doc(hidden)]` items are not part of the API and are left
out.

It reads rustdoc's JSON output (`RUSTC_BOOTSTRAP=1 cargo rustdoc ... -Z
unstable-options --output-format json`), which it builds for chorus and for
each crate chorus re-exports from, first with the default features and then
with every feature.

    python3 .ci/public-api.py            # prints the listing
    python3 .ci/public-api.py --check    # fails with a diff when it differs
                                         # from collectives/public-api.txt
    python3 .ci/public-api.py --write    # rewrites collectives/public-api.txt
"""

import difflib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTING = os.path.join(ROOT, "collectives", "public-api.txt")
CRATES = ["chorus", "chorus-core", "chorus-gpu", "chorus-store"]
# The features that are off by default, for each crate, as the `chorus`
# feature that turns them on there.
ALL_FEATURES = {
    "chorus": "profile,test-util",
    "chorus-core": "profile",
    "chorus-gpu": "test-util",
    "chorus-store": None,
}

KINDS = {
    "module": "mod",
    "struct": "struct",
    "enum": "enum",
    "union": "union",
    "trait": "trait",
    "trait_alias": "trait",
    "function": "fn",
    "constant": "const",
    "static": "static",
    "type_alias": "type",
    "macro": "macro",
    "proc_macro": "macro",
    "struct_field": "field",
    "variant": "variant",
    "assoc_const": "const",
    "assoc_type": "type",
    "primitive": "primitive",
}


def rustdoc_json(crate, features, target_dir):
    """Builds `crate`'s rustdoc JSON and returns it parsed."""
    cmd = ["cargo", "rustdoc", "--quiet", "--locked", "-p", crate, "--lib"]
    if features:
        cmd += ["--features", features]
    cmd += ["--", "-Z", "unstable-options", "--output-format", "json"]
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    env.pop("RUSTDOCFLAGS", None)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    path = os.path.join(target_dir, "doc", crate.replace("-", "_") + ".json")
    with open(path) as f:
        return json.load(f)


def kind_of(item):
    (k,) = item["inner"].keys()
    return k


def type_name(ty):
    """A short rendering of a type, for `impl Trait for Type` lines."""
    if not isinstance(ty, dict):
        return str(ty)
    (k, v), = ty.items()
    if k == "resolved_path":
        return v["path"].split("::")[-1] + generic_args(v.get("args"))
    if k == "primitive":
        return v
    if k == "generic":
        return v
    if k == "borrowed_ref":
        return "&" + ("mut " if v.get("is_mutable") else "") + type_name(v["type"])
    if k == "tuple":
        return "(" + ", ".join(type_name(t) for t in v) + ")"
    if k == "slice":
        return "[" + type_name(v) + "]"
    return k


def generic_args(args):
    """`<A, B>` of a path's generic arguments (types only), or ``."""
    if not isinstance(args, dict) or "angle_bracketed" not in args:
        return ""
    tys = [
        type_name(a["type"]) for a in args["angle_bracketed"].get("args", [])
        if isinstance(a, dict) and "type" in a
    ]
    return "<" + ", ".join(tys) + ">" if tys else ""


class Api:
    def __init__(self, docs):
        # docs: crate name (underscored) -> rustdoc JSON
        self.docs = docs
        # crate -> {tuple(path): id} of the crate's own items
        self.by_path = {}
        for name, doc in docs.items():
            self.by_path[name] = {
                tuple(p["path"]): i for i, p in doc["paths"].items() if p["crate_id"] == 0
            }
        self.lines = set()

    def resolve(self, crate, item_id):
        """The (crate, item) an id of `crate`'s JSON names, following it into
        another crate's JSON when it is foreign; None when not documented."""
        doc = self.docs[crate]
        item = doc["index"].get(str(item_id))
        if item is not None and item["crate_id"] == 0:
            return crate, item
        summary = doc["paths"].get(str(item_id))
        if summary is None:
            return (crate, item) if item is not None else None
        ext = doc["external_crates"].get(str(summary["crate_id"]), {}).get("name")
        if ext not in self.docs:
            return (crate, item) if item is not None else None
        target = self.by_path[ext].get(tuple(summary["path"]))
        if target is None:
            # Foreign paths are the definition's; find the item by name and
            # kind among the crate's public paths.
            name = summary["path"][-1]
            hits = [
                i for p, i in self.by_path[ext].items()
                if p[-1] == name and self.docs[ext]["paths"][i]["kind"] == summary["kind"]
            ]
            if len(hits) == 1:
                target = hits[0]
        if target is None or target not in self.docs[ext]["index"]:
            return None
        return ext, self.docs[ext]["index"][target]

    def add(self, kind, path):
        self.lines.add((path, kind))

    def walk(self, crate, item, path, seen):
        """Lists `item` (of `crate`) at `path` and everything public below it."""
        key = (crate, item["id"])
        if key in seen:
            return
        seen = seen | {key}
        k = kind_of(item)
        inner = item["inner"][k]
        self.add(KINDS.get(k, k), path)
        if k == "module":
            self.walk_items(crate, inner["items"], path, seen)
        elif k in ("struct", "union"):
            fields = inner.get("fields")
            kind = inner.get("kind")
            if isinstance(kind, dict) and "plain" in kind:
                fields = kind["plain"]["fields"]
            elif isinstance(kind, dict) and "tuple" in kind:
                fields = [f for f in kind["tuple"] if f is not None]
            for f in fields or []:
                self.member(crate, f, path, seen)
            self.impls(crate, inner.get("impls", []), path, seen)
        elif k == "enum":
            for v in inner["variants"]:
                self.member(crate, v, path, seen)
            self.impls(crate, inner.get("impls", []), path, seen)
        elif k == "trait":
            for i in inner["items"]:
                self.member(crate, i, path, seen)
        elif k == "variant":
            kind = inner.get("kind")
            if isinstance(kind, dict) and "struct" in kind:
                for f in kind["struct"]["fields"]:
                    self.member(crate, f, path, seen)

    def member(self, crate, member_id, parent, seen):
        m = self.docs[crate]["index"].get(str(member_id))
        if m is None or m.get("name") is None:
            return
        self.walk(crate, m, parent + "::" + m["name"], seen)

    def impls(self, crate, impl_ids, path, seen):
        for impl_id in impl_ids:
            imp = self.docs[crate]["index"].get(str(impl_id))
            if imp is None:
                continue
            i = imp["inner"]["impl"]
            if i.get("is_synthetic") or i.get("blanket_impl") is not None:
                continue
            if i.get("trait") is None:
                for m in i["items"]:
                    self.member(crate, m, path, seen)
            else:
                t = i["trait"]
                name = t.get("path", t.get("name", "?")).split("::")[-1]
                name += generic_args(t.get("args"))
                neg = "!" if i.get("is_negative") else ""
                self.add("impl", f"{path}: {neg}{name}")

    def walk_items(self, crate, ids, path, seen):
        doc = self.docs[crate]
        for i in ids:
            item = doc["index"].get(str(i))
            if item is None:
                continue
            k = kind_of(item)
            if k == "use":
                u = item["inner"]["use"]
                if u.get("id") is None:
                    continue
                target = self.resolve(crate, u["id"])
                if target is None:
                    # Not documented anywhere we read: list the bare path.
                    self.add("use", path + "::" + u["name"])
                    continue
                tcrate, titem = target
                if u.get("is_glob"):
                    tk = kind_of(titem)
                    if tk == "module":
                        self.walk_items(tcrate, titem["inner"]["module"]["items"], path, seen)
                    elif tk == "enum":
                        for v in titem["inner"]["enum"]["variants"]:
                            self.member(tcrate, v, path, seen)
                    continue
                self.walk(tcrate, titem, path + "::" + u["name"], seen)
            elif k == "impl":
                continue
            elif item.get("name") is not None:
                self.walk(crate, item, path + "::" + item["name"], seen)


def listing(features_on, target_dir):
    docs = {}
    for crate in CRATES:
        feats = ALL_FEATURES[crate] if features_on else None
        docs[crate.replace("-", "_")] = rustdoc_json(crate, feats, target_dir)
    api = Api(docs)
    root = docs["chorus"]
    api.walk("chorus", root["index"][str(root["root"])], "chorus", frozenset())
    return api.lines


def render():
    target_dir = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    target_dir = os.path.join(ROOT, target_dir)
    default = listing(False, target_dir)
    every = listing(True, target_dir)
    out = []
    for path, kind in sorted(every | default):
        tag = "" if (path, kind) in default else " [feature]"
        out.append(f"{kind} {path}{tag}")
    return "\n".join(out) + "\n"


def main():
    text = render()
    arg = sys.argv[1] if len(sys.argv) > 1 else None
    if arg == "--write":
        with open(LISTING, "w") as f:
            f.write(text)
        print(f"{os.path.relpath(LISTING, ROOT)}: {text.count(chr(10))} items")
    elif arg == "--check":
        try:
            with open(LISTING) as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        if old != text:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True), text.splitlines(True),
                    "collectives/public-api.txt", "now",
                )
            )
            print(
                "chorus's public API changed: if that is intended, run "
                "`python3 .ci/public-api.py --write` and commit the listing",
                file=sys.stderr,
            )
            sys.exit(1)
        print(f"public API unchanged: {text.count(chr(10))} items")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
