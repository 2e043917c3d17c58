"""One recipe per trial change: where it edits the user's files and what it writes there
(docs/patches.md, "Recipes"). A recipe fills a :class:`Plan` with :class:`~gpudiag.patches.edits.Edits`
or raises :class:`NoPatch` with the snippet a person would add, where it goes, and why gpudiag made
no patch. Recipes act only on what the trial's record says it changed (its ``applied`` lines and
``framework``), so a patch makes the change that was measured.
"""

from __future__ import annotations

import dataclasses
import re

import libcst as cst
import libcst.matchers as m

from gpudiag.patches import locate
from gpudiag.patches.edits import Edits

AUTOCAST = 'torch.autocast("cuda", dtype=torch.bfloat16)'
FRAMEWORK_KEYWORDS = {  # change -> framework -> (constructor names, keyword, value, command-line flag)
    "bf16-autocast": {"lightning": (("Trainer",), "precision", '"bf16-mixed"', None),
                      "transformers": (("TrainingArguments", "Seq2SeqTrainingArguments"), "bf16", "True", "--bf16"),
                      "accelerate": (("Accelerator",), "mixed_precision", '"bf16"', "--mixed_precision bf16")},
    "tf32": {"transformers": (("TrainingArguments", "Seq2SeqTrainingArguments"), "tf32", "True", "--tf32 True")},
    "fused-optimizer": {"transformers": (("TrainingArguments", "Seq2SeqTrainingArguments"), "optim",
                                         '"adamw_torch_fused"', "--optim adamw_torch_fused")},
    "compile": {"transformers": (("TrainingArguments", "Seq2SeqTrainingArguments"), "torch_compile", "True",
                                 "--torch_compile True")},
}
FRAMEWORK_IMPORTS = {"lightning": ("lightning", "pytorch_lightning"), "transformers": ("transformers",),
                     "accelerate": ("accelerate",)}
NOT_MODEL = {"torch", "DataLoader", "Trainer", "TrainingArguments", "Accelerator", "gpudiag"}


class NoPatch(Exception):
    """No patch: ``why`` (one sentence), the ``snippet`` to add by hand and ``where`` it goes."""

    def __init__(self, why: str, snippet: str | None = None, where: str | None = None):
        super().__init__(why)
        self.why, self.snippet, self.where = why, snippet, where


@dataclasses.dataclass
class Plan:
    """The parsed files of the script's folder (the script first) and the edits per file."""

    change: str
    sources: list
    script_args: list = dataclasses.field(default_factory=list)
    edits: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)  # what the patch changed beyond the obvious

    @property
    def script(self) -> locate.Source:
        return self.sources[0]

    def of(self, source: locate.Source) -> Edits:
        return self.edits.setdefault(source.path, Edits(self.change))

    def scoped(self, found: list[tuple], what: str) -> list[tuple]:
        """``found`` ([(source, item)]) kept to the script's own when it has any, else to the one
        other file of the folder that has them; raises NoPatch when several other files do (which
        one the script runs is not certain)."""
        own = [f for f in found if f[0] is self.script]
        if own:
            return own
        files = list(dict.fromkeys(f[0].path for f in found))
        if len(files) > 1:
            raise NoPatch(f"{what} found in several files of the script's folder ({', '.join(files)}), none in the "
                          "script: which one runs is not certain")
        return found


def framework_of(record: dict) -> str | None:
    """The framework whose switch the trial set: the record's ``framework``, else read from its
    ``applied`` lines (records written before the field)."""
    if record.get("framework"):
        return record["framework"]
    text = " ".join(record.get("applied") or [])
    for name, mark in (("lightning", "Trainer(precision"), ("transformers", "TrainingArguments("),
                       ("accelerate", "Accelerator(")):
        if mark in text:
            return name
    return None


def make(plan: Plan, record: dict) -> None:
    """Fill ``plan`` for its change, as ``record`` (the trial) made it. Raises NoPatch."""
    framework = framework_of(record)
    if framework and framework in FRAMEWORK_KEYWORDS.get(plan.change, {}):
        return framework_switch(plan, framework)
    recipe = RECIPES.get(plan.change)
    if recipe is None:
        raise NoPatch(f"gpudiag has no patch recipe for {plan.change}")
    recipe(plan, record)


