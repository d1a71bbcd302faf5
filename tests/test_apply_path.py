"""The apply path handles the tree in one place: followed from ``apply.apply_series``, the tree
passes through at most three modules, ``apply.py`` included.

What "the tree passes through a module" means, precisely (an ``ast`` walk, no import):

* the tree is ``apply_series``'s parameter ``tree``; a value *is the tree* when it is a name
  bound to the tree, ``X.root`` of the tree (its root path), ``X / name`` of a root path (a
  path inside it), an instance of a package class constructed with the tree as an argument
  (``journal.Plan(tree.root, ...)`` holds it), or what a package function that received the
  tree returns when its return annotation is ``Path`` or a package class;
* a call *receives* the tree when the tree is one of its arguments or the instance its method
  is called on (``tree.read(p)``, ``plan.put(...)``);
* every package function, method or class (imported, or of the same module) whose call
  receives the tree counts its module, and is followed into with the matching parameters
  (``self`` for a method) bound to the tree, transitively: at top level, in nested functions
  and in lambdas. Calls outside the package (``os.lstat(root)``) end the walk there, and so
  does a parameter used only inside f-strings: naming a path in a message is not handling
  the tree.

The set of modules so reached, ``apply.py`` first, is what the test bounds.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tools" / "patchset"
LIMIT = 3

PATH = ("path",)
"""The kind of a tree value that is its root path or a path inside it."""


@dataclass
class Module:
    name: str
    functions: dict[str, ast.FunctionDef]
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str | None]]
    """local name -> (module, name in it); (module, None) when the name is the module."""


def _load(package: Path) -> dict[str, Module]:
    names = {p.stem for p in package.glob("*.py")}
    modules = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imports: dict[str, tuple[str, str | None]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level == 0 and not (base == "patchset" or base.startswith("patchset.")):
                    continue
                parts = [p for p in (base.split(".")[1:] if node.level == 0 else base.split("."))]
                parts = [p for p in parts if p]
                for alias in node.names:
                    local = alias.asname or alias.name
                    if parts and parts[0] in names:
                        imports[local] = (parts[0], alias.name)
                    elif not parts and alias.name in names:
                        imports[local] = (alias.name, None)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "patchset" and len(parts) > 1 and parts[1] in names:
                        imports[alias.asname or alias.name] = (parts[1], None)
        modules[path.stem] = Module(
            path.stem,
            {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)},
            {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)},
            imports,
        )
    return modules


Target = tuple[str, str, str | None]
"""(module, class or function name, method name or None)."""


class Walk:
    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.reached: list[str] = []
        self.seen: set[tuple[Target, tuple[tuple[str, tuple[str, ...]], ...]]] = set()

    def resolve_name(self, module: str, name: str, depth: int = 0) -> Target | None:
        mod = self.modules[module]
        if name in mod.functions:
            return (module, name, None)
        if name in mod.classes:
            return (module, name, "__init__")
        if name in mod.imports and depth < 5:
            where, attr = mod.imports[name]
            if attr is not None:
                return self.resolve_name(where, attr, depth + 1)
        return None

    def resolve_call(
        self, module: str, func: ast.expr, env: dict[str, tuple[str, ...]]
    ) -> tuple[Target | None, tuple[str, ...] | None]:
        """(what is called, the kind of the instance it is called on, if that is the tree)."""
        if isinstance(func, ast.Name):
            return self.resolve_name(module, func.id), None
        if isinstance(func, ast.Attribute):
            receiver = self.kind(module, func.value, env)
            if receiver is not None and receiver[0] == "instance":
                _, cls_module, cls = receiver
                return (cls_module, cls, func.attr), receiver
            if isinstance(func.value, ast.Name):
                imported = self.modules[module].imports.get(func.value.id)
                if imported and imported[1] is None:
                    return self.resolve_name(imported[0], func.attr), None
        return None, None

    def returns_tree(self, target: Target) -> tuple[str, ...] | None:
        module, name, method = target
        if method == "__init__":
            return ("instance", module, name)
        node = self.function(target)
        if node is None or node.returns is None:
            return None
        text = ast.unparse(node.returns)
        if text in ("Path", "'Path'"):
            return PATH
        found = self.resolve_name(module, text.strip("'\""))
        if found and found[2] == "__init__":
            return ("instance", found[0], found[1])
        return None

    def function(self, target: Target) -> ast.FunctionDef | None:
        module, name, method = target
        mod = self.modules[module]
        if method is None:
            return mod.functions.get(name)
        cls = mod.classes.get(name)
        if cls is None:
            return None
        return next(
            (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None
        )

    def kind(
        self, module: str, node: ast.expr, env: dict[str, tuple[str, ...]]
    ) -> tuple[str, ...] | None:
        """The tree kind of expression ``node`` (instance of a class, or path), or None."""
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr == "root":
            return PATH if self.kind(module, node.value, env) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return PATH if self.kind(module, node.left, env) == PATH else None
        if isinstance(node, ast.Call):
            target, receiver = self.resolve_call(module, node.func, env)
            if target is not None and (receiver or self.tainted_args(module, node, env)):
                return self.returns_tree(target)
        return None

    def tainted_args(
        self, module: str, call: ast.Call, env: dict[str, tuple[str, ...]]
    ) -> dict[int | str, tuple[str, ...]]:
        out: dict[int | str, tuple[str, ...]] = {}
        for index, arg in enumerate(call.args):
            kind = self.kind(module, arg, env)
            if kind:
                out[index] = kind
        for keyword in call.keywords:
            kind = self.kind(module, keyword.value, env) if keyword.arg else None
            if kind and keyword.arg:
                out[keyword.arg] = kind
        return out

    def follow(self, target: Target, params: dict[str, tuple[str, ...]]) -> None:
        node = self.function(target)
        if node is not None:
            params = {k: v for k, v in params.items() if not _only_named(node, k)}
            if not params:
                return
        key = (target, tuple(sorted(params.items())))
        if key in self.seen:
            return
        self.seen.add(key)
        if target[0] not in self.reached:
            self.reached.append(target[0])
        if node is None:
            return
        module = target[0]
        env = dict(params)
        changed = True
        while changed:
            changed = False
            for sub in ast.walk(node):
                pairs: list[tuple[ast.expr, ast.expr]] = []
                if isinstance(sub, ast.Assign):
                    pairs = [(t, sub.value) for t in sub.targets]
                elif isinstance(sub, ast.AnnAssign | ast.NamedExpr) and sub.value is not None:
                    pairs = [(sub.target, sub.value)]
                elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
                    pairs = [(sub.optional_vars, sub.context_expr)]
                for name, value in pairs:
                    if isinstance(name, ast.Name) and name.id not in env:
                        kind = self.kind(module, value, env)
                        if kind:
                            env[name.id] = kind
                            changed = True
        for sub in ast.walk(node):
            if not isinstance(sub, ast.Call):
                continue
            callee, receiver = self.resolve_call(module, sub.func, env)
            args = self.tainted_args(module, sub, env)
            if callee is None or not (receiver or args):
                continue
            definition = self.function(callee)
            bound: dict[str, tuple[str, ...]] = {}
            if definition is not None:
                names = [a.arg for a in definition.args.posonlyargs + definition.args.args]
                if callee[2] is not None:  # a method or a constructor: self first
                    if receiver:
                        bound[names[0]] = receiver
                    names = names[1:]
                keywords = names + [a.arg for a in definition.args.kwonlyargs]
                for slot, kind in args.items():
                    if isinstance(slot, int) and slot < len(names):
                        bound[names[slot]] = kind
                    elif isinstance(slot, str) and slot in keywords:
                        bound[slot] = kind
            self.follow(callee, bound)


def _only_named(function: ast.FunctionDef, param: str) -> bool:
    """Whether ``param`` is used in ``function`` only inside f-strings (to name it in a
    message), and at least once."""
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == param]
    named = {
        id(n)
        for s in ast.walk(function)
        if isinstance(s, ast.JoinedStr)
        for n in ast.walk(s)
        if isinstance(n, ast.Name) and n.id == param
    }
    return bool(uses) and all(id(n) in named for n in uses)


def tree_modules(package: Path = PACKAGE) -> list[str]:
    """The modules the tree passes through from ``apply.apply_series`` (apply first)."""
    walk = Walk(_load(package))
    walk.follow(("apply", "apply_series", None), {"tree": ("instance", "tree", "Tree")})
    return walk.reached


def test_the_tree_passes_through_at_most_three_modules_from_apply_series() -> None:
    reached = tree_modules()
    assert reached[0] == "apply"
    assert len(reached) <= LIMIT, f"the tree passes through {len(reached)} modules: {reached}"


def test_the_walk_follows_arguments_receivers_constructors_and_paths(tmp_path: Path) -> None:
    (tmp_path / "apply.py").write_text(
        "from patchset import journal\n"
        "from patchset.lock import hold\n"
        "from patchset.gitfacts import head\n"
        "from patchset.messages import say\n"
        "def apply_series(tree):\n"
        "    hold(tree.root)\n"
        "    plan = journal.Plan(tree.root / 'x')\n"
        "    plan.put()\n"
        "    tree.read()\n"
        "    head(str(tree.root))\n"
        "    say(tree.root)\n"
    )
    (tmp_path / "lock.py").write_text("def hold(root):\n    return None\n")
    (tmp_path / "gitfacts.py").write_text("def head(text):\n    return None\n")
    (tmp_path / "messages.py").write_text("def say(where):\n    return f'{where}: failed'\n")
    (tmp_path / "journal.py").write_text(
        "from patchset.tree import Tree\n"
        "class Plan:\n"
        "    def put(self):\n"
        "        Tree(self.root).read()\n"
    )
    (tmp_path / "tree.py").write_text("class Tree:\n    def read(self):\n        return None\n")
    assert tree_modules(tmp_path) == ["apply", "lock", "journal", "tree"]
