"""Static half: find files, parse them with libcst, build per-function dataflow graphs. Never runs user code."""