# ---- keywords on calls -----------------------------------------------------------------------------

def set_keyword(plan: Plan, source, call: cst.Call, name: str, value: str) -> None:
    """``name=value`` on ``call`` (docs/patches.md, "Keywords"): added, or replacing a literal, or
    replacing the literal argparse default of ``args.NAME`` when the run's command line does not set
    that option; any other expression is replaced by the value at the call, as the trial replaced
    it there, and :attr:`Plan.notes` says what the script computed before."""
    given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)
    if given is None and any(a.star == "**" for a in call.args):
        unpacked = _in_unpacked_dict(source, call, name)
        if unpacked is None:  # no dict the call unpacks holds it: a keyword beside them cannot clash
            plan.of(source).set_keyword(call, name, value)
        elif locate.is_literal(unpacked):  # the dict's own entry, where the script sets it
            plan.of(source).replace(unpacked, value)
        else:
            raise NoPatch(f"{name} comes from an expression in a dict {locate.callee(call)}() unpacks",
                          f"{name}={value}", f"{source.path}: that dict")
        return
    if given is None or locate.is_literal(given):
        plan.of(source).set_keyword(call, name, value)
        return
    if isinstance(given, cst.Attribute) and isinstance(given.value, cst.Name):
        found = locate.argparse_default(source, given.attr.value)
        flags = [o for o in locate.option_strings(found[0]) if o.startswith("-")] if found else []
        if found is not None and not any(a.split("=")[0] in flags for a in plan.script_args):
            plan.of(source).replace(found[1], value)
            return
    plan.of(source).set_keyword(call, name, value)
    plan.notes.append(f"{source.path}: {locate.callee(call)}({name}=...) took {source.code(given)}, now {value} as the "
                      "trial measured it (the option behind it no longer acts there)")


def _in_unpacked_dict(source, call: cst.Call, name: str):
    """The value of key ``name`` in the dict literals a call unpacks (``f(**kw)``, where
    ``kw = {...}`` and ``kw.update(other)`` with ``other = {...}``), or None when none holds it.
    Raises NoPatch when a dict is built otherwise (``kw[k] = v``, a non-literal update) or two
    literals hold the key: the value the call gets is not certain."""
    names = [a.value.value for a in call.args if a.star == "**" and isinstance(a.value, cst.Name)]
    if len(names) != sum(a.star == "**" for a in call.args):
        raise NoPatch(f"{locate.callee(call)}() unpacks keywords from an expression gpudiag cannot read",
                      f"{name}=...", f"{source.path}: the {locate.callee(call)}(...) call")
    seen, todo, literals = set(), list(names), []
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in m.findall(source.module, m.Assign(targets=[m.AssignTarget(target=m.Name(current))])):
            if not isinstance(node.value, cst.Dict):
                raise NoPatch(f"{current} is built by an expression, not a dict literal", f"{name}=...",
                              f"{source.path}: where {current} is built")
            literals.append(node.value)
        for node in m.findall(source.module, m.Call(func=m.Attribute(value=m.Name(current), attr=m.Name("update")))):
            if not (node.args and isinstance(node.args[0].value, cst.Name)):
                raise NoPatch(f"{current}.update(...) takes an expression", f"{name}=...", f"{source.path}")
            todo.append(node.args[0].value.value)
        if m.findall(source.module, m.AssignTarget(target=m.Subscript(value=m.Name(current)))):
            raise NoPatch(f"{current}[...] is assigned: the keywords the call gets are not certain", f"{name}=...",
                          f"{source.path}")
    values = [e.value for d in literals for e in d.elements if isinstance(e, cst.DictElement)
              and isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == name]
    if len(values) > 1:
        raise NoPatch(f"{name} is set in {len(values)} dicts the call unpacks", f"{name}=...", f"{source.path}")
    return values[0] if values else None


