"""Names of aten ops (as the dispatch recorder sees them) grouped by what they do to data and layout."""

VIEWS = frozenset({"view", "_unsafe_view", "_reshape_alias", "expand", "transpose", "permute", "t", "unsqueeze",
                   "squeeze", "slice", "select", "as_strided", "alias", "split", "split_with_sizes", "unbind",
                   "narrow", "detach", "unflatten", "flatten"})
MATMULS = frozenset({"bmm", "mm", "baddbmm", "matmul"})
SOFTMAXES = frozenset({"_softmax", "_safe_softmax", "softmax"})
COPIES = frozenset({"clone", "_to_copy", "copy_", "contiguous"})
TRANSPOSES = frozenset({"transpose", "permute", "t"})
# Ops whose kernels take any strides: a .contiguous() feeding only these buys nothing.
STRIDED_OK = MATMULS | frozenset({"addmm", "add", "sub", "mul", "div", "_softmax", "_safe_softmax", "masked_fill",
                                  "where", "gelu", "silu", "relu", "tanh", "sigmoid", "exp", "pow", "rsqrt",
                                  "sum", "mean", "neg", "cat", "clamp", "maximum", "minimum"})
FACTORIES = frozenset({"ones", "zeros", "full", "empty", "arange", "eye", "scalar_tensor", "ones_like",
                       "zeros_like", "full_like", "empty_like", "new_ones", "new_zeros", "new_full", "new_empty",
                       "empty_strided", "lift_fresh"})
FUSED_SDPA = frozenset({"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                        "_flash_attention_forward", "_efficient_attention_forward",
                        "_scaled_dot_product_fused_attention_overrideable"})


def matmul_operands(op: str) -> tuple[int, int]:
    """Input numbers of the two factors A and B of a recorded A·B (baddbmm's first input is the added term)."""
    return (1, 2) if op == "baddbmm" else (0, 1)


def consumers(graph, node: int, through_views: bool = False) -> list[int]:
    """Ops that read `node`'s output; with through_views, view chains are followed to their real users."""
    result, stack, seen = [], list(graph.successors(node)), set()
    while stack:
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if through_views and graph.nodes[user]["op"] in VIEWS:
            stack.extend(graph.successors(user))
        else:
            result.append(user)
    return sorted(result)


def in_sdpa_call(op_graph, node: int) -> bool:
    return in_call(op_graph, node, "scaled_dot_product_attention")


def in_call(op_graph, node: int, name: str) -> bool:
    """Was `node` dispatched inside a watched call of that name (advisor.runtime.recorder._WATCHED_CALLS)?"""
    return any(c.name == name and c.first_op <= node < c.last_op for c in op_graph.calls)
