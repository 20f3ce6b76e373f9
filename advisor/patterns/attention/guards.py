"""Guarded facts: where unproved facts are about metadata (q, k and v sharing a dtype, an added mask's dtype or
rank, a scale being a Python number, a tensor scale's rank, last size and dtype, at least as many keys as queries
under a bottom-right causal triangle), the patch checks exactly those facts at run time, takes the SDPA path where
they hold and runs the original block where they fail: exact for every input, and safe when nothing else is
assumed. Each fact is guarded whole or not at all (then it stays assumed).

A check reads dtypes, ranks and `isinstance` only: no data-dependent branch, no host sync, nothing
`torch.compile` breaks its graph on, and nothing TorchScript cannot compile (it refines an Optional through
`is None` and `isinstance`), so scripted functions are guarded too. Deleted module calls are checked by a helper
computed above the `if` out of TorchScript's sight (attention.module_guard). It reads names at the start of the guarded
statements that must hold there what the block read (same reaching definitions, no attribute written
in between), and it cannot raise: a value that is not a tensor fails the check and runs the original.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.patterns import masks as mk
from advisor.patterns import scope
from advisor.patterns.attention.attn_mask import DTYPE_KEEPING_VIEWS
from advisor.patterns.attention.candidate import MAX_REBINDINGS, Candidate, defined_between, in_inlined, \
    one_assigned_value
from advisor.contracts.emitted_names import GUARD_BUILTINS, MODULE_CHECK_LOCAL
from advisor.patterns.attention.causal import CAUSAL_EXTENT, mask_base, triangle_side
from advisor.patterns.attention.lengths import KV_LENGTH, SAME_SHAPE, SWAPS
from advisor.patterns.attention.operand_ranks import BADDBMM_INPUT, BMM_BATCH, OPERAND_RANK, batched_operands, \
    dropped_input_unsized, rank_check, unproved_ranks
from advisor.patterns.attention.module_guard import MODULE_FACTS, MODULE_IDENTITY, called_only_if_not_none, \
    is_module_check, module_checks
from advisor.patterns.attention.rendering import as_home_expression
from advisor.patterns.attention.result import AttentionMatch, MaskTerm, Refusal
from advisor.patterns.attention.tensor_facts import causal_rank_unproved, rank_bounds, term_rank, weights_dtype
from advisor.patterns.attention.scale import SCALE_NONZERO, SCALE_POSITIVE, divisors_read
from advisor.patterns.attention.tensor_scale import BROADCAST, DTYPE, TENSOR_NONZERO
from advisor.patterns.attention.weights import DROPOUT_RANGE, DROPOUT_TRAINING, FX_DROPOUT_MODE, IN_PLACE_DROPOUT
from advisor.patterns.copy_cast_roles import cast_dtype
from advisor.patterns.module_values import module_value
from advisor.patterns.ops import int_value, number_value, views_another_dtype
from advisor.static.codegen import atomic, joined, parenthesized
from advisor.static.dataflow import UNDEFINED, bound_names, loaded_names
from advisor.static.walk import descendants

QKV_DTYPE, MASK_DTYPE, MASK_RANK, SCALE = "qkv-dtype", "mask-dtype", "mask-rank", "scale-is-number"
MASK_FACTS = (mk.ROWS, MASK_DTYPE, MASK_RANK)  # facts about the masks alone
GUARDABLE = (SCALE, SCALE_NONZERO, SCALE_POSITIVE, DROPOUT_RANGE, DROPOUT_TRAINING, IN_PLACE_DROPOUT, FX_DROPOUT_MODE,
             BROADCAST, DTYPE, TENSOR_NONZERO, QKV_DTYPE, MASK_DTYPE, MASK_RANK, mk.ROWS, CAUSAL_EXTENT,
             KV_LENGTH, OPERAND_RANK, BMM_BATCH, BADDBMM_INPUT, *MODULE_FACTS)
# a tensor scale folded into the query (see `tensor_scale`): a number, or a tensor of size 1 in the key axis
TENSOR_SCALE_CHECKS = {
    BROADCAST: "isinstance({s}, (int, float)) or isinstance({s}, {torch}.Tensor) and {s}.dim() <= {q}.dim() "
               "and ({s}.dim() == 0 or {s}.shape[-1] == 1)",
    DTYPE: "not isinstance({s}, {torch}.Tensor) or {s}.dim() == 0 or {s}.dtype == {q}.dtype"}
# library functions that compute a number of numbers, and run no code of the user's on a tensor, nor sync a device
# (`np.sqrt(self.d_k)`: a tensor there gives a tensor, or raises as the original would); not `max`/`min` (compare)
PURE_ARITHMETIC = frozenset({"numpy.sqrt", "abs", "pow", "round"})
# calls that keep a mask's rank (the views that keep a dtype are attn_mask.DTYPE_KEEPING_VIEWS)
SAME_RANK = frozenset({"logical_not", "bool", "float", "half", "to", "type_as", "contiguous"})
OPERANDS_READ = (KV_LENGTH, OPERAND_RANK, BMM_BATCH)  # facts whose checks read the operands, not q alone
# facts whose checks read no query (Python numbers, the operands): a query that cannot be read again (`q[:, i:j]`)
# does not keep them from a check
QUERY_FREE = (SCALE, SCALE_NONZERO, SCALE_POSITIVE, DROPOUT_RANGE, DROPOUT_TRAINING, IN_PLACE_DROPOUT, TENSOR_NONZERO,
              *OPERANDS_READ)


def plan_guards(c: Candidate, output_statement: cst.CSTNode) -> None:
    """The run-time check of each assumed metadata fact that can be checked (`match.guard_checks`), and the
    statements it would guard; `settle_guards` uses those facts that nothing stronger (call sites) proved."""
    match = c.match
    wanted = [name for name in GUARDABLE if any(f.name == name for f in match.facts.assumptions)]
    torch_name = c.parsed.module_aliases.get("torch")
    if torch_name in c.parsed.rebound_by_imports or not c.parsed.builtins_intact(GUARD_BUILTINS):
        torch_name = None  # a star import or `exec` may bind `torch` or the builtins the checks call anew
    traced = scope.fx_traced(c.parsed) is not None
    recorded = scope.jit_traced(c.parsed) is not None
    if torch_name is None:  # checks that name no torch attribute (nor a builtin) only
        wanted = [name for name in wanted if name in OPERANDS_READ and not traced and not recorded]
    if not wanted or scope.real_tensor_traced(c.parsed) is not None:
        return  # traced on tensors, a guard is decided once: the facts stay assumed
    span = span_of(c, output_statement)
    leaves = (c.leaf_nodes[0], c.leaf_nodes[1], c.weights.value_node)
    query, key, value = (_passed(c, _peeled(node, DTYPE_KEEPING_VIEWS)) for node in leaves)
    leaves_query = query
    if span is None:
        return
    scaled_from, numbers = _under_number_scale(c, query)
    for name in wanted:
        query = scaled_from if name in (MASK_RANK, mk.ROWS) else key if name in OPERANDS_READ else leaves_query
        if not _plain(c, query) and name not in MODULE_FACTS and name not in QUERY_FREE:
            continue
        absent = _absent_checks(c, match.masks) if name == mk.ROWS else []
        if name == mk.ROWS and not absent:
            _plan_absent_under_if(c, span, output_statement, query)
        if name == QKV_DTYPE:
            dtypes = [_dtype_of(c, node, torch_name) for node in (query, key, value)]
            named = weights_dtype(c)
            dtypes += [parse_template_expression(f"{{torch}}.{named}", torch=cst.Name(torch_name))] if named else []
            reads = [node for node in (query, key, value) if _plain(c, node)]
            parts = [joined_comparison(dtypes)] if None not in dtypes else []
            if parts and c.product_casts:  # the original casts integer operands to float; SDPA takes floats only
                parts.append(parse_template_expression("{q}.is_floating_point()", q=query))
        elif name == mk.ROWS and match.row_fixup is not None:  # the fill overflows these: the original raises
            reads = [query]
            parts = [parse_template_expression(f"{{q}}.dtype != {{torch}}.{dtype}", q=query, torch=cst.Name(torch_name))
                     for dtype in match.row_fixup.unfit]
        elif absent:  # SDPA without a mask where every mask is None
            reads, parts = [query] + [t.source for t in match.masks], absent
        elif name == mk.ROWS and (tables := _tables_in_doubt(match)):  # learned wherever it is an nn.Parameter
            owner = _self_read(match)
            reads = [cst.Attribute(owner, cst.Name(table)) for table in tables] if owner else []
            parts = [parse_template_expression("isinstance({t}, {torch}.nn.Parameter)", t=table,
                                               torch=cst.Name(torch_name)) for table in reads]
        elif name == mk.ROWS:  # bottom-right causal triangles keep key 0 wherever S >= L
            reads = [match.query, match.key]
            parts = [parse_template_expression("{q}.shape[-2] <= {k}.shape[-2]", q=match.query, k=match.key)] \
                if all(t.keeps_first_key or t.bottom_right for t in match.masks) and \
                all(_plain(c, node) for node in reads) else []
        elif name == FX_DROPOUT_MODE:  # a Proxy while torch.fx traces: the tracer records the original
            reads = [query]
            parts = [parse_template_expression("isinstance({q}, {torch}.Tensor)", q=query,
                                               torch=cst.Name(torch_name))] if _plain(c, query) else []
        elif name == CAUSAL_EXTENT:
            reads, parts = _causal_extent_check(c, span[0], output_statement, torch_name)
        elif name == BADDBMM_INPUT:  # at beta=0 also its shape: exactly the scores' (a broadcast one runs the original)
            bias, (k, k_size) = _passed(c, c.core.params["input"]), _length_read(match.key)
            sized = dropped_input_unsized(c)
            reads = [bias, query, k] if sized else [bias, query]
            parts = [parse_template_expression("{b}.dtype == {q}.dtype", b=bias, q=query)] + \
                ([parse_template_expression("{b}.shape == {q}.shape[:-1] + {k}", b=bias, q=query, k=k_size)]
                 if sized else []) if _plain(c, bias, indexed=True) and (not sized or _view_of_plain(c, k)) else []
        elif name == OPERAND_RANK:  # read under the casts and transposes around them
            checks = [rank_check(_passed(c, node), rank) for node, rank in unproved_ranks(c)]
            reads = [read for read, _ in checks]
            parts = [check for _, check in checks] if all(_view_of_plain(c, node) for node in reads) else []
        elif name == KV_LENGTH:  # read again as SDPA gets them: views of the block's own reads
            (k, k_size), (v, v_size) = _length_read(match.key), _length_read(match.value)
            reads = [k, v]
            parts = [parse_template_expression("{k} == {v}", k=k_size, v=v_size)] \
                if all(_view_of_plain(c, node) for node in reads) else []
        elif name == BMM_BATCH:  # as the products take them: views of the block's own reads
            batches = [_batch_read(_passed(c, node)) for node in batched_operands(c)]
            reads = [t for t, _ in batches]
            parts = [joined_comparison([size for _, size in batches])] \
                if all(_view_of_plain(c, node) for node in reads) else []
        elif name in TENSOR_SCALE_CHECKS:
            reads = [query] + [_passed(c, s) for s in c.tensor_scale_reads.get(name, [])]
            parts = [check for scale in reads[1:]
                     for check in _tensor_scale_checks(c, name, scale, query, torch_name)] \
                if all(_arithmetic_of_plain(c, scale) for scale in reads[1:]) else []
        elif name == TENSOR_NONZERO:  # a tensor of an int: nonzero exactly where the int is
            reads = [_passed(c, n) for n in c.tensor_scale_reads.get(name, [])]
            parts = [parse_template_expression("isinstance({n}, int) and {n} != 0", n=n) for n in reads] \
                if reads and all(_arithmetic_of_plain(c, n) for n in reads) else []
        elif name in MODULE_FACTS:
            reads, parts = module_checks(c, torch_name)
        elif name == SCALE_NONZERO:  # where it is 0, NaN, inf or not a number the original runs (TorchScript's
            # float `t == t` is True for NaN, `t * 0.0 == 0.0` is not)
            reads = [_passed(c, s) for s in divisors_read(c, c.factors)]
            parts = [parse_template_expression("isinstance({s}, (int, float)) and {s} != 0 and {s} * 0.0 == 0.0", s=s)
                     for s in reads] \
                if reads and all(_plain(c, s) for s in reads) else []
        elif name == SCALE_POSITIVE:  # a Python number above 0 (NaN is not); anything else runs the original
            reads = [_passed(c, s) for s in c.positive_reads]
            parts = [parse_template_expression("isinstance({s}, (int, float)) and {s} > 0", s=s) for s in reads] \
                if reads and all(_plain(c, s) for s in reads) else []
        elif name == IN_PLACE_DROPOUT:  # drops nothing, so writes nothing; else the original runs (and raises)
            training, p = (_passed(c, node) for node in c.inplace_dropout)
            reads = [training, p]
            parts = [parse_template_expression("not {t} or {p} == 0", t=atomic(training), p=atomic(p))] \
                if all(_plain(c, node) or number_value(node) is not None for node in reads) else []
        elif name == DROPOUT_RANGE:  # a Python number in range; anything else (a tensor too) runs the original
            reads = [_passed(c, p) for p in c.dropout_reads]
            parts = [parse_template_expression("isinstance({p}, (int, float)) and 0.0 <= {p} <= 1.0", p=p)
                     for p in reads] if all(_plain(c, p) for p in reads) else []
        elif name == DROPOUT_TRAINING:  # a bool; anything else runs the original, which raises
            reads = [_passed(c, t) for t in c.training_reads]
            parts = [parse_template_expression("isinstance({t}, bool)", t=t) for t in reads] \
                if reads and all(_plain(c, t) for t in reads) else []
        elif name == SCALE:
            reads = [_passed(c, c.values.scalar_expression(factor)) for _, factor in c.factors
                     if c.values.scalar_guess(factor) is not None]
            parts = [parse_template_expression("isinstance({s}, (int, float))", s=scale) for scale in reads] \
                if all(_arithmetic_of_plain(c, scale) for scale in reads) else []
        else:
            terms = [t for t in match.masks if t.source is not None and _needs(name, t)]
            ranks = [_known_rank(c, t) if name == MASK_RANK else None for t in terms]
            tabled = [name == MASK_DTYPE and bool(t.tables) for t in terms]
            # the query's rank where the source fixes it: the check then reads no query, which may not yet be the
            # one SDPA gets where the guarded statements begin (`q = q * s` before `q = q.view(...)`, fairseq's)
            q_rank = _exact_rank(c, query) if name == MASK_RANK and all(k is None for k in ranks) else None
            reads = ([query] if q_rank is None else []) + \
                [_origin(c, _checked(c, name, t), span[0], _rank_subject if name == MASK_RANK else _dtype_subject)[0]
                 for t, known, by in zip(terms, ranks, tabled) if known is None and not by] + \
                [table for t, by in zip(terms, tabled) if by for table in t.tables]
            parts = [_tables_dtype_check(c, term, query) if by else
                     _mask_check(c, name, term, query, torch_name, span[0], q_rank) if known is None else
                     parse_template_expression(f"{{q}}.dim() >= {known}", q=query)
                     for term, known, by in zip(terms, ranks, tabled)]
        if parts and query is not leaves_query and name not in OPERANDS_READ:  # q read where the factors are numbers
            parts = [parse_template_expression("isinstance({s}, (int, float))", s=s) for s in numbers] + parts
            reads = reads + numbers
        if parts and traced and name not in MODULE_FACTS and name != FX_DROPOUT_MODE and \
                not all(_is_none_test(part) for part in parts):
            # under torch.fx q is a Proxy, whose dtypes and dims decide no `if`: the original is traced
            parts = [parse_template_expression("isinstance({q}, {torch}.Tensor)", q=query,
                                               torch=cst.Name(torch_name))] + parts if _plain(c, query) else []
            reads = reads + [query]
        if parts and recorded and name not in MODULE_FACTS:  # torch.jit.trace would keep the branch its example
            # inputs took for every later input: while tracing, the original is recorded
            parts = [parse_template_expression("not {torch}.jit.is_tracing()", torch=cst.Name(torch_name))] + parts
        lifted = _lifted(c, span, reads) if parts else None
        if parts and None not in parts and lifted is not None and \
                holds_at(c, span[0], output_statement, reads, lifted):
            match.guard_checks[name] = parts
            match.guard_lifted.extend(line for line in lifted if line not in match.guard_lifted)
            match.masks_absent = match.masks_absent or bool(absent)
    match.guard_span = span


def _passed(c: Candidate, node: cst.BaseExpression) -> cst.BaseExpression:
    """A read in a helper the block calls (`q`, `self.hd` in `def _scores(self, q, k)`) as its call site passes
    it, a read of the guarded function that a check can make again; any other node as it is."""
    if not in_inlined(c, node):
        return node
    try:
        return as_home_expression(c, node)
    except Refusal:
        return node


def _tables_in_doubt(match: AttentionMatch) -> list[str]:
    """The learned tables whose identity alone keeps `fully-masked-rows` assumed (bindings by computed names
    elsewhere may put a plain tensor where the class binds an `nn.Parameter` or None): every term not proved
    learned reads only such tables. Where each is an `nn.Parameter` when the block runs, it is a learned table as
    any the class builds (trained values: the accepted fact of learned biases); [] where anything else is in
    doubt."""
    doubted = [term for term in match.masks if not term.learned]
    if not doubted or not all(term.learned_rebound and term.checked_tables for term in doubted):
        return []
    return list(dict.fromkeys(table for term in doubted for table in term.checked_tables))


def _self_read(match: AttentionMatch) -> cst.Name | None:
    """A read of `self` in the block's own mask terms (the check reads the tables through it, so the flow knows it
    holds the instance the block reads)."""
    return next((name for term in match.masks if term.source is not None for name in loaded_names(term.source)
                 if name.value == "self"), None)


def refuse_unguarded_modules(c: Candidate) -> None:
    """A deleted module call that the file itself may rebind is exact only behind its check: refused without one."""
    if c.module_refusal is not None and MODULE_IDENTITY not in c.match.guard_checks:
        raise Refusal(c.module_refusal)


def settle_guards(match: AttentionMatch, masks_seen: bool = False) -> None:
    """Guard the facts planned for it that are still assumed; the patch then runs the SDPA path behind their
    check (`match.guard`) and the original block where it fails. Masks each under its own `if m is not None:` are
    guarded by their absence where only facts about them would stay assumed, unless `masks_seen` (a run saw them
    present with those facts holding on every call: the patch then passes them to SDPA, see fixes.observed)."""
    assumed = {fact.name for fact in match.facts.assumptions}
    if match.absent_under_if is not None and not masks_seen and mk.ROWS in assumed and \
            all(name in MASK_FACTS or name in match.guard_checks for name in assumed):
        absent, lifted, learned_kept = match.absent_under_if
        match.guard_checks.update({name: absent for name in assumed & set(MASK_FACTS)})
        match.guard_lifted.extend(line for line in lifted if line not in match.guard_lifted)
        if not learned_kept:  # else a learned term stays passed: the facts left are the absent masks' alone
            match.masks_absent = True
            _drop_conditional_masks(match)
    checks = {name: parts for name, parts in match.guard_checks.items()
              if any(fact.name == name for fact in match.facts.assumptions)}
    if mk.ROWS in checks and match.masks_absent:  # SDPA runs where every mask is None: no mask, no fact about one
        checks.update({fact.name: checks[mk.ROWS] for fact in match.facts.assumptions
                       if fact.name in (MASK_DTYPE, MASK_RANK)})
        match.attn_mask = None
    code = cst.Module([]).code_for_node
    for name, parts in checks.items():
        match.facts.guard(name, " and ".join(code(part) for part in parts))
    parts = ([match.flag_test] if match.flag_test is not None else []) + _unless_none_merged(
        list({code(atom): atom for group in checks.values() for part in group
              for atom in ([part] if is_module_check(part) else _conjuncts(part))}.values()))
    modules = [part for part in parts if is_module_check(part)]
    if modules:  # computed above the `if`, out of TorchScript's sight (see attention.module_guard)
        match.module_check = modules[0] if len(modules) == 1 else joined(cst.And, [_grouped(m) for m in modules])
        parts = [cst.Name(MODULE_CHECK_LOCAL)] + [part for part in parts if not is_module_check(part)]
    if not parts:
        return
    match.guard = parts[0] if len(parts) == 1 else joined(cst.And, [_grouped(part) for part in parts])


def _unless_none_merged(parts: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """`m is None or A` and `m is None or B` (one mask's dtype and rank checks) as one `m is None or A and B`, each
    conjunct once, in the first one's place: the diff reads each optional mask once."""
    code = cst.Module([]).code_for_node
    merged: list[cst.BaseExpression] = []
    first: dict[str, int] = {}
    for part in parts:
        tested = part.left if isinstance(part, cst.BooleanOperation) and isinstance(part.operator, cst.Or) and \
            not part.lpar and _is_none_test(part.left) else None
        if tested is None or code(tested) not in first:
            if tested is not None:
                first[code(tested)] = len(merged)
            merged.append(part)
            continue
        kept = merged[first[code(tested)]]
        atoms = {code(atom): atom for side in (kept.right, part.right) for atom in _conjuncts(side)}
        merged[first[code(tested)]] = kept.with_changes(right=joined(cst.And, list(atoms.values())))
    return merged


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of an unparenthesised `a and b and ...`, so checks that share one (`isinstance(m, torch.Tensor)`
    of a mask's dtype and rank checks) read it once, in its first place."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And) and not test.lpar:
        return _conjuncts(test.left) + _conjuncts(test.right)
    return [test]


def _absent_checks(c: Candidate, terms: list[MaskTerm]) -> list[cst.BaseExpression]:
    """`m is None` for each mask, where every mask is added only when it is not None (`maybe_add_mask(s, m)`): where
    they are all None no row is masked, so SDPA without a mask is exact; else the original runs. Empty when a mask
    is applied otherwise or is not a plain name or attribute. (Masks under the caller's own `if m is not None:` are
    planned apart, `_plan_absent_under_if`: call sites or a run may still settle their facts with them passed.)"""
    if not terms or not all(term.optional and _plain(c, term.source) for term in terms):
        return []
    return [cst.Comparison(term.source, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]) for term in terms]


def _drop_conditional_masks(match: AttentionMatch) -> None:
    """The SDPA path runs only where every mask is None, so there the `if`s that apply them are never taken: it
    drops them rather than hoist their masks into an `attn_mask` it does not pass."""
    for term in match.masks:
        if term.guard is not None:
            match.hoisted.pop(term.statement, None)
            if not any(term.guard is node for node in match.removed):
                match.removed.append(term.guard)
    match.hoist_anchor = match.hoist_init = None


def _plan_absent_under_if(c: Candidate, span: list[cst.BaseStatement], output_statement: cst.CSTNode,
                          query: cst.BaseExpression) -> None:
    """`m is None` for each mask applied only under its own `if m is not None:` (no `else:`, `m` a plain name or
    attribute that the mask is, up to constant indexing and views), or added by an optional mask helper. Where they
    are all None the original applies no mask, so SDPA without one is exact; else the original runs, indexing and
    broadcasting the mask as before (the check reads only `is None`, so it raises nothing the original would not).
    Kept aside in `match.absent_under_if`: such a mask's facts may still be settled with the mask passed to SDPA.
    A learned score term (a table, a bias module's) needs no absence: its facts are proved, and it is passed where the
    others are None (the check then guards only the facts about them)."""
    tests = [_absence_test(c, term) for term in c.match.masks if not term.learned]
    if not tests or None in tests:
        return
    reads = [query] + tests
    lifted = _lifted(c, span, reads)
    if lifted is not None and holds_at(c, span[0], output_statement, reads, lifted):
        unique = {c.parsed.code(test): test for test in tests}
        c.match.absent_under_if = ([cst.Comparison(test, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))])
                                    for test in unique.values()], lifted,
                                   any(term.learned for term in c.match.masks))


