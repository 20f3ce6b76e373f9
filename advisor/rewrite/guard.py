"""A fix behind a run-time check: the fix's edits inside a run of statements become the `if` branch, and the
`else` branch keeps those statements as they were, so the patch is exact wherever the check fails. Edits outside
the run (a later read renamed, an import) apply on both paths."""

from __future__ import annotations

import libcst as cst

from advisor.contracts.emitted_names import MODULE_CHECK_HELPER, MODULE_CHECK_LOCAL
from advisor.rewrite.apply import NodeEdits, edited_statements
from advisor.static.module_index import ParsedModule


def guarded(parsed: ParsedModule, edits: NodeEdits, test: cst.BaseExpression,
            span: list[cst.BaseStatement], lifted: list[cst.BaseStatement] = (),
            above: tuple[cst.BaseStatement, ...] = ()) -> NodeEdits:
    """`edits` with the part inside `span` (consecutive statements of one block) moved under `if test:`, the
    original statements under its `else:`; the statements of `lifted` (in the span, binding what `test` reads)
    run, edited, above the `if`, then the new statements `above`."""
    members = set(span)

    def inside(node: cst.CSTNode) -> bool:
        while node is not None:
            if node in members:
                return True
            node = parsed.parents.get(node)
        return False

    inner = NodeEdits(replace={n: new for n, new in edits.replace.items() if inside(n)},
                      remove={n for n in edits.remove if inside(n)},
                      insert_before={n: new for n, new in edits.insert_before.items() if inside(n)},
                      wrap={n: new for n, new in edits.wrap.items() if inside(n)},
                      unwrap={n for n in edits.unwrap if inside(n)}, take={n for n in edits.take if inside(n)})
    outer = NodeEdits(replace={n: new for n, new in edits.replace.items() if not inside(n)},
                      remove={n for n in edits.remove if not inside(n)} | set(span[1:]),
                      insert_before={n: new for n, new in edits.insert_before.items() if not inside(n)},
                      wrap={n: new for n, new in edits.wrap.items() if not inside(n)},
                      unwrap={n for n in edits.unwrap if not inside(n)}, take={n for n in edits.take if not inside(n)},
                      imports=edits.imports, definitions=edits.definitions,
                      # their comments go up with them, or into the `else:` copy, once (breaker round 57: a comment
                      # inside the span was kept in place as well)
                      moved=edits.moved | set(lifted) | set(span[1:]))
    rest = [statement for statement in span if statement not in lifted]
    fast = edited_statements(rest, inner)
    original = [statement.deep_clone() for statement in rest]  # new nodes: no edit reaches them
    fast[0], original[0] = (statements[0].with_changes(leading_lines=()) for statements in (fast, original))
    if lifted or above:
        outer.insert_before[span[0]] = tuple(edited_statements(list(lifted), inner)) + tuple(above)
    outer.replace[span[0]] = cst.If(test=test, body=cst.IndentedBlock(fast),
                                    orelse=cst.Else(cst.IndentedBlock(original)), leading_lines=span[0].leading_lines)
    return outer


def module_check_statements(torch_name: str, check: cst.BaseExpression) -> tuple[cst.BaseStatement, ...]:
    """`<local> = False` / `if not torch.jit.is_scripting(): <local> = <check>`: TorchScript skips that `if`'s body
    (it compiles neither `type(...)` nor a module passed to a function), so a scripted patch runs the original."""
    local = cst.Name(MODULE_CHECK_LOCAL)
    first = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(local)], cst.Name("False"))])
    test = cst.UnaryOperation(cst.Not(), cst.parse_expression(f"{torch_name}.jit.is_scripting()"))
    body = cst.IndentedBlock([cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(local)], check)])])
    return first, cst.If(test=test, body=body)


def module_check_helper(torch_name: str) -> cst.FunctionDef:
    """The module-level helper the check calls (one per module, whatever the number of blocks)."""
    return cst.parse_statement(_MODULE_CHECK.format(name=MODULE_CHECK_HELPER, torch=torch_name)) \
        .with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])


_MODULE_CHECK = '''def {name}(module, kinds):
    """Whether calling `module` runs exactly the forward of one of `kinds` (not a subclass's, not one set on the
    instance or, for torch's classes, on the class, nor a call implementation: `nn.Module.compile()` sets one) and
    no hook of its own or of the process (written by advisor: a patch that skips the call is exact only then)."""
    hooks = {torch}.nn.modules.module
    replaced = {{"forward", "_call_impl", "_compiled_call_impl"}} & vars(module).keys()
    torch_files = hooks.__file__[:-len("module.py")]
    torch_class = type(module).__module__.startswith("torch.")
    methods = ("__call__", "_call_impl", "forward") if torch_class else ("__call__", "_call_impl")
    code = [getattr(getattr(type(module), method, None), "__code__", None) for method in methods]
    replaced = replaced or not all(c is not None and c.co_filename.startswith(torch_files) for c in code)
    forward = getattr(type(module), "forward", None)  # torch's own, of that class (not `nn.Identity.forward` set)
    replaced = replaced or torch_class and getattr(forward, "__qualname__", "") != type(module).__qualname__ + ".forward"
    return type(module) in kinds and not replaced and not (
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
        or hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
        or hooks._global_backward_pre_hooks)
'''