def framework_switch(plan: Plan, framework: str) -> None:
    names, keyword, value, flag = FRAMEWORK_KEYWORDS[plan.change][framework]
    found = plan.scoped([(s, c) for s in plan.sources if set(FRAMEWORK_IMPORTS[framework]) & locate.imports_of(s)
                         for name in names for c in locate.calls(s, name)], f"{names[0]}(...) calls")
    if not found:
        parsed = any("HfArgumentParser" in s.text for s in plan.sources)
        if parsed and flag:
            raise NoPatch(f"the script's {names[0]} come from the command line (HfArgumentParser): no call to edit",
                          flag, "the script's command line")
        raise NoPatch(f"no {names[0]}(...) call in the script's folder", f"{names[0]}({keyword}={value})",
                      f"where the script builds its {names[0]}")
    for source, call in found:
        set_keyword(plan, source, call, keyword, value)


# ---- the model ---------------------------------------------------------------------------------------

def model_classes(record: dict) -> list[str]:
    """The classes of the modules the trial changed, from its ``applied`` lines."""
    out = []
    for line in record.get("applied") or []:
        found = re.match(r"([A-Za-z_]\w*)[.(]", line) or re.search(r"apply\((\w+)\)", line)
        if found and found.group(1) not in NOT_MODEL:
            out.append(found.group(1))
    return list(dict.fromkeys(out))


def models(plan: Plan, record: dict) -> list[tuple]:
    """[(source, target, site statement)] of the models the trial changed: bound from their class's
    constructor (the ones the script trains or calls in a loop, when the class is bound to several),
    else passed to an optimizer as ``M.parameters()``. Raises NoPatch when none is found, or one is
    bound in more than one function (:func:`gpudiag.patches.locate.model_site`)."""
    found = plan.scoped([(s, t) for name in model_classes(record) for s in plan.sources
                         for t in locate.bound_by_class(s, name)], "the model's construction")
    try:
        linked = plan.scoped([(s, t) for s in plan.sources for c in locate.optimizer_calls(s)
                              if (t := locate.model_of_optimizer(s, c))], "optimizers over a model's parameters")
    except NoPatch:
        if not found:
            raise
        linked = []  # the class's construction decides; optimizers in several other files do not matter
    # a class bound to several targets (model = DataParallel(model), model.features = DataParallel(...)):
    # the ones the script trains or calls in a loop
    used = [(s, t) for s, t in found if (s, t) in linked or locate.model_calls(s, t)]
    found = used or found or linked
    found = list(dict.fromkeys(found))
    names = ", ".join(model_classes(record)) or "the model"
    if not found:
        raise NoPatch(f"no statement of the script's folder builds {names} where gpudiag can see it (a framework or "
                      "another package builds it)", None, "right after the model is built")
    out = []
    for source, target in found:
        site = locate.model_site(source, target)
        if site is None:
            raise NoPatch(f"{target} is bound in more than one function of {source.path}: which one runs is not certain",
                          None, f"{source.path}: after {target} is built")
        out.append((source, target, site))
    return out


def loops_calling(plan: Plan, found: list[tuple]) -> list[tuple]:
    """[(source, target, call)] of the model's own calls inside loops."""
    return [(s, t, c) for s, t, _site in found for c in locate.model_calls(s, t)]


def after_model(plan: Plan, record: dict, code: str) -> list[tuple]:
    """Insert ``code`` (``{M}`` for the model) after each model's site; returns :func:`models`."""
    found = models(plan, record)
    for source, target, site in found:
        plan.of(source).insert_after(site, code.format(M=target))
    return found


def _no_loop(plan: Plan, snippet: str, why: str) -> NoPatch:
    return NoPatch(why, snippet, "at the start of each training step, in the loop that calls the model")


# ---- recipes ---------------------------------------------------------------------------------------

def compile_(plan: Plan, record: dict) -> None:
    after_model(plan, record, "{M}.compile()")


def compile_graphs(plan: Plan, record: dict) -> None:
    found = models(plan, record)
    calling = loops_calling(plan, found)
    if not calling:
        raise _no_loop(plan, "torch.compiler.cudagraph_mark_step_begin()",
                       "the loop that calls the model is not in the script's folder (a framework runs it)")
    for source, target, site in found:
        plan.of(source).insert_after(site, f'{target}.compile(mode="reduce-overhead")')
    for source, loop in {id(source.loop_of(c)): (source, source.loop_of(c)) for source, _t, c in calling}.values():
        plan.of(source).insert_first(loop, "torch.compiler.cudagraph_mark_step_begin()")


