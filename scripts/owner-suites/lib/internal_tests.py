"""List Ignite tests that reach ignite.distributed internals (no counterpart in a shim).

Usage: python internal_tests.py SUITE_ROOT > internal.tsv

A test function is "internal" when it, or any helper function it reaches by name
(module-level functions of the test modules, including names imported from
tests.ignite.*), does one of:
  * imports from ignite.distributed.comp_models*, or imports a "_"-prefixed name
    from ignite.distributed* (the version flag _torch_version_gt_112 excepted);
  * uses a module-level name bound by such an import;
  * reads a "_"-prefixed attribute through idist (idist._x, idist.Parallel._x);
  * takes the exec_filepath fixture, which runs check_idist_parallel.py (reads
    ignite's _model._init_method).
Fixtures in conftest.py are not followed (they are kept as the owner wrote them).
Output: one line per internal test: "<relpath>::<function>\t<first internal symbol>".
"""

import ast
import os
import sys
from pathlib import Path

ALLOWED_PRIVATE = {"_torch_version_gt_112"}
CHECK_SCRIPT = ("tests.ignite.distributed.check_idist_parallel", "training")


def modname(root, path):
    rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def internal_import(node):
    mod = node.module or ""
    if not mod.startswith("ignite.distributed"):
        return None
    if mod.startswith("ignite.distributed.comp_models"):
        return mod
    for a in node.names:
        if a.name.startswith("_") and a.name not in ALLOWED_PRIVATE:
            return f"{mod}.{a.name}"
    return None


def attr_chain(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def module_bindings(tree):
    """Names bound at module level by internal imports, and names imported from tests.*."""
    internal, imported = {}, {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        reason = internal_import(node)
        for a in node.names:
            if reason:
                internal[a.asname or a.name] = reason
            if (node.module or "").startswith("tests."):
                imported[a.asname or a.name] = (node.module, a.name)
    return internal, imported


def node_reason(n, internal_globals):
    if isinstance(n, ast.ImportFrom):
        return internal_import(n)
    if isinstance(n, ast.Name):
        return internal_globals.get(n.id)
    if isinstance(n, ast.Attribute):
        ch = attr_chain(n)
        if ch and ch[0] == "idist" and any(p.startswith("_") for p in ch[1:]):
            return ".".join(ch)
    return None


def scan_function(fn, mod, top, internal_globals, imported):
    """(first internal symbol or None, set of (module, function) it refers to)."""
    reason, refs = None, set()
    if "exec_filepath" in [a.arg for a in fn.args.args]:
        refs.add(CHECK_SCRIPT)
    for n in ast.walk(fn):
        reason = reason or node_reason(n, internal_globals)
        if isinstance(n, ast.Name):
            if n.id in top and n.id != fn.name:
                refs.add((mod, n.id))
            elif n.id in imported:
                refs.add(imported[n.id])
    return reason, refs


def scan(root):
    funcs = {}  # (module, function) -> (direct reason, refs, relpath)
    for path in sorted(Path(root, "tests").rglob("*.py")):
        if path.name == "conftest.py":
            continue
        mod = modname(root, str(path))
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        internal_globals, imported = module_bindings(tree)
        tops = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        top = {n.name for n in tops}
        for fn in tops:  # nested defs are scanned as part of their parent
            reason, refs = scan_function(fn, mod, top, internal_globals, imported)
            funcs[(mod, fn.name)] = (reason, refs, os.path.relpath(path, root))
    return funcs


def main(root):
    funcs = scan(root)
    memo = {}

    def reach(key, stack=()):
        if key in memo:
            return memo[key]
        if key not in funcs or key in stack:
            return None
        reason, refs, _ = funcs[key]
        for r in sorted(refs):
            if reason:
                break
            sub = reach(r, (*stack, key))
            if sub:
                reason = sub if "(via" in sub else f"{sub} (via {r[1]})"
        memo[key] = reason
        return reason

    for key in sorted(funcs):
        rel = funcs[key][2]
        if key[1].startswith("test") and os.path.basename(rel).startswith("test_"):
            r = reach(key)
            if r:
                print(f"{rel}::{key[1]}\t{r}")


if __name__ == "__main__":
    main(sys.argv[1])
