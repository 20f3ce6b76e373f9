"""libcst rewrites: build replacement code from proved roles, apply edits, make diffs, write files safely."""