def channels_last(plan: Plan, record: dict) -> None:
    found = after_model(plan, record, "{M} = {M}.to(memory_format=torch.channels_last)")
    done = set()
    for source, _target, call in loops_calling(plan, found):
        first = call.args[0].value if call.args and call.args[0].keyword is None and not call.args[0].star else None
        stmt = source.statement(call)
        if isinstance(first, cst.Name) and (id(stmt), first.value) not in done:
            done.add((id(stmt), first.value))
            plan.of(source).insert_before(stmt, f"{first.value} = {first.value}.contiguous(memory_format=torch.channels_last)")


def _loss_statement(source, stmt):
    """The statement after ``stmt`` in its block that assigns a name containing "loss" (before any
    ``.backward()``); ``stmt`` itself when it assigns one; None otherwise."""
    def assigns_loss(s):
        return any("loss" in source.code(t.target).lower() for node in m.findall(s, m.Assign())
                   for t in node.targets)

    if assigns_loss(stmt):
        return stmt
    body = list(source.block_of(stmt).body)
    start = body.index(stmt)
    for later in body[start + 1:start + 4]:
        if ".backward(" in source.module.code_for_node(later) or not isinstance(later, cst.SimpleStatementLine):
            return None
        if assigns_loss(later):
            return later
    return None


def bf16_autocast(plan: Plan, record: dict) -> None:
    found = models(plan, record)
    calling = loops_calling(plan, found)
    if not calling:
        raise NoPatch("the model's forward is not called in a loop of the script's folder", f"with {AUTOCAST}:",
                      "around the model's forward and the loss")
    wrapped = set()
    for source, _target, call in calling:
        stmt = source.statement(call)
        if id(stmt) in wrapped:
            continue
        if not isinstance(stmt, cst.SimpleStatementLine):
            raise NoPatch("the model is called inside a compound statement gpudiag does not wrap", f"with {AUTOCAST}:",
                          f"{source.path}: around the model's forward and the loss")
        last = _loss_statement(source, stmt) or stmt
        wrapped.add(id(stmt))
        plan.of(source).wrap(stmt, last, AUTOCAST)


def half_weights(plan: Plan, record: dict) -> None:
    found = after_model(plan, record, "{M} = {M}.to(torch.bfloat16)")
    calling = loops_calling(plan, found)
    if not calling:
        raise NoPatch("the model's forward is not called in a loop of the script's folder", f"with {AUTOCAST}:",
                      "around the model's forward")
    for source, _target, call in calling:
        stmt = source.statement(call)
        if isinstance(stmt, cst.SimpleStatementLine) and id(stmt) not in plan.of(source).wraps:
            plan.of(source).wrap(stmt, stmt, AUTOCAST)


def static_cache(plan: Plan, record: dict, compiled: bool) -> None:
    found = plan.scoped([(s, c) for s in plan.sources
                         for c in m.findall(s.module, m.Call(func=m.Attribute(attr=m.Name("generate"))))],
                        ".generate(...) calls")
    if not found:
        raise NoPatch("no .generate(...) call in the script's folder", 'cache_implementation="static"',
                      "on the model's generate() call")
    for source, call in found:
        set_keyword(plan, source, call, "cache_implementation", '"static"')
        if not compiled:
            set_keyword(plan, source, call, "disable_compile", "True")


def optimizer(plan: Plan, record: dict) -> None:
    wanted = {}
    for line in record.get("applied") or []:
        for name, kind in re.findall(r"(\w+)\((fused|foreach)=True\)", line):
            wanted[name] = kind
    found = plan.scoped([(s, c) for s in plan.sources for c in locate.optimizer_calls(s, set(wanted))],
                        "optimizer constructors")
    if not found:
        raise NoPatch("no torch.optim constructor of the script's folder matches what the trial changed "
                      f"({', '.join(wanted) or 'none recorded'})", "fused=True", "in the optimizer's constructor call")
    for source, call in found:
        if any(a.keyword is not None and a.keyword.value in ("fused", "foreach") for a in call.args):
            raise NoPatch(f"{locate.callee(call)}(...) already chooses its implementation (fused or foreach)",
                          "fused=True", f"{source.path}: the {locate.callee(call)}(...) call")
        plan.of(source).set_keyword(call, wanted[locate.callee(call)], "True")


