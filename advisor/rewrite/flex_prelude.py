"""The `advisor_flex_attention` helper that `--backend flex` patches paste into user modules.

Stand-in with the agreed interface (`HELPER_NAME`, `prelude_source`); the runtime helper's own version (branch
s15-flexrt) replaces it at merge. The source is self-contained: it lands in the user's file.
"""

from __future__ import annotations

from string import Template

HELPER_NAME = "advisor_flex_attention"

_PRELUDE = Template('''_advisor_flex_state = {"compiled": None, "eager_reason": None, "block_masks": {}}


def advisor_flex_attention(q, k, v, score_mod=None, mask_mod=None, mask_key=None, scale=None, enable_gqa=False):
    """FlexAttention for a hand-written block (inserted by advisor, `--backend flex`): compiled once per process,
    eager (with one warning) where torch.compile fails; ADVISOR_FLEX_EAGER=1 forces eager."""
    import os
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    state = _advisor_flex_state
    block_mask = None
    if mask_mod is not None:
        key = (mask_key, q.size(0), q.size(1), q.size(-2), k.size(-2), q.device)
        block_mask = state["block_masks"].get(key) if mask_key is not None else None
        if block_mask is None:
            block_mask = create_block_mask(mask_mod, key[1], key[2], key[3], key[4], device=q.device)
            if mask_key is not None:
                state["block_masks"][key] = block_mask
    kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)
    if os.environ.get("ADVISOR_FLEX_EAGER") == "1" or state["eager_reason"] is not None:
        return flex_attention(q, k, v, **kwargs)
    try:
        if state["compiled"] is None:
            state["compiled"] = $torch.compile(flex_attention)
        return state["compiled"](q, k, v, **kwargs)
    except Exception as exc:
        out = flex_attention(q, k, v, **kwargs)
        state["eager_reason"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        warnings.warn(f"advisor_flex_attention: torch.compile failed ({state['eager_reason']}); running eager "
                      "flex_attention from now on", stacklevel=2)
        return out
''')


def prelude_source(torch_name: str = "torch") -> str:
    """Module-level source defining `advisor_flex_attention`, spelling torch as the user's module does."""
    return _PRELUDE.substitute(torch=torch_name)
