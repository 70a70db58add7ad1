"""Check a vLLM release's source against tuned's list of vLLM internals
(:data:`tuned.engines.vllm_surface.INTERNALS`), without importing vLLM.

:func:`check` reads the source of a wheel (``.whl``), a folder holding the ``vllm``
package (site-packages, an unpacked wheel) or the package folder itself, parses the
modules it needs with :mod:`ast` and returns one :class:`Finding` per internal:
``present`` (as tuned expects it), ``changed`` (there, but not as tuned expects: a
method's parameters differ, a method became a property, a required field was
added, a name tuned adds now exists in vLLM) or ``missing``. :func:`report` is the
JSON form kept in ``docs/vllm-surface/``; ``tools/vllm_surface.py`` is the command.

What is read, statically: classes with their vLLM bases (followed through imports,
in depth-first order), ``def``s and their decorators, class-level names, ``self.X``
assignments in ``__init__`` (and in the methods ``__init__`` calls on ``self``). What
is not: code that builds names at run time (``setattr``, ``__getattr__``), which a
release could use to keep a name that this check then reports missing.
"""

from __future__ import annotations

import ast
import os
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from tuned.engines.vllm_surface import INTERNALS, KINDS, Internal

STATUSES = ("present", "changed", "missing")


class SurfaceSourceError(ValueError):
    """The path given holds no vLLM source."""


@dataclass(frozen=True)
class Finding:
    kind: str
    name: str
    expect: str
    use: str
    status: str
    found: str = ""       # where it was found / what it is there
    detail: str = ""      # why it is changed or missing

    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.name, self.expect)


# --------------------------------------------------------------------- the source
class Source:
    """The ``vllm`` package's ``.py`` files in a wheel or a folder, read on demand."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        self.label = p.name
        self._zip: zipfile.ZipFile | None = None
        if p.is_file():
            try:
                self._zip = zipfile.ZipFile(p)
            except zipfile.BadZipFile:
                raise SurfaceSourceError(f"{path}: not a wheel (a zip file) nor a folder") from None
            self._files = {n[len("vllm/"):] for n in self._zip.namelist()
                           if n.startswith("vllm/") and n.endswith(".py")}
        elif p.is_dir():
            pkg = p / "vllm" if (p / "vllm" / "__init__.py").is_file() else p
            if not (pkg / "__init__.py").is_file() or pkg.name != "vllm":
                raise SurfaceSourceError(f"{path}: no vllm package here (expected "
                                         f"{p / 'vllm' / '__init__.py'})")
            self._root = pkg
            self._files = {str(f.relative_to(pkg)).replace(os.sep, "/")
                           for f in pkg.rglob("*.py")}
        else:
            raise SurfaceSourceError(f"{path}: no such file or folder")
        if "__init__.py" not in self._files:
            raise SurfaceSourceError(f"{path}: no vllm/__init__.py in it")
        self._trees: dict[str, ast.Module | None] = {}
        self._texts: dict[str, str] = {}

    def text(self, rel: str) -> str:
        if rel not in self._texts:
            if self._zip is not None:
                raw = self._zip.read("vllm/" + rel)
            else:
                raw = (self._root / rel).read_bytes()
            self._texts[rel] = raw.decode("utf-8", errors="replace")
        return self._texts[rel]

    def files(self, module: str = "vllm") -> list[str]:
        """The files of a module or package (``vllm.entrypoints``), sorted."""
        sub = module.split(".")[1:]
        if not sub:
            return sorted(self._files)
        prefix = "/".join(sub)
        return sorted(f for f in self._files
                      if f == prefix + ".py" or f.startswith(prefix + "/"))

    def module_file(self, module: str) -> str | None:
        sub = module.split(".")[1:]
        if not sub:
            return "__init__.py"
        base = "/".join(sub)
        for rel in (base + ".py", base + "/__init__.py"):
            if rel in self._files:
                return rel
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            rel = self.module_file(module)
            try:
                self._trees[module] = ast.parse(self.text(rel), rel) if rel else None
            except SyntaxError:
                self._trees[module] = None
        return self._trees[module]

    def version(self) -> str | None:
        """``vllm/_version.py``'s ``__version__``."""
        tree = self.tree("vllm._version")
        for node in (tree.body if tree else ()):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                    return str(node.value.value)
        return None


# --------------------------------------------------------------------- definitions
@dataclass(frozen=True)
class Definition:
    what: str            # "class" | "function" | "name" | "module"
    module: str
    qualname: str
    node: ast.AST | None = None


