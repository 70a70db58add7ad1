"""The imports import-linter cannot see, checked against the same contracts.

import-linter reads ``import`` statements. tuned also loads modules by name: the
policy registry's ``"module:Class"`` table and the command list go through
:func:`importlib.import_module`. Every string constant of the package that names one
of its own modules (``"tuned.policies.fcfs"`` or ``"tuned.policies.fcfs:FCFSPolicy"``)
is taken here as an import by the module that holds it, and the whole graph, static
and dynamic edges together, is checked against every layers contract of
``pyproject.toml`` and for circles inside every package. The policy registry also
imports every module that declares a policy (``POLICY``), found by the catalog rather
than named: those loads are added as edges too.

Run as ``python tests/import_graph.py ROOT`` (ROOT holds ``pyproject.toml`` and
``tuned/``, and is put first on ``sys.path``): prints one line per problem, exit 1 if
any. ``tests/package/test_layers.py`` runs it on the repository and on planted copies.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

NAMED_MODULE = re.compile(r"^(tuned(?:\.[A-Za-z_]\w*)+)(?::[A-Za-z_]\w*)?$")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


LOADERS = {"import_module", "find_spec", "__import__"}
LOGGERS = {"get_logger", "getLogger"}


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def dynamic_imports(root: Path, modules: set[str]) -> set[tuple[str, str]]:
    """(holder, named module) for the string constants of ``root/tuned`` that name a
    module of ``modules``: a ``"module:attr"`` string anywhere, and a bare module name
    in a module that loads modules by name (calls ``import_module``, ``find_spec`` or
    ``__import__``), a logger's name aside."""
    edges = set()
    for path in sorted((root / "tuned").rglob("*.py")):
        holder = _module_name(root, path)
        tree = ast.parse(path.read_text(), str(path))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        loads = any(_call_name(c) in LOADERS for c in calls)
        logger_names = {id(a) for c in calls if _call_name(c) in LOGGERS for a in c.args}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            m = NAMED_MODULE.match(node.value)
            if not m or m.group(1) not in modules or m.group(1) == holder:
                continue
            if ":" in node.value or (loads and id(node) not in logger_names):
                edges.add((holder, m.group(1)))
    return edges


#: the module that imports, by name, every module declaring a policy (POLICY or POLICIES
#: at top level), as tuned.policies.catalog lists them: no string names them
POLICY_LOADER = "tuned.policies.registry"


def declared_policy_loads(root: Path, modules: set[str]) -> set[tuple[str, str]]:
    """(registry, module) for each module of ``tuned.policies`` that declares a policy:
    the registry finds them through the catalog and imports them by name."""
    edges = set()
    for path in sorted((root / "tuned" / "policies").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {t.id for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
        module = _module_name(root, path)
        if names & {"POLICY", "POLICIES"} and module in modules and POLICY_LOADER in modules:
            edges.add((POLICY_LOADER, module))
    return edges


def _layer(spec: str, grimp):
    independent = "|" in spec or ":" not in spec
    names = [n.strip() for n in re.split(r"[|:]", spec)]
    return grimp.Layer(*names, independent=independent)


def problems(root: Path) -> list[str]:
    sys.path.insert(0, str(root))
    import grimp

    graph = grimp.build_graph("tuned", exclude_type_checking_imports=True)
    modules = set(graph.modules)
    dynamic = dynamic_imports(root, modules) | declared_policy_loads(root, modules)
    for importer, imported in dynamic:
        graph.add_import(importer=importer, imported=imported)
    out = []
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    for c in contracts["contracts"]:
        if c["type"] != "layers":
            continue
        layers = [_layer(spec, grimp) for spec in c["layers"]]
        for dep in graph.find_illegal_dependencies_for_layers(
                layers=layers, containers=set(c["containers"])):
            for route in dep.routes:
                for head in route.heads:
                    for tail in route.tails:
                        how = "importlib" if (head, tail) in dynamic else "import"
                        out.append(f"{c['name']}: {head} -> {tail} ({how}, from "
                                   f"{dep.importer} up to {dep.imported})")
    for package in sorted(m for m in modules if graph.find_children(m)):
        for importer, imported in sorted(graph.nominate_cycle_breakers(package)):
            out.append(f"circle inside {package}: {importer} -> {imported} closes it")
    return sorted(set(out))


if __name__ == "__main__":
    found = problems(Path(sys.argv[1]).resolve())
    print("\n".join(found) if found else "no upward or circular import, importlib included")
    sys.exit(1 if found else 0)
