"""Names advisor writes into user code and reads back: the rewrite emits them, the matcher recognises a patch it
wrote on a second pass. Both sides import them from here, so neither imports the other."""

FLEX_HELPER_NAME = "advisor_flex_attention"