def _module_of(rel: str) -> str:
    """``v1/engine/__init__.py`` -> ``vllm.v1.engine``."""
    return ("vllm." + rel[:-3].replace("/", ".")).removesuffix(".__init__")


def _top_level(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements at module level, including those under ``if``/``try``."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for h in node.handlers:
                yield from _top_level(h.body)
        else:
            yield node


def _import_base(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{node.module}" if node.module else base


class Index:
    """Names, classes and members of the vLLM source, resolved across imports."""

    def __init__(self, source: Source) -> None:
        self.src = source
        self._class_cache: dict[str, list[Definition]] = {}

    def lookup(self, module: str, name: str, depth: int = 0) -> Definition | None:
        """What ``name`` is in ``module`` (following ``from X import name``)."""
        if depth > 12:
            return None
        tree = self.src.tree(module)
        if tree is None:
            return None
        found: Definition | None = None
        rel = self.src.module_file(module) or ""
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                found = Definition("class", module, name, node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = Definition("function", module, name, node)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = Definition("name", module, name, node)
            elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                  and node.target.id == name and node.value is not None):
                found = Definition("name", module, name, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) != name:
                        continue
                    base = _import_base(module, node, rel.endswith("__init__.py"))
                    if not base.startswith("vllm"):
                        found = Definition("name", module, name, node)
                        continue
                    sub = f"{base}.{alias.name}"
                    got = self.lookup(base, alias.name, depth + 1)
                    if got is None and self.src.module_file(sub):
                        got = Definition("module", sub, "")
                    found = got or Definition("name", module, name, node)
        if found is None and self.src.module_file(f"{module}.{name}"):
            found = Definition("module", f"{module}.{name}", "")
        return found

    def find_classes(self, name: str) -> list[Definition]:
        """Every class called ``name`` anywhere in the package (by its source)."""
        if name not in self._class_cache:
            out = []
            needle = f"class {name}"
            for rel in self.src.files():
                if needle not in self.src.text(rel):
                    continue
                module = _module_of(rel)
                tree = self.src.tree(module)
                for node in _top_level(tree.body if tree else ()):
                    if isinstance(node, ast.ClassDef) and node.name == name:
                        out.append(Definition("class", module, name, node))
            self._class_cache[name] = out
        return self._class_cache[name]

    def resolve_class(self, module: str, name: str) -> Definition | None:
        d = self.lookup(module, name)
        return d if d is not None and d.what == "class" else None

    def bases(self, cls: Definition) -> list[Definition]:
        """The class's bases defined in vLLM (others -- ABC, deque, msgspec.Struct --
        are left out)."""
        out = []
        for b in cls.node.bases:          # type: ignore[union-attr]
            if isinstance(b, ast.Subscript):
                b = b.value
            d = None
            if isinstance(b, ast.Name):
                d = self.resolve_class(cls.module, b.id)
            elif isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name):
                mod = self.lookup(cls.module, b.value.id)
                if mod is not None and mod.what == "module":
                    d = self.resolve_class(mod.module, b.attr)
            if d is not None:
                out.append(d)
        return out

    def mro(self, cls: Definition) -> list[Definition]:
        out: list[Definition] = []
        seen: set[tuple[str, str]] = set()

        def walk(c: Definition) -> None:
            k = (c.module, c.qualname)
            if k in seen:
                return
            seen.add(k)
            out.append(c)
            for b in self.bases(c):
                walk(b)
        walk(cls)
        return out


# --------------------------------------------------------------------- members
def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]


