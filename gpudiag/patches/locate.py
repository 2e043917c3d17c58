"""Finding, in a parsed file, the places a change edits: the model's binding, the loops that call
it, optimizer and DataLoader constructors, framework objects, argparse defaults, the import
header. Every finder returns nodes of one :class:`Source` or None: where a place is not certain,
the caller makes no patch (docs/patches.md, "Terms").
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider

# torch.optim classes (torch 2.x); the trial's record names the ones it changed
OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop",
              "Rprop", "SparseAdam", "LBFGS", "Adafactor", "Muon")
LOOPS = (cst.For, cst.While)
BLOCKS = (cst.Module, cst.IndentedBlock)


@dataclasses.dataclass(eq=False)  # hashed by identity: one parse of one file
class Source:
    """One file of the script's folder, parsed: ``path`` relative to the folder, its ``text``, the
    libcst ``module``, and each node's parent (``parents``, by node)."""

    path: str
    text: str
    module: cst.Module
    parents: dict

    @classmethod
    def parse(cls, folder: Path, path: str) -> "Source":
        """Raises OSError, UnicodeDecodeError or libcst.ParserSyntaxError."""
        raw = (folder / path).read_bytes()
        text = raw.decode("utf-8")
        module = cst.parse_module(text)
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        return cls(path, text, module, dict(wrapper.resolve(ParentNodeProvider)))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def code(self, node) -> str:
        return self.module.code_for_node(node).strip()

    def ancestors(self, node):
        while node in self.parents:
            node = self.parents[node]
            yield node

    def statement(self, node):
        """The statement (a line, or a compound statement) whose block directly holds ``node``."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, BLOCKS):
                return child
            child = parent
        return None

    def block_of(self, stmt):
        return self.parents.get(stmt)

    def loop_of(self, node):
        """The innermost for/while loop holding ``node`` in its body (not in its header)."""
        return next((a for a in self.ancestors(node) if isinstance(a, LOOPS)), None)


def callee(call: cst.Call) -> str:
    """The last name of a call's function: ``torch.optim.SGD(...)`` -> "SGD"."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def calls(source: Source, name: str) -> list[cst.Call]:
    """Calls whose callee's last name is ``name``, in file order."""
    return [c for c in m.findall(source.module, m.Call()) if callee(c) == name]


def imports_of(source: Source) -> set[str]:
    """Top-level package names the file imports (``import a.b``, ``from a.b import c``: "a")."""
    out = set()
    for node in m.findall(source.module, m.Import() | m.ImportFrom()):
        if isinstance(node, cst.Import):
            out |= {cst.helpers.get_full_name_for_node(a.name).split(".")[0] for a in node.names}
        elif node.module is not None and not node.relative:
            out.add(cst.helpers.get_full_name_for_node(node.module).split(".")[0])
    return out


def optimizer_calls(source: Source, classes: set[str] | None = None) -> list[cst.Call]:
    """``torch.optim`` constructor calls: ``torch.optim.C(``, ``optim.C(`` or ``C(`` where ``C``
    was imported from torch.optim (``classes``: only these)."""
    from_optim = set()
    for node in m.findall(source.module, m.ImportFrom()):
        if node.module is not None and cst.helpers.get_full_name_for_node(node.module) == "torch.optim" \
                and not isinstance(node.names, cst.ImportStar):
            from_optim |= {(a.asname.name.value if a.asname else a.name.value) for a in node.names}
    out = []
    for call in m.findall(source.module, m.Call()):
        name = callee(call)
        if name not in OPTIMIZERS or (classes and name not in classes):
            continue
        full = source.code(call.func)
        if full.endswith(f"optim.{name}") or (isinstance(call.func, cst.Name) and name in from_optim):
            out.append(call)
    return out


