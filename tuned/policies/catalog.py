"""What tuned knows about its policies without running their code: every policy's
name, kind, one-line summary, options (type, default, range), the reasons it emits
with their operator-facing text, and the runs the bench makes of it.

A policy is one module. Besides its code, the module declares itself in a top-level
``POLICY`` (or ``POLICIES``, a list of them) made of plain literals -- dicts, lists,
strings, numbers, booleans, and names of other top-level literal constants of the same
module -- so that this catalog can read it from the module's source without importing
the module. :mod:`tuned.config` validates ``batch_policy``, ``batch_options``,
``queue_policy`` and ``queue_options`` against these declarations, and
``tuned check-config --explain`` prints them, without loading any policy code;
:mod:`tuned.policies.registry` imports a module only to build its policy.

The declaration's keys::

    name     the value of batch_policy / queue_policy that selects it
    kind     "batch" (decide(observation) -> Decision) or "queue" (a QueuePolicy)
    build    the name in the module to call: for a batch policy a callable taking
             cfg, ceiling, max_num_batched_tokens, block_size, profile and options
             (keywords), returning the policy or (policy, first_reason); for a
             queue policy the QueuePolicy subclass
    summary  one line: what it is (config docs, help texts)
    order    where it is listed among its kind (default 100, then by name)
    options  {option: {type: int|float|bool|str, default, doc, lo, hi, lo_open,
             hi_open, choices, also (values accepted besides the range),
             at_most (another option it may not exceed)}}: batch_options or
             queue_options
    reasons  {reason: text}: the Decision reasons it emits, as `tuned status` explains
             them
    bench    [{name, kind: peer|tuned, config: {key: value}, quick (default: true
             for a peer, false for tuned)}]: the runs `tuned bench` adds
    token_budget  batch: wrapped in the SLA token budget when token_budget_policy =
             "sla" (default true)
    budget_sla    batch: that budget holds the TBT SLA (default true; false: the
             full budget whatever the SLA, as for the memory bound alone)
    step_fit batch: reads the controller's online step model when an SLA is set
             (default false)

Built-in policies are the modules of the ``tuned.policies`` package that declare one;
third-party ones are modules named by the entry-point group ``tuned.policies``
(``[project.entry-points."tuned.policies"] mine = "mypkg.mypolicy"``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuned.base.inputs import clip, clip_text

#: the entry-point group third-party policies register under
ENTRY_POINT_GROUP = "tuned.policies"
KINDS = ("batch", "queue")
#: what Pang et al.'s SLA search may hold to the TPOT SLO (config ``sla_statistic``):
#: the mean decode step, its 90th percentile, the mean at a margin learnt for
#: attainment (:class:`tuned.policies.sla_bound.AttainmentMargin`), or the decode-only
#: steps' 90th percentile plus the prefill's share of the mean step; ``auto`` is
#: ``p90`` while the token budget sizes prefill chunks for the SLA, ``decode_p90``
#: while it does not (:meth:`tuned.policies.sla_bound.EvidenceSlaBound.held`)
SLA_STATISTICS = ("auto", "mean", "p90", "attainment", "decode_p90")
OPTION_TYPES = ("int", "float", "bool", "str")


class CatalogError(ValueError):
    """A policy declaration that cannot be read (names the module and the key)."""


@dataclass(frozen=True)
class Option:
    name: str
    type: str
    default: Any
    doc: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple | None = None
    also: tuple = ()
    at_most: str | None = None

    def allowed(self) -> str:
        """The allowed values in words: 'an integer in [1, 64]', 'one of a, b'."""
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        kind = {"int": "an integer", "float": "a number", "bool": "true or false",
                "str": "a string"}[self.type]
        if self.lo is not None and self.hi is not None:
            rng = (f" in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}"
                   f"{')' if self.hi_open else ']'}")
        elif self.lo is not None:
            rng = f" {'>' if self.lo_open else '>='} {_num(self.lo)}"
        elif self.hi is not None:
            rng = f" {'<' if self.hi_open else '<='} {_num(self.hi)}"
        else:
            rng = ""
        if self.at_most:
            rng += f" and <= {self.at_most}"
        also = "".join(f" or {v!r}" if isinstance(v, str) else f" or {v}" for v in self.also)
        return kind + rng + also

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed ('must be ...'), None when it is."""
        if value in self.also and not isinstance(value, bool):
            return None
        ok = True
        if self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type == "str":
            ok = isinstance(value, str)
        elif isinstance(value, bool) or not isinstance(
                value, int if self.type == "int" else (int, float)):
            ok = False
        elif not _finite(value):
            ok = False
        else:
            v = float(value)
            if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
                ok = False
            if self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)):
                ok = False
        if ok and self.choices and value not in self.choices:
            ok = False
        return None if ok else f"must be {self.allowed()}"