def _member_kind(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    decs = _decorators(fn)
    last = {d.split(".")[-1] for d in decs}
    if last & {"property", "cached_property", "setter", "getter", "deleter"}:
        return "property"
    if "staticmethod" in last:
        return "staticmethod"
    if "classmethod" in last:
        return "classmethod"
    return "method"


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The parameters by name: ``=`` marks a default, ``*``/``/`` as written."""
    a = fn.args
    params: list[str] = []
    pos = list(a.posonlyargs) + list(a.args)
    first_default = len(pos) - len(a.defaults)
    for i, p in enumerate(pos):
        params.append(p.arg + ("=" if i >= first_default else ""))
        if a.posonlyargs and i == len(a.posonlyargs) - 1:
            params.append("/")
    if a.vararg is not None:
        params.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        params.append("*")
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(p.arg + ("=" if d is not None else ""))
    if a.kwarg is not None:
        params.append("**" + a.kwarg.arg)
    return ", ".join(params)


def _self_targets(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "self":
        yield node.attr
    elif isinstance(node, (ast.Tuple, ast.List)):
        for e in node.elts:
            yield from _self_targets(e)


def _assigned_on_self(fn: ast.AST) -> Iterator[str]:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                yield from _self_targets(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            yield from _self_targets(node.target)


def _self_calls(fn: ast.AST) -> Iterator[str]:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
            yield node.func.attr


@dataclass(frozen=True)
class Member:
    kind: str            # method | property | staticmethod | classmethod | field | attribute
    owner: str           # module:Class
    node: ast.AST | None = None
    has_default: bool = True
    abstract: bool = False


class Members:
    """The members of one class with its vLLM bases, the first definition winning."""

    def __init__(self, index: Index, cls: Definition) -> None:
        self.classes = index.mro(cls)
        self.defined: dict[str, Member] = {}
        functions: dict[str, tuple[ast.AST, str]] = {}
        for c in self.classes:
            owner = f"{c.module}:{c.qualname}"
            for node in c.node.body:      # type: ignore[union-attr]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions.setdefault(node.name, (node, owner))
                    if node.name not in self.defined:
                        abstract = any(d.split(".")[-1] == "abstractmethod"
                                       for d in _decorators(node))
                        self.defined[node.name] = Member(_member_kind(node), owner, node,
                                                         abstract=abstract)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    ann = ast.unparse(node.annotation)
                    if "ClassVar" in ann:
                        continue
                    self.defined.setdefault(node.target.id, Member(
                        "field", owner, node, has_default=node.value is not None))
                elif isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            self.defined.setdefault(t.id, Member("field", owner, node))
        # instance attributes: __init__ of each class, and what it calls on self
        self.instance: dict[str, str] = {}
        for c in self.classes:
            owner = f"{c.module}:{c.qualname}"
            init = next((n for n in c.node.body              # type: ignore[union-attr]
                         if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None:
                continue
            todo, done = [init], set()
            while todo:
                fn = todo.pop()
                if id(fn) in done:
                    continue
                done.add(id(fn))
                for attr in _assigned_on_self(fn):
                    self.instance.setdefault(attr, owner)
                for called in _self_calls(fn):
                    if called in functions and called != "__init__":
                        todo.append(functions[called][0])
        # every self.X assigned anywhere (for names tuned must not claim)
        self.anywhere: dict[str, str] = {}
        for c in self.classes:
            owner = f"{c.module}:{c.qualname}"
            for node in c.node.body:      # type: ignore[union-attr]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for attr in _assigned_on_self(node):
                        self.anywhere.setdefault(attr, owner)

    def kind_of(self, name: str) -> tuple[str, str] | None:
        """(kind, owner) of ``name``: a class-level definition first (a property or
        method shadows an instance attribute of the same name), then ``__init__``'s."""
        m = self.defined.get(name)
        if m is not None and (m.kind != "field" or name not in self.instance):
            return m.kind, m.owner
        if name in self.instance:
            return "attribute", self.instance[name]
        return None


# --------------------------------------------------------------------- the check
def _split(name: str) -> tuple[str, list[str]]:
    module, _, qual = name.partition(":")
    return module, qual.split(".") if qual else []


class Checker:
    def __init__(self, source: Source) -> None:
        self.src = source
        self.index = Index(source)
        self._members: dict[tuple[str, str], Members] = {}

    def members(self, cls: Definition) -> Members:
        k = (cls.module, cls.qualname)
        if k not in self._members:
            self._members[k] = Members(self.index, cls)
        return self._members[k]

    def _class(self, module: str, name: str) -> tuple[Definition | None, str]:
        """The class, or None and why not (with where a class of that name is now)."""
        if module == "*":
            found = self.index.find_classes(name)
            return (found[0], "") if found else (None, f"no class {name} in vLLM")
        if self.src.module_file(module) is None:
            why = f"no module {module}"
        else:
            d = self.index.lookup(module, name)
            if d is not None and d.what == "class":
                return d, ""
            why = (f"{module}.{name} is a {d.what}, not a class" if d is not None
                   else f"no {name} in {module}")
        elsewhere = [f"{c.module}" for c in self.index.find_classes(name)]
        if elsewhere:
            why += f"; a class {name} is defined in {', '.join(sorted(set(elsewhere)))}"
        return None, why

    def check_one(self, it: Internal) -> Finding:
        def out(status: str, found: str = "", detail: str = "") -> Finding:
            return Finding(it.kind, it.name, it.expect, it.use, status, found, detail)

        module, qual = _split(it.name)
        if it.kind == "module":
            return out("present", self.src.module_file(module) or "") \
                if self.src.module_file(module) else out("missing", detail=f"no module {module}")
        if it.kind == "literal":
            for rel in self.src.files(module):
                if it.expect in self.src.text(rel) and self._has_literal(rel, it.expect):
                    return out("present", "vllm/" + rel)
            return out("missing", detail=f"no string {it.expect!r} in {module}")
        if it.kind == "calls":
            return self._check_calls(it, module, qual, out)
        if it.kind == "routes":
            return self._check_routes(it, module, out)
        if it.kind == "name":
            if self.src.module_file(module) is None:
                return out("missing", detail=f"no module {module}")
            d = self.index.lookup(module, qual[0])
            return out("present", f"{d.module}:{d.qualname}" if d.qualname else d.module) \
                if d is not None else out("missing", detail=f"no {qual[0]} in {module}")
        cls, why = self._class(module, qual[0])
        if cls is None:
            return out("missing", detail=why)
        where = f"{cls.module}:{cls.qualname}"
        members = self.members(cls)
        if it.kind == "class":
            if not it.expect:
                return out("present", where)
            names = {ast.unparse(b.value if isinstance(b, ast.Subscript) else b).split(".")[-1]
                     for b in cls.node.bases}           # type: ignore[union-attr]
            lost = [b.strip() for b in it.expect.split(",") if b.strip() not in names]
            return out("changed", where, f"bases are now {', '.join(sorted(names))}; "
                       f"no longer {', '.join(lost)}") if lost else out("present", where)
        if it.kind == "abstract":
            got = sorted(n for n, m in members.defined.items() if m.abstract)
            want = sorted(it.expect.split())
            if got == want:
                return out("present", where)
            added, gone = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            return out("changed", where, "; ".join(
                p for p in (f"new abstract: {', '.join(added)}" if added else "",
                            f"no longer abstract: {', '.join(gone)}" if gone else "") if p))
        if it.kind == "unclaimed":
            taken = []
            for n in it.expect.split():
                k = members.kind_of(n)
                if k is None and n in members.anywhere:
                    k = ("attribute", members.anywhere[n])
                if k is not None:
                    taken.append(f"{n} ({k[0]} of {k[1]})")
            return out("changed", where, "vLLM now defines " + ", ".join(taken)) if taken \
                else out("present", where)
        if it.kind == "flag":
            field = it.expect.lstrip("-").replace("-", "_")
            k = members.kind_of(field)
            return out("present", f"{where}.{field}") if k is not None and k[0] == "field" \
                else out("missing", detail=f"no field {field} in {where} or its bases")
        if it.kind == "constructor":
            return self._check_constructor(it, where, members, out)
        # method, property, attribute, field
        member = qual[1]
        k = members.kind_of(member)
        if k is None:
            return out("missing", detail=f"no {member} in {where} or its vLLM bases")
        kind, owner = k
        found = f"{owner}.{member}"
        if kind != it.kind:
            return out("changed", found, f"now a {kind} (tuned expects: {it.kind})")
        if kind == "method" and it.expect:
            got = signature(members.defined[member].node)   # type: ignore[arg-type]
            if got != it.expect:
                return out("changed", found, f"parameters ({got}), expected ({it.expect})")
        return out("present", found)

    def _has_literal(self, rel: str, text: str) -> bool:
        tree = self.src.tree(_module_of(rel))
        return tree is not None and any(
            isinstance(n, ast.Constant) and isinstance(n.value, str) and text in n.value
            for n in ast.walk(tree))

    def _check_calls(self, it: Internal, module: str, qual: list[str], out) -> Finding:
        receivers = set(it.name.partition(":")[2].split("|"))
        files = self.src.files(module)
        if not files:
            return out("missing", detail=f"no module {module}")
        got: set[str] = set()
        for rel in files:
            tree = self.src.tree(_module_of(rel))
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.Attribute) and ast.unparse(node.value) in receivers:
                    got.add(node.attr)
        want = set(it.expect.split())
        if got == want:
            return out("present", module)
        added, gone = sorted(got - want), sorted(want - got)
        return out("changed", module, "; ".join(
            p for p in (f"now also calls {', '.join(added)}" if added else "",
                        f"no longer calls {', '.join(gone)}" if gone else "") if p))

    def post_routes(self, module: str) -> set[str]:
        """The POST routes declared in the package: ``.post("/x")`` and
        ``.api_route("/x")`` calls (decorators of vLLM's routers)."""
        got: set[str] = set()
        for rel in self.src.files(module):
            if ".post(" not in (text := self.src.text(rel)) and ".api_route(" not in text:
                continue
            tree = self.src.tree(_module_of(rel))
            for node in ast.walk(tree) if tree is not None else ():
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("post", "api_route") and node.args
                        and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)
                        and node.args[0].value.startswith("/")):
                    got.add(node.args[0].value)
        return got

    def _check_routes(self, it: Internal, module: str, out) -> Finding:
        if not self.src.files(module):
            return out("missing", detail=f"no module {module}")
        got, known = self.post_routes(module), set(it.expect.split())
        absent = sorted(known - got)
        found = f"{len(got)} POST routes" + (f"; not in this release: {', '.join(absent)}"
                                             if absent else "")
        new = sorted(got - known)
        return out("changed", found, "new POST routes, not sorted into QUEUED_ROUTES or "
                   f"UNQUEUED_ROUTES: {', '.join(new)}") if new else out("present", found)

    def _check_constructor(self, it: Internal, where: str, members: Members, out) -> Finding:
        fields = {n: m for n, m in members.defined.items() if m.kind == "field"}
        passed = it.expect.split()
        unknown = [n for n in passed if n not in fields]
        required = [n for n, m in fields.items() if not m.has_default and n not in passed]
        problems = []
        if unknown:
            problems.append(f"no field {', '.join(unknown)}")
        if required:
            problems.append(f"now requires {', '.join(required)}")
        return out("changed", where, "; ".join(problems)) if problems else out("present", where)