def model_of_optimizer(source: Source, call: cst.Call) -> str | None:
    """``M`` where the optimizer's parameters are ``M.parameters()`` (or a ``{"params":
    M.parameters()}`` group, ``filter(..., M.parameters())``, ``list(M.parameters())``)."""
    if not call.args:
        return None
    found = [source.code(c.func.value) for c in m.findall(call.args[0].value, m.Call(
        func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters"))))]
    names = set(found)
    return found[0] if len(names) == 1 and found[0] != "self" else None


def bindings(source: Source, target: str) -> list:
    """Statements that assign ``target`` (a name or ``self.name``), alone or in a tuple."""
    out = []
    for node in m.findall(source.module, m.Assign() | m.AnnAssign()):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        flat = []
        for t in targets:
            flat += [e.value for e in t.elements] if isinstance(t, (cst.Tuple, cst.List)) else [t]
        if any(source.code(t) == target for t in flat):
            out.append(source.statement(node))
    return out


def mentions(source: Source, stmt, target: str) -> bool:
    """Whether ``stmt`` uses ``target`` as an expression (a name or ``self.name``)."""
    pattern = re.compile(r"(?<![\w.])" + re.escape(target) + r"(?!\w)")
    return bool(pattern.search(source.module.code_for_node(stmt)))


def model_site(source: Source, target: str):
    """The statement after which the model ``target`` is complete (docs/patches.md): in the block
    that holds every binding of it (directly, or inside if/with/try statements of that block, as
    ``if pretrained: model = a() else: model = b()`` then ``model = DataParallel(model)``), the last
    statement holding a binding before the first other use of ``target``. None when it is never
    bound, or bound in different functions or classes (which one runs is not certain)."""
    stmts = bindings(source, target)
    if not stmts:
        return None
    paths = [[s, *source.ancestors(s)] for s in stmts]
    common = [n for n in paths[0] if all(any(n is a for a in p) for p in paths[1:]) and isinstance(n, BLOCKS)]
    if not common:
        return None
    block = common[0]
    tops = []
    for path in paths:
        below = path[:next(i for i, n in enumerate(path) if n is block)]
        if any(isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) for n in below):
            return None  # bound in another function than the block's: not the same run
        tops.append(below[-1])
    body = list(block.body)
    ids = {id(t) for t in tops}
    first = min(i for i, s in enumerate(body) if id(s) in ids)
    use = next((i for i in range(first + 1, len(body)) if id(body[i]) not in ids
                and mentions(source, body[i], target)), len(body))
    return body[max(i for i in range(first, use) if id(body[i]) in ids)]


def constructor(call: cst.Call) -> cst.Call:
    """The innermost call of a method chain: ``DataParallel(model).cuda()`` -> ``DataParallel(model)``."""
    while isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call):
        call = call.func.value
    return call


def bound_by_class(source: Source, class_name: str) -> list[str]:
    """Targets assigned from a call to ``class_name`` (``model = Net(...)``, ``self.net = Net()``,
    ``model = DataParallel(model).cuda()``)."""
    out = []
    for node in m.findall(source.module, m.Assign()):
        if isinstance(node.value, cst.Call) and callee(constructor(node.value)) == class_name and len(node.targets) == 1:
            out.append(source.code(node.targets[0].target))
    return list(dict.fromkeys(out))


def model_calls(source: Source, target: str) -> list[cst.Call]:
    """Calls of the model itself, ``M(...)``, inside a loop."""
    return [c for c in m.findall(source.module, m.Call()) if source.code(c.func) == target and source.loop_of(c)]


def header_end(source: Source):
    """The last top-level import of the module's leading imports (after its docstring and
    ``from __future__``), or None when the module starts with no import."""
    last = None
    for stmt in source.module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body):
            last = stmt
        elif isinstance(stmt, cst.SimpleStatementLine) and last is None and m.matches(
                stmt, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])):
            continue  # the docstring
        elif last is not None or not isinstance(stmt, cst.SimpleStatementLine):
            break
    return last


def torch_import(source: Source):
    """Where module-level code may first use ``torch``: the header's end when the header imports
    it, else the first later module-level ``import torch`` line (scripts that set ``sys.path``
    first); None when no module-level line binds the name ``torch``."""
    end = header_end(source)
    body = list(source.module.body)
    limit = body.index(end) if end is not None else -1
    for index, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and any(
                isinstance(node, cst.Import) and any(a.asname is None and cst.helpers.get_full_name_for_node(
                    a.name).split(".")[0] == "torch" for a in node.names) for node in stmt.body):
            return end if index <= limit else stmt
    return None


def imports_torch(source: Source) -> bool:
    """Whether a module-level ``import torch`` binds the name ``torch``."""
    return torch_import(source) is not None


def option_strings(call: cst.Call) -> list[str]:
    """The option strings of an ``add_argument(...)`` call (``["-j", "--workers"]``)."""
    return [a.value.evaluated_value for a in call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]


def argparse_default(source: Source, dest: str):
    """(the ``add_argument`` call, its literal ``default=`` expression) of the one call whose
    destination is ``dest``; None when there is none, more than one, or the default is not a literal."""
    found = []
    for call in calls(source, "add_argument"):
        strings = option_strings(call)
        explicit = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "dest"), None)
        if isinstance(explicit, cst.SimpleString):
            name = explicit.evaluated_value
        else:
            longs = [s for s in strings if s.startswith("--")]
            name = (longs[0][2:] if longs else (strings[0].lstrip("-") if strings else "")).replace("-", "_")
        if name == dest:
            found.append(call)
    if len(found) != 1:
        return None
    default = next((a.value for a in found[0].args if a.keyword is not None and a.keyword.value == "default"), None)
    return (found[0], default) if is_literal(default) else None


def is_literal(node) -> bool:
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.expression, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, cst.Name) and node.value in ("True", "False", "None")
