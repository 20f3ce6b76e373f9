"""Hand-written attention as roles, proved one by one.

Anchor: every softmax in a function. Backwards from its input, peel the score chain (casts, scale factors,
masks) down to the Q·K^T product; forwards from its output, follow the weights through casts and dropout to
the weights·V product. Each role is then proved: K transposed on the last two dims (or re-transposed
explicitly), scale a Python number, mask polarity and fill, softmax over the key axis, dropout flag, every
intermediate read only inside the block. Anything unproved becomes a refusal with a one-sentence reason.
"""

from advisor.patterns.attention.matcher import find_attention
from advisor.patterns.attention.result import AttentionMatch, MaskTerm, Refusal

__all__ = ["AttentionMatch", "MaskTerm", "Refusal", "find_attention"]