def _absence_test(c: Candidate, term: MaskTerm) -> cst.BaseExpression | None:
    """The plain name or attribute whose None means the original does not apply this mask, if there is one."""
    if term.source is None:
        return None
    if term.optional:
        return term.source if _plain(c, term.source) else None
    guard = term.guard
    test = guard.test if guard is not None and guard.orelse is None else None
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and
            isinstance(test.comparisons[0].operator, cst.IsNot) and
            isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"):
        return None
    base = _peeled(term.source, DTYPE_KEEPING_VIEWS)
    while isinstance(base, cst.Subscript):
        base = base.value
    same = c.parsed.code(base).replace(" ", "") == c.parsed.code(test.left).replace(" ", "")
    return test.left if same and _plain(c, test.left) else None


def _dtype_of(c: Candidate, node: cst.BaseExpression, torch_name: str) -> cst.BaseExpression | None:
    """`x.dtype` for a plain tensor; `torch.float32` for a cast to a literal dtype (`v.float()`), which the SDPA
    call receives as is."""
    target = cast_dtype(c.parsed, node)
    if target is not None:
        return cst.Attribute(cst.Name(torch_name), cst.Name(target))
    return cst.Attribute(node, cst.Name("dtype")) if _plain(c, node) else None


def joined_comparison(operands: list[cst.BaseExpression]) -> cst.Comparison:
    """`a == b == c`."""
    return cst.Comparison(operands[0], [cst.ComparisonTarget(cst.Equal(), operand) for operand in operands[1:]])


