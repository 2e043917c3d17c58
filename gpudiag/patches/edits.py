"""Edits to one parsed file, collected first and made in one libcst pass, so that comments,
blank lines and the user's formatting outside the edited statements are kept byte for byte.

An :class:`Edits` holds, by node identity (the nodes of one parsed :class:`libcst.Module`):
statements to insert before or after a statement, statements to put first in a loop's body, a run
of statements to wrap in a ``with``, keywords to set on a call. :meth:`Edits.apply` returns the new
module. Shapes of the keyword rule: docs/patches.md, "Keywords".
"""

from __future__ import annotations

import dataclasses
import re

import libcst as cst

COMMENT = "# gpudiag: {change}"


def statements(code: str) -> list[cst.BaseStatement]:
    """``code`` (one or more lines of Python) as statements. Raises libcst.ParserSyntaxError."""
    return list(cst.parse_module(code).body)


def with_comment(stmts: list[cst.BaseStatement], change: str) -> list[cst.BaseStatement]:
    """``stmts`` with the line ``# gpudiag: <change>`` above the first (docs/patches.md)."""
    first = stmts[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(COMMENT.format(change=change)))])
    return [first, *stmts[1:]]


@dataclasses.dataclass
class Edits:
    """Edits to one module, keyed by ``id()`` of its original nodes."""

    change: str
    before: dict = dataclasses.field(default_factory=dict)   # statement id -> [statements]
    after: dict = dataclasses.field(default_factory=dict)    # statement id -> [statements]
    first_in: dict = dataclasses.field(default_factory=dict)  # loop id -> [statements]
    wraps: dict = dataclasses.field(default_factory=dict)    # first statement id -> (last id, with item code)
    keywords: dict = dataclasses.field(default_factory=dict)  # call id -> {keyword: value code}
    values: dict = dataclasses.field(default_factory=dict)   # expression id -> new value code
    uses_torch: bool = False  # an edit writes code that names torch (the file may need `import torch`)

    def _note(self, code: str) -> str:
        self.uses_torch = self.uses_torch or bool(re.search(r"(?<![\w.])torch\.", code))
        return code

    def insert_after(self, stmt, code: str) -> None:
        self.after.setdefault(id(stmt), []).extend(with_comment(statements(self._note(code)), self.change))

    def add_import(self, stmt, code: str) -> None:
        """``code`` (an import) right after ``stmt``, before anything else inserted there, with no comment."""
        self.after[id(stmt)] = [*statements(code), *self.after.get(id(stmt), [])]

    def insert_before(self, stmt, code: str) -> None:
        self.before.setdefault(id(stmt), []).extend(with_comment(statements(self._note(code)), self.change))

    def insert_first(self, loop, code: str) -> None:
        self.first_in.setdefault(id(loop), []).extend(with_comment(statements(self._note(code)), self.change))

    def wrap(self, first, last, item: str) -> None:
        self.wraps[id(first)] = (id(last), self._note(item))

    def set_keyword(self, call, name: str, value: str) -> None:
        self.keywords.setdefault(id(call), {})[name] = self._note(value)

    def replace(self, expression, value: str) -> None:
        self.values[id(expression)] = self._note(value)

    def empty(self) -> bool:
        return not (self.before or self.after or self.first_in or self.wraps or self.keywords or self.values)

    def apply(self, module: cst.Module) -> cst.Module:
        """The module with every edit made (``module`` is the one the node ids came from)."""
        return module.visit(_Transformer(self))


