"""SDPA calls that ran the math kernel: no fused kernel op was dispatched inside the call."""

from __future__ import annotations

from advisor.contracts.detection import Detection
from advisor.contracts.rule import Rule
from advisor.backends.eligibility import backend_eligibility, to_json
from advisor.backends.tensor_eligibility import facts_from_shapes
from advisor.runtime.detect.op_kinds import FUSED_SDPA
from advisor.runtime.sdpa_fallback import SdpaArgs, fallback_reasons


def detect(op_graph, device: str, rule: Rule) -> list[Detection]:
    graph = op_graph.graph
    found = []
    for call in op_graph.calls:
        if call.name != "scaled_dot_product_attention" or call.loc is None or len(call.inputs) < 3:
            continue
        ops = range(call.first_op, call.last_op)
        if any(graph.nodes[n]["op"] in FUSED_SDPA for n in ops if n in graph):
            continue
        q, k, v = call.inputs[:3]
        args = SdpaArgs(list(q.shape), list(k.shape), list(v.shape), str(q.dtype).replace("torch.", ""),
                        [t.stride[-1] if t.stride else None for t in (q, k, v)], call.options["has_mask"],
                        call.options["dropout_p"], call.options["is_causal"])
        reasons = fallback_reasons(args, device) or ["not determined from the arguments"]
        facts = facts_from_shapes(args.q_shape, args.k_shape, args.v_shape, args.dtype, args.last_strides,
                                  "given" if args.has_mask else None, args.dropout_p, bool(args.is_causal), device,
                                  call.options.get("enable_gqa"))
        found.append(Detection(
            rule.code, call.loc, call.loc.line, frozenset(n for n in ops if n in graph),
            "scaled_dot_product_attention ran the math kernel: " + "; ".join(reasons),
            {"kernel": "math", "reasons": reasons, "q_shape": args.q_shape, "dtype": args.dtype,
             "has_mask": args.has_mask, "dropout_p": args.dropout_p,
             "backends": to_json(backend_eligibility(facts))}))
    return found