def _known_rank(c: Candidate, term: MaskTerm) -> int | None:
    """The most dims a mask of at least 2 can have, when its source bounds them (`self.bias[:, :, a:b, :c]` of a
    4-D buffer): then the rank fact needs only scores of at least that rank, which `q.dim()` shows (the check
    reads no mask, so it also holds where the mask is built inside the guarded statements)."""
    low, high = term_rank(rank_bounds(c), term)
    return high if low >= 2 and high is not None else None


def _needs(name: str, term: MaskTerm) -> bool:
    """The terms each fact is about: added float masks whose dtype the original leaves open, masks of any kind
    passed as they are (not reshaped) for the rank."""
    if name == MASK_DTYPE:
        return term.kind == "float" and not term.same_dtype or term.dtype_subject is not None
    return term.reshape is None


def _checked(c: Candidate, name: str, term: MaskTerm) -> cst.BaseExpression:
    """The tensor a fact's check reads: the mask as the original passes it, or for a bool mask's dtype the tensor
    that dtype is about (MaskTerm.dtype_subject); for a float mask's dtype, the tensor it indexes (`self.mask` of
    `self.mask[:, :, :T, :T]`: indexing keeps the dtype, and its indices may be names the block binds). A mask a
    helper method applies is read as its call passes it."""
    if name != MASK_DTYPE:
        return _passed(c, term.source)
    if term.dtype_subject is not None:
        return _passed(c, term.dtype_subject[0])
    return _unindexed(_peeled(_passed(c, term.source), DTYPE_KEEPING_VIEWS))


