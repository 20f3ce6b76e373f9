"""Names advisor writes into user code and reads back: the rewrite emits them, the matcher recognises a patch it
wrote on a second pass. Both sides import them from here, so neither imports the other."""

FLEX_HELPER_NAME = "advisor_flex_attention"
FLASH_HELPER_NAME = "flash_attn_or_sdpa"  # `--backend flash-attn`'s helper (a suffix `_1`, ... where the name is taken)
# the guard of a patch that deletes module calls (see attention.guards.module_checks): a module-level helper that
# says whether a module runs exactly its class's forward with no hooks, and the local that holds its answer
MODULE_CHECK_HELPER = "_advisor_module_runs_plain"
MODULE_CHECK_LOCAL = "_advisor_modules_plain"
FLEX_PRELUDE_PREFIX = "_advisor_flex_"  # the helper's private module-level names (its state and its functions)
# builtins the emitted guards and the module check helper call: the file must leave each of them the builtin
GUARD_BUILTINS = ("isinstance", "int", "float", "bool", "vars", "type", "getattr", "all")


def is_flex_prelude_function(name: str) -> bool:
    """A top-level function of the flex helper's prelude, by name: its dense path is attention written by hand, and
    advisor's own, so a second pass does not report it."""
    return name == FLEX_HELPER_NAME or name.startswith(FLEX_PRELUDE_PREFIX)