class _Transformer(cst.CSTTransformer):
    def __init__(self, edits: Edits):
        super().__init__()
        self.edits = edits

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        wanted = self.edits.keywords.get(id(original))
        return set_keywords(updated, wanted) if wanted else updated

    def on_leave(self, original, updated):
        value = self.edits.values.get(id(original))
        if value is not None and isinstance(original, cst.BaseExpression):
            updated = cst.parse_expression(value)
        return super().on_leave(original, updated)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._body(original.body, updated.body))

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._body(original.body, updated.body))

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        return self._first(original, updated)

    def leave_While(self, original: cst.While, updated: cst.While) -> cst.While:
        return self._first(original, updated)

    def _first(self, original, updated):
        new = self.edits.first_in.get(id(original))
        if not new or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        return updated.with_changes(body=updated.body.with_changes(body=[*new, *updated.body.body]))

    def _body(self, originals, updated) -> list:
        out: list = []
        open_wrap: tuple | None = None  # (last id, item, the statements so far)
        for old, new in zip(originals, updated):
            if open_wrap is None and id(old) in self.edits.wraps:
                last, item = self.edits.wraps[id(old)]
                open_wrap = (last, item, [])
            out.extend(self.edits.before.get(id(old), []))
            if open_wrap is not None:
                open_wrap[2].append(new)
                if id(old) == open_wrap[0]:
                    out.append(_with(open_wrap[1], open_wrap[2], self.edits.change))
                    open_wrap = None
            else:
                out.append(new)
            out.extend(self.edits.after.get(id(old), []))
        if open_wrap is not None:  # the last statement was not in this block: the statements stay as they were
            out.extend(open_wrap[2])
        return out


def _with(item: str, body: list, change: str) -> cst.With:
    """``with ITEM:`` around ``body``; the first statement's leading comments go above the ``with``."""
    leading = list(body[0].leading_lines)
    body = [body[0].with_changes(leading_lines=[]), *body[1:]]
    node = cst.parse_statement(f"with {item}:\n    pass\n")
    comment = cst.EmptyLine(comment=cst.Comment(COMMENT.format(change=change)))
    return node.with_changes(body=node.body.with_changes(body=body), leading_lines=[*leading, comment])


def set_keywords(call: cst.Call, wanted: dict[str, str]) -> cst.Call:
    """``call`` with each keyword of ``wanted`` (name -> value code) replaced where it is passed,
    else appended after the last argument: on its own line, at the previous argument's indentation,
    when the arguments are one per line; else inline after ``, ``."""
    args = list(call.args)
    missing = []
    for name, value in wanted.items():
        index = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == name), None)
        if index is None:
            missing.append((name, value))
        else:
            args[index] = args[index].with_changes(value=cst.parse_expression(value))
    if not missing:
        return call.with_changes(args=args)
    return call.with_changes(args=_append(call, args, missing))


def _separator(call: cst.Call, args: list[cst.Arg]):
    """The whitespace after a comma between two arguments when the arguments are one per line
    (every break between them a line break), else None (append inline)."""
    breaks = [a.comma.whitespace_after for a in args[:-1] if isinstance(a.comma, cst.Comma)]
    if len(args) == 1:  # f(\n    x\n): the break after the parenthesis decides
        breaks = [call.whitespace_before_args]
    if len(breaks) != max(len(args) - 1, 1) or not all(isinstance(b, cst.ParenthesizedWhitespace) for b in breaks):
        return None
    return breaks[-1]


def _append(call: cst.Call, args: list[cst.Arg], missing: list[tuple[str, str]]) -> list[cst.Arg]:
    new = [cst.Arg(value=cst.parse_expression(value), keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))
           for name, value in missing]
    if not args:
        return new
    separator = _separator(call, args)
    last = args[-1]
    trailing = last.comma if isinstance(last.comma, cst.Comma) else None
    comma = cst.Comma(whitespace_after=separator if separator is not None else cst.SimpleWhitespace(" "))
    # the closing parenthesis keeps its layout: after the trailing comma's line break, or right after
    # the last argument (its whitespace moves to the new last argument)
    end = (new[-1].with_changes(comma=trailing) if trailing is not None
           else new[-1].with_changes(whitespace_after_arg=last.whitespace_after_arg))
    head = last.with_changes(comma=comma, whitespace_after_arg=cst.SimpleWhitespace("") if trailing is None
                             else last.whitespace_after_arg)
    return [*args[:-1], head, *(arg.with_changes(comma=comma) for arg in new[:-1]), end]