def _unindexed(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Subscript):
        node = node.value
    return node


def _is_none_test(part: cst.BaseExpression) -> bool:
    """`m is None`: decided on a Proxy too (it is not None), so torch.fx traces either branch."""
    return isinstance(part, cst.Comparison) and len(part.comparisons) == 1 and \
        isinstance(part.comparisons[0].operator, (cst.Is, cst.IsNot)) and \
        isinstance(part.comparisons[0].comparator, cst.Name) and part.comparisons[0].comparator.value == "None"


def _under_number_scale(c: Candidate, query: cst.BaseExpression) -> tuple[cst.BaseExpression, list]:
    """q of `q / self.temperature` or `q * 0.125` (a pre-scaled query, jadore801120's), and the factors the source
    does not prove numbers: a Python number keeps q's rank and float dtype, so the rank and row checks may read q
    itself, after checking each such factor is one (`isinstance(self.temperature, (int, float))`: a tensor there
    runs the original). A factor neither proved nor a plain read ends the peeling."""
    unproved: list[cst.BaseExpression] = []
    while isinstance(query, cst.BinaryOperation) and isinstance(query.operator, (cst.Multiply, cst.Divide)):
        sides = [(query.right, query.left)] + ([(query.left, query.right)]
                                               if isinstance(query.operator, cst.Multiply) else [])
        factor, rest = next(((f, r) for f, r in sides if c.values.scalar_guess(f) is None or _plain(c, f)),
                            (None, None))
        if factor is None:
            break
        if c.values.scalar_guess(factor) is not None:
            unproved.append(factor)
        query = rest
    return query, unproved