@dataclass(frozen=True)
class BenchRun:
    name: str
    kind: str                    # "peer" or "tuned"
    config: Mapping[str, Any]    # config keys changed from the bench's base config
    quick: bool                  # also in a --quick bench


@dataclass(frozen=True)
class PolicySpec:
    name: str
    kind: str
    module: str
    build: str
    summary: str
    order: int = 100
    options: tuple[Option, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    bench: tuple[BenchRun, ...] = ()
    token_budget: bool = True
    budget_sla: bool = True
    step_fit: bool = False
    source: str = "tuned"        # "tuned" (built in) or the entry point's name

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def option_problems(self, options: Mapping[str, Any], where: str) -> list[str]:
        """One line per bad option of ``options`` (``where`` is the config table,
        e.g. ``queue_options``): an unknown key, a value out of its range."""
        problems = []
        for key, value in options.items():
            opt = self.option(key)
            if opt is None:
                known = ", ".join(self.option_names) or "none"
                problems.append(f"{where}.{clip_text(str(key))}: must be an option of "
                                f"{self.kind}_policy {self.name} ({known}), got an unknown "
                                f"key")
                continue
            why = opt.problem(value)
            if why:
                problems.append(f"{where}.{clip_text(str(key))}: {why}, got {_clip(value)}")
        if problems:
            return problems
        for opt in self.options:     # a bound on another option, both at their values
            top = self.option(opt.at_most) if opt.at_most else None
            if top is None or not (opt.name in options or top.name in options):
                continue
            value = options.get(opt.name, opt.default)
            other = options.get(top.name, top.default)
            if value > other:
                if opt.name in options:
                    problems.append(f"{where}.{opt.name}: must be {opt.allowed()} "
                                    f"({_num(other)}), got {_clip(value)}")
                else:
                    problems.append(f"{where}.{top.name}: must be >= {opt.name} "
                                    f"({_num(value)}), got {_clip(other)}")
        return problems

    def with_defaults(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**{o.name: o.default for o in self.options}, **dict(options)}


def _num(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _clip(v: Any) -> str:
    return clip(v)


# ------------------------------------------------------------------ reading a module

def _literals(tree: ast.Module) -> dict[str, ast.expr]:
    """Top-level ``NAME = <expr>`` assignments (the last one wins)."""
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            out[node.target.id] = node.value
    return out


class _Inline(ast.NodeTransformer):
    """Replace names of top-level constants by their (literal) values."""

    def __init__(self, env: dict[str, ast.expr], module: str) -> None:
        self.env, self.module, self.depth = env, module, 0

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in self.env or self.depth > 8:
            raise CatalogError(f"{self.module}: POLICY must hold plain literals; "
                               f"{node.id!r} is not a top-level constant of the module")
        self.depth += 1
        try:
            return self.visit(_copy(self.env[node.id]))
        finally:
            self.depth -= 1


def _copy(node: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(node), mode="eval").body


def read_declarations(source: str, module: str) -> list[dict]:
    """The ``POLICY`` / ``POLICIES`` declarations of a module's source, as plain data
    (nothing of the module runs); [] when it declares none."""
    tree = ast.parse(source, module)
    env = _literals(tree)
    found = []
    for key in ("POLICY", "POLICIES"):
        if key not in env:
            continue
        try:
            value = ast.literal_eval(_Inline(env, module).visit(_copy(env[key])))
        except CatalogError:
            raise
        except (ValueError, TypeError, SyntaxError) as e:
            raise CatalogError(f"{module}: {key} must hold plain literals (dicts, lists, "
                               f"strings, numbers): {e}") from None
        found += [value] if key == "POLICY" else list(value)
    return found


def _spec(d: Any, module: str, source: str) -> PolicySpec:
    where = f"{module}: POLICY"
    if not isinstance(d, dict):
        raise CatalogError(f"{where} must be a dict, got {type(d).__name__}")
    for key in ("name", "kind", "build", "summary"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise CatalogError(f"{where}: {key} must be a non-empty string")
    if d["kind"] not in KINDS:
        raise CatalogError(f"{where}: kind must be one of {', '.join(KINDS)}, "
                           f"got {d['kind']!r}")
    unknown = set(d) - {"name", "kind", "build", "summary", "order", "options", "reasons",
                        "bench", "token_budget", "budget_sla", "step_fit"}
    if unknown:
        raise CatalogError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    options = []
    for name, o in (d.get("options") or {}).items():
        if not isinstance(o, dict) or o.get("type") not in OPTION_TYPES or "default" not in o:
            raise CatalogError(f"{where}: options.{name} must be a dict with a type "
                               f"({', '.join(OPTION_TYPES)}) and a default")
        opt = Option(name=name, type=o["type"], default=o["default"], doc=o.get("doc", ""),
                     lo=o.get("lo"), hi=o.get("hi"), lo_open=bool(o.get("lo_open")),
                     hi_open=bool(o.get("hi_open")),
                     choices=tuple(o["choices"]) if o.get("choices") else None,
                     also=tuple(o.get("also") or ()), at_most=o.get("at_most"))
        if opt.problem(opt.default) is not None:
            raise CatalogError(f"{where}: options.{name}'s default {opt.default!r} "
                               f"{opt.problem(opt.default)}")
        options.append(opt)
    runs = []
    for r in d.get("bench") or ():
        if not isinstance(r, dict) or r.get("kind") not in ("peer", "tuned") \
                or not isinstance(r.get("name"), str) or not isinstance(r.get("config"), dict):
            raise CatalogError(f"{where}: each bench run must be a dict with a name, a kind "
                               f"(peer or tuned) and a config table")
        runs.append(BenchRun(r["name"], r["kind"], dict(r["config"]),
                             bool(r.get("quick", r["kind"] == "peer"))))
    return PolicySpec(name=d["name"], kind=d["kind"], module=module, build=d["build"],
                      summary=d["summary"], order=int(d.get("order", 100)),
                      options=tuple(options), reasons=dict(d.get("reasons") or {}),
                      bench=tuple(runs), token_budget=bool(d.get("token_budget", True)),
                      budget_sla=bool(d.get("budget_sla", True)),
                      step_fit=bool(d.get("step_fit", False)), source=source)


def _module_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise CatalogError(f"{module}: not found as a Python source file")
    return Path(spec.origin).read_text(encoding="utf-8")


def _builtin_modules() -> list[tuple[str, Path]]:
    """(module, source file) of the package's modules, read as files: nothing imported."""
    here = Path(__file__).parent
    return [(f"tuned.policies.{m.name}", here / f"{m.name}.py")
            for m in pkgutil.iter_modules([str(here)])
            if not m.ispkg and m.name != "catalog"]


def _entry_point_modules() -> list[tuple[str, str]]:
    """(entry-point name, module) of the third-party policies installed."""
    from importlib.metadata import entry_points

    return [(ep.name, ep.value.partition(":")[0].strip())
            for ep in entry_points(group=ENTRY_POINT_GROUP)]


@functools.lru_cache(maxsize=1)
def _read() -> tuple[tuple[PolicySpec, ...], tuple[str, ...]]:
    found: list[PolicySpec] = []
    for module, path in _builtin_modules():     # a bad built-in one is tuned's bug: raise
        found += [_spec(d, module, "tuned")
                  for d in read_declarations(path.read_text(encoding="utf-8"), module)]
    seen = {(s.kind, s.name): s.module for s in found}
    skipped: list[str] = []
    for ep_name, module in _entry_point_modules():
        # a third-party declaration that cannot be read is left out and named, so that
        # one broken package does not make every config invalid
        try:
            specs_ = [_spec(d, module, ep_name)
                      for d in read_declarations(_module_source(module), module)]
        except (CatalogError, OSError, SyntaxError, UnicodeDecodeError, ImportError) as e:
            skipped.append(clip_text(f"{ep_name} ({module}): {e}", 240))
            continue
        for s in specs_:
            if (s.kind, s.name) in seen:
                skipped.append(f"{ep_name} ({module}): {s.kind} policy {s.name!r} is "
                               f"already declared by {seen[s.kind, s.name]}")
                continue
            seen[s.kind, s.name] = s.module
            found.append(s)
    order = sorted(found, key=lambda s: (s.source != "tuned", KINDS.index(s.kind),
                                         s.order, s.name))
    return tuple(order), tuple(skipped)


def specs() -> tuple[PolicySpec, ...]:
    """Every policy declared, built-in ones first, each kind by (order, name)."""
    return _read()[0]


def skipped() -> tuple[str, ...]:
    """The third-party declarations left out (unreadable, or a name already taken),
    one line each."""
    return _read()[1]


def of_kind(kind: str) -> tuple[PolicySpec, ...]:
    return tuple(s for s in specs() if s.kind == kind)


def names(kind: str) -> tuple[str, ...]:
    """The names ``batch_policy`` (kind "batch") or ``queue_policy`` accepts."""
    return tuple(s.name for s in of_kind(kind))


def find(kind: str, name: str) -> PolicySpec | None:
    return next((s for s in of_kind(kind) if s.name == name), None)


def reasons() -> dict[str, str]:
    """Every reason a declared policy emits, with its text."""
    out: dict[str, str] = {}
    for s in specs():
        out.update(s.reasons)
    return out


def explain() -> str:
    """The policies and their options, as `tuned check-config --explain` prints them."""
    lines = []
    for s in specs():
        table = f"{s.kind}_options"
        head = f"{s.kind}_policy = {s.name}: {s.summary}"
        if s.source != "tuned":
            head += f" (from {s.module}, entry point {s.source})"
        lines.append(head)
        for o in s.options:
            lines.append(f"  {table}.{o.name} ({o.type}, default {o.default!r}, "
                         f"{o.allowed()}): {o.doc}")
    return "\n".join(lines)