def _header(plan: Plan, code: str, conflict: str, why: str) -> None:
    source = plan.script
    if re.search(conflict, source.text):
        raise NoPatch(why, code, f"{source.path}: after the imports, in place of the script's own setting")
    end = locate.torch_import(source) or locate.header_end(source)
    if end is None:
        raise NoPatch(f"{source.path} does not start with its imports", code, f"{source.path}: after the imports")
    plan.of(source).insert_after(end, code)


def tf32(plan: Plan, record: dict) -> None:
    _header(plan, "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True",
            r"allow_tf32\s*=|set_float32_matmul_precision",
            "the script sets TF32 (allow_tf32 or set_float32_matmul_precision) itself: change its own line")


def cudnn_benchmark(plan: Plan, record: dict) -> None:
    _header(plan, "torch.backends.cudnn.benchmark = True", r"cudnn\.benchmark\s*=",
            "the script sets torch.backends.cudnn.benchmark itself: change its own line")


def _loaders(plan: Plan) -> list[tuple]:
    found = plan.scoped([(s, c) for s in plan.sources for c in locate.calls(s, "DataLoader")], "DataLoader(...) calls")
    if not found:
        raise NoPatch("no DataLoader(...) call in the script's folder (a framework or a library builds it)",
                      "num_workers=N, persistent_workers=True, pin_memory=True", "the DataLoader(...) call")
    return found


def _non_blocking(plan: Plan, sources: list) -> None:
    """``non_blocking=True`` on ``.to(...)``/``.cuda()`` of the names a loader loop's target binds,
    in ``sources`` (the files whose loaders were changed)."""
    loaders = {t for s in sources for node in m.findall(s.module, m.Assign())
               if isinstance(node.value, cst.Call) and locate.callee(node.value) == "DataLoader"
               for t in (s.code(x.target) for x in node.targets)}
    for source in sources:
        for loop in m.findall(source.module, m.For()):
            iterated = source.code(loop.iter)
            if not any(re.search(r"(?<![\w.])" + re.escape(n) + r"(?!\w)", iterated) for n in loaders) \
                    and "loader" not in iterated.lower():
                continue
            names = {n.value for n in m.findall(loop.target, m.Name())}
            for call in m.findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("to") | m.Name("cuda")))):
                if isinstance(call.func.value, cst.Name) and call.func.value.value in names and not any(
                        a.keyword is not None and a.keyword.value == "non_blocking" for a in call.args):
                    plan.of(source).set_keyword(call, "non_blocking", "True")


def loader_workers(plan: Plan, record: dict) -> None:
    text = " ".join(record.get("applied") or [])
    target = re.search(r"num_workers \S+ -> (\d+)", text)
    found = _loaders(plan)
    for source, call in found:
        if target:
            set_keyword(plan, source, call, "num_workers", target.group(1))
            set_keyword(plan, source, call, "persistent_workers", "True")
        set_keyword(plan, source, call, "pin_memory", "True")
    _non_blocking(plan, list(dict.fromkeys(s for s, _c in found)))


def pin_memory(plan: Plan, record: dict) -> None:
    found = _loaders(plan)
    for source, call in found:
        set_keyword(plan, source, call, "pin_memory", "True")
    _non_blocking(plan, list(dict.fromkeys(s for s, _c in found)))


def kernels(plan: Plan, record: dict) -> None:
    package = "timm_swin" if any("timm_swin" in a for a in record.get("applied") or []) else "hf"
    after_model(plan, record, f"import gpudiag.fused.{package}\ngpudiag.fused.{package}.apply({{M}})")


RECIPES = {
    "compile": compile_, "compile-graphs": compile_graphs, "channels-last": channels_last,
    "bf16-autocast": bf16_autocast, "half-weights": half_weights, "fused-optimizer": optimizer, "tf32": tf32,
    "cudnn-benchmark": cudnn_benchmark, "loader-workers": loader_workers, "pin-memory": pin_memory,
    "kernels": kernels, "static-cache": lambda p, r: static_cache(p, r, compiled=False),
    "static-cache-compile": lambda p, r: static_cache(p, r, compiled=True),
}