def _exact_rank(c: Candidate, node: cst.BaseExpression) -> int | None:
    low, high = rank_bounds(c).bounds(node)
    return low if low == high else None


def _mask_check(c: Candidate, name: str, term: MaskTerm, query: cst.BaseExpression,
                torch_name: str, first: cst.BaseStatement, q_rank: int | None = None) -> cst.BaseExpression | None:
    """`isinstance(m, torch.Tensor) and <metadata check>`, or `m is None or (...)` for a mask applied under an
    `if` (SDPA's attn_mask=None is "no mask"); None when the mask is not a plain name or attribute."""
    mask, added = _origin(c, _checked(c, name, term), first, _rank_subject if name == MASK_RANK else _dtype_subject)
    base = _unindexed(mask)
    # the original indexes the mask whenever it is not None, unless an `if` of another test guards it
    indexed = term.guard is None or c.parsed.code(term.guard.test).replace(" ", "") == \
        f"{c.parsed.code(base)}isnotNone".replace(" ", "")
    if not _plain(c, mask, indexed=indexed):
        return None
    most = "{q}.dim()" if q_rank is None else str(q_rank)
    check = f"2 <= {{m}}.dim(){f' {_signed(added)}' if added else ''} <= {most}" if name != MASK_DTYPE else \
        "{m}.dtype == {torch}.bool" if term.dtype_subject is not None else "{m}.dtype == {q}.dtype"
    template = "isinstance({base}, {torch}.Tensor) and " + check
    if term.guard is not None:
        template = "{base} is None or " + template
    fields = dict(m=mask, q=query, base=base, torch=cst.Name(torch_name))
    return parse_template_expression(template, **{k: v for k, v in fields.items() if f"{{{k}}}" in template})


def _signed(added: int) -> str:
    """`+ 2` or `- 1`, as the check adds dims to the mask's rank."""
    return f"+ {added}" if added > 0 else f"- {-added}"


