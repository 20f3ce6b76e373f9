"""One module per CLI verb. Each has add_parser(subparsers) and sets `run` to a function(args) -> exit code."""
