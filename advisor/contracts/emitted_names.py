"""Names advisor writes into user code and reads back: the rewrite emits them, the matcher recognises a patch it
wrote on a second pass. Both sides import them from here, so neither imports the other."""

FLEX_HELPER_NAME = "advisor_flex_attention"
# the guard of a patch that deletes module calls (see attention.guards.module_checks): a module-level helper that
# says whether a module runs exactly its class's forward with no hooks, and the local that holds its answer
MODULE_CHECK_HELPER = "_advisor_module_runs_plain"
MODULE_CHECK_LOCAL = "_advisor_modules_plain"