def _tables_dtype_check(c: Candidate, term: MaskTerm, query: cst.BaseExpression) -> cst.BaseExpression:
    """`self.rel_pos.table.dtype == q.dtype` for each table a bias module's term gathers (its dtype is theirs), read
    after the module's class check (`self.rel_pos is None or ...` where the module is called only if not None)."""
    checks = [parse_template_expression("{t}.dtype == {q}.dtype", t=table, q=query) for table in term.tables]
    check = checks[0] if len(checks) == 1 else joined(cst.And, checks)
    if not called_only_if_not_none(c, term.module[0], term.module[2]):
        return check
    return parse_template_expression("{m} is None or {check}", m=term.module[2], check=parenthesized(check))


def _peeled(node: cst.BaseExpression, methods: frozenset[str]) -> cst.BaseExpression:
    """The tensor under calls of `methods` (and, for the rank, `~` and comparisons with a number), whose metadata
    the check reads instead of running the calls again."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in methods \
                and not (methods is DTYPE_KEEPING_VIEWS and views_another_dtype(node)):
            node = node.func.value
        elif isinstance(node, cst.Attribute) and node.attr.value in ("mT", "T") and methods is DTYPE_KEEPING_VIEWS:
            node = node.value
        elif methods is SAME_RANK and isinstance(node, cst.UnaryOperation) and \
                isinstance(node.operator, cst.BitInvert):
            node = node.expression
        elif methods is SAME_RANK and isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and \
                isinstance(node.comparisons[0].comparator, (cst.Integer, cst.Float)) and \
                not isinstance(node.comparisons[0].operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)):
            node = node.left
        else:
            return node


def _dtype_subject(mask: cst.BaseExpression) -> tuple[cst.BaseExpression, int]:
    """The tensor whose dtype the check reads: under views that keep it and any indexing (Whisper's and Llama's
    `causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]`, bound inside the guarded statements)."""
    return _unindexed(_peeled(mask, DTYPE_KEEPING_VIEWS)), 0


def _origin(c: Candidate, mask: cst.BaseExpression, first: cst.BaseStatement,
            subject) -> tuple[cst.BaseExpression, int]:
    """`subject(mask)` (the tensor a check reads, and the dims added since), followed back through the names the
    guarded statements (from `first`) bind once to what keeps it (`attn_mask = attn_mask.bool()` under `if attn_mask
    is not None:`, EVA's; `m = m[:, None, None, :]`), so the check reads the tensor as it was where they begin."""
    mask, added = subject(mask)
    start = first.body[0] if isinstance(first, cst.SimpleStatementLine) else first
    before = c.flow.env_before.get(start) or {}
    for _ in range(MAX_REBINDINGS):
        if not isinstance(mask, cst.Name) or before.get(mask.value) == c.flow.reaching.get(mask):  # it holds there
            break
        value = one_assigned_value(c, mask)
        below, more = subject(value) if value is not None else (None, 0)
        if below is None or below is value and not isinstance(value, cst.Name):  # not bound once to what keeps it
            break
        mask, added = below, added + more
    return mask, added


def _rank_subject(mask: cst.BaseExpression) -> tuple[cst.BaseExpression, int]:
    """The tensor whose rank the check reads, under calls that keep the rank, and the dims the block's
    `.unsqueeze(i)` calls and basic indexing add to it (fairseq's `m.unsqueeze(1).unsqueeze(2).to(torch.bool)`: `m`,
    2; nanoGPT's `bias[:, :, :T, :T]` passed in: `bias`, 0)."""
    mask, added = _peeled(mask, SAME_RANK), 0
    while True:
        if (inner := _unsqueeze_of(mask)) is not None:
            mask, added = _peeled(inner, SAME_RANK), added + 1
        elif (change := _basic_index_change(mask)) is not None:
            mask, added = _peeled(mask.value, SAME_RANK), added + change
        else:
            return mask, added


def _basic_index_change(node: cst.BaseExpression) -> int | None:
    """The dims `t[...]` adds to t where every index is a slice (any bounds: it keeps its dim), `...`, None (adds
    one) or an int literal (drops one); None for any other index (a name may hold a tensor: advanced indexing). Where
    t has too few dims the patch's mask raises as the original's does."""
    if not isinstance(node, cst.Subscript):
        return None
    change = 0
    for element in node.slice:
        index = element.slice
        if isinstance(index, cst.Slice) or isinstance(index.value, cst.Ellipsis):
            continue
        if isinstance(index.value, cst.Name) and index.value.value == "None":
            change += 1
        elif int_value(index.value) is not None:
            change -= 1
        else:
            return None
    return change


def _unsqueeze_of(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """t of `t.unsqueeze(i)` (i an int literal): one dim more than t, whatever i (or an IndexError, raised by the
    patch's mask as by the original's)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "unsqueeze" \
            and len(node.args) == 1 and not node.args[0].star and \
            (node.args[0].keyword is None or node.args[0].keyword.value == "dim") and \
            int_value(node.args[0].value) is not None:
        return node.func.value
    return None


def _grouped(part: cst.BaseExpression) -> cst.BaseExpression:
    """`a or b` in parentheses, to stand inside an `and`."""
    if isinstance(part, cst.BooleanOperation) and isinstance(part.operator, cst.Or):
        return parenthesized(part)
    return part


def _plain(c: Candidate, node: cst.BaseExpression, indexed: bool = False) -> bool:
    """A name or attribute chain of the function itself (with `indexed`, also indexed by constants: `m[0]`,
    `m[:, None]`): reading it again runs no code of the user's."""
    while isinstance(node, cst.Attribute) or indexed and isinstance(node, cst.Subscript) and \
            all(_constant_index(element.slice) for element in node.slice):
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self" and \
                c.owner is not None and any(isinstance(statement, cst.FunctionDef) and statement.name.value ==
                                            node.attr.value for statement in c.owner.node.body.body):
            return False  # a property of the class: reading it again runs its code (breaker round 19)
        node = node.value
    return isinstance(node, cst.Name) and not in_inlined(c, node)


def _causal_extent_check(c: Candidate, first: cst.BaseStatement, output_statement: cst.CSTNode, torch_name: str
                         ) -> tuple[list[cst.BaseExpression], list[cst.BaseExpression]]:
    """The causal triangle against the scores' (L, S): its own shape where it can be read again at the guard
    (`self.bias[:, :, :T, :T]`, a name bound before), else the side of its square of ones (`tril(ones(n, n))`).
    Under a folded tensor scale `s` (a learned temperature) the rows are the query's where `s` has 1 or L of them."""
    match = c.match
    q, k = (match.query if not c.tensor_factors else c.unfolded_query), match.key
    scales = [_passed(c, factor) for _, factor in c.tensor_factors]
    if not (_view_of_plain(c, q) and _view_of_plain(c, k) and all(_arithmetic_of_plain(c, s) for s in scales)) or \
            any(c.chain.factor_guards.get(factor) is not None for _, factor in c.tensor_factors):
        return [], []
    reads = [q, k, *scales]
    parts = [check for s in scales for check in _tensor_scale_checks(c, EXTENT_ROWS, s, q, torch_name)]
    for term in (t for t in match.masks if t.kind == "causal"):
        mask, side = mask_base(c, term.source), triangle_side(c, term.source)
        open_rank, most = causal_rank_unproved(c, term)  # more dims than the scores: the original broadcasts up
        if _sliced_plain(c, mask) and holds_at(c, first, output_statement, [mask]):
            reads.append(mask)
            parts.append(parse_template_expression("{m}.shape[-2] == {q}.shape[-2] and {m}.shape[-1] == "
                                                   "{k}.shape[-2]" + (" and {m}.dim() <= {q}.dim()" if open_rank
                                                                      else ""), m=mask, q=q, k=k))
        elif side is not None and _arithmetic_of_plain(c, side) and (not open_rank or most is not None):
            reads.append(side)
            side = side if isinstance(side, (cst.Name, cst.Attribute, cst.Integer)) else parenthesized(side)
            parts.append(parse_template_expression("{n} == {q}.shape[-2] and {n} == {k}.shape[-2]" +
                                                   (f" and {{q}}.dim() >= {most}" if open_rank else ""),
                                                   n=side, q=q, k=k))
        else:
            return [], []
    return reads, parts


def _length_read(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(t, `t.shape[-2:-1]`) of what SDPA gets, read under the casts and last-dims transposes around `t`
    (`k.shape[-1:]` of `k.float().transpose(-2, -1)`): no copy is made to read a size."""
    axis = -2
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method, dims = node.func.attr.value, [int_value(arg.value) for arg in node.args]
        if method in SWAPS and len(dims) == 2 and None not in dims and all(d < 0 for d in dims):
            axis = dims[1] if axis == dims[0] else dims[0] if axis == dims[1] else axis
        elif method not in SAME_SHAPE:
            break
        node = node.func.value
    end = f"{axis + 1}" if axis < -1 else ""  # a slice: a tensor of fewer dims (a 1-D v) fails, never raises
    return node, parse_template_expression(f"{{t}}.shape[{axis}:{end}]", t=node)


def _batch_read(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(t, `t.shape[:1]`) of a bmm operand, read under the casts, the transposes of its last two dims and the
    indexing that keeps the first whole (`q[:, i:end]`) around `t` (a slice: a 0-D tensor fails the check, never
    raises; the rank check rules out the others, and the SDPA path still indexes as the original does)."""
    while True:
        if isinstance(node, cst.Subscript) and _keeps_first_axis(node):
            node = node.value
            continue
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
            break
        method, dims = node.func.attr.value, [int_value(arg.value) for arg in node.args]
        if not (method in SAME_SHAPE or method in SWAPS and len(dims) == 2 and set(dims) <= {1, 2, -1, -2}):
            break
        node = node.func.value
    return node, parse_template_expression("{t}.shape[:1]", t=node)


def _keeps_first_axis(node: cst.Subscript) -> bool:
    """`t[:, ...]` with a whole first slice and no `None` or `...` (which would move the first axis)."""
    first = node.slice[0].slice
    return isinstance(first, cst.Slice) and first.lower is None and first.upper is None and first.step is None and \
        not any(isinstance(e.slice, cst.Index) and (isinstance(e.slice.value, cst.Ellipsis) or
                                                     isinstance(e.slice.value, cst.Name) and
                                                     e.slice.value.value == "None") for e in node.slice)


def _view_of_plain(c: Candidate, node: cst.BaseExpression) -> bool:
    """A plain read under method calls with constant arguments (`k.unsqueeze(1)`, `k.transpose(1, 2)`): evaluating
    it again in the check is a view of the same tensor, never code of the user's."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            all(int_value(arg.value) is not None for arg in node.args):
        node = node.func.value
    return _plain(c, node, indexed=True)


def _sliced_plain(c: Candidate, node: cst.BaseExpression) -> bool:
    """A plain read, or one sliced by plain bounds (`self.bias[:, :, :T, :T]`): reading it again is a view of the
    same tensor, which raises where the original's slice would."""
    while isinstance(node, cst.Subscript):
        for element in node.slice:
            part = element.slice
            bounds = (part.lower, part.upper, part.step) if isinstance(part, cst.Slice) else (part.value,)
            if not all(bound is None or _arithmetic_of_plain(c, bound) or isinstance(bound, cst.Name)
                       and bound.value == "None" for bound in bounds):
                return False
        node = node.value
    return _plain(c, node)


EXTENT_ROWS = "extent-rows"  # a folded scale's rows against the causal triangle's: 1 or the query's
TENSOR_SCALE_TEMPLATES = {**TENSOR_SCALE_CHECKS, EXTENT_ROWS: "not isinstance({s}, {torch}.Tensor) or {s}.dim() < 2 "
                                                             "or {s}.shape[-2] == 1 or {s}.shape[-2] == {q}.shape[-2]"}


def _tensor_scale_checks(c: Candidate, name: str, scale: cst.BaseExpression, query: cst.BaseExpression,
                         torch_name: str) -> list[cst.BaseExpression]:
    """The check of a folded tensor scale's fact: on the scale itself where it is a plain read; where it is computed
    from plain reads (`self.dh ** -0.5`), that the result is a Python number, for which every such fact holds, one
    check for all of them (a tensor there runs the original; so does an int subclass whose `__pow__` gives one,
    breaker round 59, which a check of `self.dh` alone would let through)."""
    if not _plain(c, scale):
        return [parse_template_expression("isinstance({s}, (int, float))", s=scale)]
    return [parse_template_expression(TENSOR_SCALE_TEMPLATES[name], s=scale, q=query, torch=cst.Name(torch_name))]


def _arithmetic_of_plain(c: Candidate, node: cst.BaseExpression) -> bool:
    """Numbers and plain reads joined by arithmetic (`1.0 / self.scale`, `-s ** 0.5`): evaluating it again in the
    check runs no code of the user's and raises where the original's own arithmetic would."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.BinaryOperation):
        return _arithmetic_of_plain(c, node.left) and _arithmetic_of_plain(c, node.right)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        return _arithmetic_of_plain(c, node.expression)
    if isinstance(node, cst.Call) and c.parsed.imported_name(node.func) in PURE_ARITHMETIC and \
            all(not arg.star and arg.keyword is None and _arithmetic_of_plain(c, arg.value) for arg in node.args):
        return True
    return _plain(c, node)


def _constant_index(index: cst.BaseSlice) -> bool:
    if isinstance(index, cst.Index):
        value = index.value
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
            value = value.expression
        return isinstance(value, (cst.Integer, cst.Ellipsis)) or isinstance(value, cst.Name) and value.value == "None"
    return all(part is None or isinstance(part, cst.Integer) for part in (index.lower, index.upper, index.step))


def span_of(c: Candidate, output_statement: cst.CSTNode, extra: list = ()) -> list[cst.BaseStatement] | None:
    """The consecutive statements of one block, in the function that holds the value product, that hold every
    statement the rewrite changes (and `extra`); None when they are not all in one function's blocks."""
    match = c.match
    members = [s for s in [*match.removed, *match.hoisted, match.hoist_anchor, output_statement, *match.unwrap,
                           *match.take, *extra] if s is not None and not in_inlined(c, s)]
    chains = [_blocks_around(c, member) for member in members]
    if any(chain is None for chain in chains):
        return None
    common = [block for block, _ in chains[0] if all(any(b is block for b, _ in chain) for chain in chains[1:])]
    if not common or not isinstance(common[0], cst.IndentedBlock):
        return None
    block = common[0]
    indices = [next(block.body.index(unit) for b, unit in chain if b is block) for chain in chains]
    return list(block.body[min(indices):max(indices) + 1])


def _blocks_around(c: Candidate, node: cst.CSTNode) -> list[tuple[cst.CSTNode, cst.CSTNode]] | None:
    """(block, the statement of that block holding `node`), innermost first, up to the function's body."""
    found = []
    parents = c.parsed.parents
    while node is not c.home:
        parent = parents.get(node)
        if parent is None:
            return None
        if isinstance(parent, (cst.IndentedBlock, cst.SimpleStatementSuite)) and \
                isinstance(node, cst.BaseStatement):
            found.append((parent, node))
        node = parent
    return found


def holds_at(c: Candidate, first: cst.BaseStatement, last: cst.CSTNode, nodes: list[cst.BaseExpression],
             lifted: list[cst.SimpleStatementLine] = ()) -> bool:
    """Every name the check reads holds at the start of the guarded statements what the block read (or is bound
    by a statement `lifted` above them), and no attribute it reads is written before `last` (the value product, or
    the last statement the check decides)."""
    start = first.body[0] if isinstance(first, cst.SimpleStatementLine) else first
    env = c.flow.env_before.get(start)
    if env is None:
        return False
    for node in nodes:
        for name in loaded_names(node):
            if name.value in ("None", "True", "False") or _line_binding(c, name) in lifted:
                continue
            seen = c.flow.reaching.get(name)
            if seen == frozenset({UNDEFINED}) and (module_value(c.parsed, name.value) is not None or
                                                   c.parsed.imported_name(name) is not None):
                continue  # a module-level tensor that nothing in the file rebinds or writes, an import, a builtin
            if seen is None or UNDEFINED in seen or env.get(name.value, frozenset({UNDEFINED})) != seen or \
                    defined_between(c, name, start, name):
                return False
    paths = scope.attribute_paths(c.parsed, nodes)
    return scope.attribute_written_between(c.parsed, c.home, c.owner, paths, c.parsed.line(first) - 1,
                                           c.parsed.end_line(last) + 1) is None


def _lifted(c: Candidate, span: list[cst.BaseStatement],
            nodes: list[cst.BaseExpression]) -> list[cst.SimpleStatementLine] | None:
    """The statements of the guarded run that bind what the check reads (`bias = resolve(n, attn, mask)` between
    the scores and the mask they get), to be run above the check; None where one cannot move there. One moves when
    the rewrite keeps it, every statement before it in the run is one the rewrite deletes (tensor ops, which can
    only raise) and binds none of its names, and it reads, once its reads of the scores' metadata read the query,
    what it read at the start of the run."""
    removed = {c.parsed.parents.get(statement) for statement in c.match.removed}
    renamed = {name for node in c.match.renamed for name in loaded_names(node)}
    env = c.flow.env_before.get(span[0].body[0] if isinstance(span[0], cst.SimpleStatementLine) else span[0])
    found = []
    for node in nodes:
        for name in loaded_names(node):
            line = _line_binding(c, name)
            if line is None or line in found or not any(line is statement for statement in span):
                continue
            before = span[:span.index(line)]
            jumped = {bound.value for statement in before for small in statement.body for bound in bound_names(small)} \
                if all(statement in removed for statement in before) else None
            if env is None or line in removed or jumped is None or \
                    jumped & {bound.value for small in line.body for bound in bound_names(small)}:
                return None
            if descendants(line, (cst.NamedExpr,)):
                return None  # a name bound inside the line before it reads it
            targets = {id(bound) for small in line.body for bound in bound_names(small)}
            for read in (name for name in loaded_names(line) if id(name) not in targets):
                seen = c.flow.reaching.get(read, frozenset({UNDEFINED}))
                outer = read.value not in env and seen == frozenset({UNDEFINED})  # a global or builtin
                # bound between the run's start and the line (the line's own binding, `m = m.eq(0)`, comes after)
                if read not in renamed and not outer and (env.get(read.value) != seen or
                                                          defined_between(c, read, span[0], line)):
                    return None
            found.append(line)
    return found


def _line_binding(c: Candidate, name: cst.Name) -> cst.SimpleStatementLine | None:
    """The one simple statement line whose assignment every path brings to this read, if there is one."""
    seen = c.flow.reaching.get(name, frozenset())
    if len(seen) != 1 or UNDEFINED in seen:
        return None
    line = c.parsed.parents.get(c.flow.definitions[next(iter(seen))].statement)
    return line if isinstance(line, cst.SimpleStatementLine) else None