def check(path: str | os.PathLike[str],
          internals: Iterable[Internal] = INTERNALS) -> tuple[str | None, list[Finding]]:
    """(vLLM's version, one :class:`Finding` per internal) for the source at ``path``:
    a ``.whl``, a folder holding ``vllm/``, or the ``vllm`` package folder.
    :class:`SurfaceSourceError` when there is no vLLM source there."""
    src = Source(path)
    checker = Checker(src)
    findings = []
    for it in internals:
        if it.kind not in KINDS:
            raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {it.kind!r}")
        findings.append(checker.check_one(it))
    return src.version(), findings


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    c = {s: 0 for s in STATUSES}
    for f in findings:
        c[f.status] += 1
    return c


def report(version: str | None, source_label: str, findings: list[Finding]) -> dict:
    """The report kept in ``docs/vllm-surface/VERSION.json`` (no time stamp: the
    same source gives the same file)."""
    return {"vllm_version": version, "source": source_label, "counts": counts(findings),
            "internals": [asdict(f) for f in findings]}


def surface_keys(internals: Iterable[Internal] = INTERNALS) -> list[list[str]]:
    """What a report must list, in order: each internal's kind, name, expect and use."""
    return [[i.kind, i.name, i.expect, i.use] for i in internals]


def report_keys(rep: dict) -> list[list[str]]:
    return [[d["kind"], d["name"], d["expect"], d["use"]] for d in rep["internals"]]


def table(findings: Iterable[Finding]) -> str:
    """One line per internal: status, kind, name, then what is expected or wrong."""
    rows = []
    for f in findings:
        what = f.expect if f.kind in ("flag", "literal") else ""
        note = f.detail or (f"({f.expect})" if f.kind == "method" and f.expect else what)
        rows.append((f.status, f.kind, f.name if f.kind not in ("flag", "literal")
                     else f"{f.name} {f.expect}", note if f.status != "present" else
                     (note if f.kind in ("method",) else "")))
    w0 = max((len(r[0]) for r in rows), default=7)
    w1 = max((len(r[1]) for r in rows), default=4)
    w2 = max((len(r[2]) for r in rows), default=4)
    lines = [f"{'status':{w0}}  {'kind':{w1}}  {'internal':{w2}}  note"]
    for r in rows:
        lines.append(f"{r[0]:{w0}}  {r[1]:{w1}}  {r[2]:{w2}}  {r[3]}".rstrip())
    return "\n".join(lines)
