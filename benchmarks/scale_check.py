"""Never crash, never damage, at scale. Scans every `.py` file of the installed transformers package
and a generated tree (each attention fixture in several variants: CRLF line endings, a BOM and coding line, a
comment after every logical line, three renamed copies in one file, no final newline), twice: safe fixes only,
then with unsafe fixes. Every file's fixed text (its fixes applied together) and every finding's own patch,
applied to a copy of the source as `git apply` reads a diff (lines end at `\\n`), must parse and compile.

    python benchmarks/scale_check.py [--only transformers|generated] [--limit N] [--shard I/N] [--unsafe-only]
                                     [--keep DIR]

--limit N takes N files spread evenly over each tree (a quick run). --shard I/N takes every Nth file from the Ith
(1 <= I <= N; after --limit), to run a slow machine's check in N chunks (each chunk is scanned as its own tree, so
facts proved from call sites in other chunks are not).

Prints files, lines, findings, patches, failures and seconds per tree and pass; each failure is listed (file,
rule, what failed) and the exit code is 1 when there is any. No cache is read or written.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tempfile
import time
import tokenize
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "attention"
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


# -- the generated tree ---------------------------------------------------------------------------------------
def _comments(text: str) -> str:
    """A comment at the end of every logical line (before its NEWLINE token)."""
    lines = text.splitlines(keepends=True)
    for token in reversed(list(tokenize.generate_tokens(io.StringIO(text).readline))):
        if token.type == tokenize.NEWLINE and token.string:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col] + "  # note" + lines[row - 1][col:]
    return "".join(lines)


def _copies(text: str, count: int = 3) -> str:
    """`count` copies of the module in one file, the top-level names of copy i suffixed `_i`."""
    names = {node.name for node in ast.parse(text).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    copies = [text]
    for i in range(1, count):
        copy = re.sub(r"(?m)^from __future__ import .*$", "", text)  # allowed only at the top of the file
        for name in names:
            copy = re.sub(rf"\b{re.escape(name)}\b", f"{name}_{i}", copy)
        copies.append(copy)
    return "\n\n".join(copies)


VARIANTS = {
    "plain": lambda text: text.encode(),
    "crlf": lambda text: text.replace("\n", "\r\n").encode(),
    "bom": lambda text: b"\xef\xbb\xbf# -*- coding: utf-8 -*-\n" + text.encode(),
    "comments": lambda text: _comments(text).encode(),
    "copies": lambda text: _copies(text).encode(),
    "no_final_newline": lambda text: text.rstrip("\n").encode(),
}


def generated_tree(into: Path) -> list[str]:
    """Every fixture (not the goldens' fixed side) in every variant, one folder per variant."""
    written = []
    sources = sorted(p for p in FIXTURES.rglob("*.py") if not p.name.endswith(".fixed.py"))
    for name, make in VARIANTS.items():
        folder = into / name
        for source in sources:
            target = folder / source.parent.name / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                data = make(source.read_text(encoding="utf-8"))
                compile(data, str(target), "exec", dont_inherit=True)
            except (SyntaxError, ValueError, tokenize.TokenError):
                continue  # a fixture this variant cannot be made of
            target.write_bytes(data)
            written.append(str(target))
    return written


def transformers_files() -> list[str]:
    import transformers

    return sorted(str(p) for p in Path(transformers.__file__).parent.rglob("*.py"))


# -- applying a diff as `git apply` does ----------------------------------------------------------------------
class PatchMismatch(Exception):
    pass


def apply_patch(source: str, patch: str) -> str:
    """`patch` (a unified diff of this source) applied to it, lines split at `\\n` only, as patch tools read it."""
    lines = source.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    body = [line + "\n" for line in patch.split("\n")]
    body[-1] = body[-1][:-1]
    body = [line for line in body[2:] if line]
    out: list[str] = []
    position = 0
    index = 0
    while index < len(body):
        hit = HUNK.match(body[index])
        if hit is None:
            raise PatchMismatch(f"not a hunk header: {body[index]!r}")
        old_start, old_length = int(hit.group(1)), int(hit.group(2) or 1)
        start = old_start - 1 if old_length else old_start
        if start < position:
            raise PatchMismatch("hunks overlap or go backwards")
        out += lines[position:start]
        position = start
        index += 1
        while index < len(body) and not body[index].startswith("@@"):
            tag, text = body[index][0], body[index][1:]
            if tag in " -":
                if position >= len(lines) or lines[position] != text:
                    raise PatchMismatch(f"line {position + 1} is {lines[position] if position < len(lines) else None!r}"
                                        f", the patch says {text!r}")
                position += 1
            if tag in " +":
                out.append(text)
            if tag not in " -+":
                raise PatchMismatch(f"a hunk line starts with {tag!r}")
            index += 1
    return "".join(out + lines[position:])


def compiles(text: str, path: str) -> str | None:
    """None when `text` parses and compiles, else why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# -- one pass ---------------------------------------------------------------------------------------------------
def check(paths: list[str], unsafe: bool) -> dict:
    from advisor.engine.static import scan_paths

    started = time.perf_counter()
    result = scan_paths(paths, unsafe_fixes=unsafe, patches=True, fixed=True, cache=False)
    seconds = time.perf_counter() - started
    failures = [f"{e.path}: scan error: {e.message}" for e in result.errors if e.internal]
    patches = fixed_files = not_compiling = 0
    for file in result.files:
        applicable = file.applicable()
        if applicable and compiles(file.source, file.path) is not None:
            not_compiling += 1
            continue  # the file itself does not compile (an error only `compile` finds): nothing to compare
        if applicable:
            fixed_files += 1
            why = compiles(file.fixed, file.path)
            if why:
                failures.append(f"{file.path}: the fixed file ({len(applicable)} fixes together) does not compile: "
                                f"{why}")
        for finding in file.findings:
            if not finding.patch or not (finding.fix_safety == "safe" or unsafe):
                continue
            patches += 1
            try:
                patched = apply_patch(file.source, finding.patch)
                why = compiles(patched, file.path)
                if why is None and applicable == [finding] and patched != file.fixed:
                    why = "the patch applied gives another text than the fixed file"
            except PatchMismatch as exc:
                why = f"the patch does not apply: {exc}"
            if why:
                failures.append(f"{file.path}:{finding.line} {finding.rule} ({finding.fix_safety}): {why}")
    return {"files": len(result.files), "lines": sum(f.source.count("\n") + 1 for f in result.files),
            "findings": len(result.findings), "patches": patches, "fixed_files": fixed_files,
            "errors": len(result.errors), "internal": sum(e.internal for e in result.errors),
            "not_compiling": not_compiling, "failures": failures, "seconds": seconds}


def _shard(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise argparse.ArgumentTypeError(f"{text!r} is not I/N with 1 <= I <= N")
    return int(index), int(count)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("transformers", "generated"), default=None)
    parser.add_argument("--limit", type=int, default=None, help="only N files of each tree, spread over it")
    parser.add_argument("--shard", type=_shard, default=(1, 1), metavar="I/N",
                        help="every Nth file of each tree, from the Ith (a chunk of a long run)")
    parser.add_argument("--unsafe-only", action="store_true",
                        help="one pass, with unsafe fixes (every patch one by one, all fixes together), not the safe "
                             "pass first")
    parser.add_argument("--keep", metavar="DIR", default=None, help="write the generated tree here and keep it")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="advisor-scale-") as scratch:
        trees = {}
        if args.only != "generated":
            trees["transformers"] = transformers_files()
        if args.only != "transformers":
            trees["generated"] = generated_tree(Path(args.keep or scratch))
        for name, paths in trees.items():
            paths = paths[:: max(1, len(paths) // args.limit)][: args.limit] if args.limit else paths
            paths = paths[args.shard[0] - 1:: args.shard[1]]
            for unsafe in (True,) if args.unsafe_only else (False, True):
                numbers = check(paths, unsafe)
                failed |= bool(numbers["failures"])
                print(f"{name} ({'safe and unsafe' if unsafe else 'safe'} fixes): {numbers['files']} files, "
                      f"{numbers['lines']} lines, {numbers['findings']} findings, {numbers['patches']} patches "
                      f"applied one by one, {numbers['fixed_files']} files with their fixes together, "
                      f"{numbers['errors']} scan errors ({numbers['internal']} internal), "
                      f"{numbers['not_compiling']} files with fixes that do not compile as they are (skipped), "
                      f"{len(numbers['failures'])} failures, {numbers['seconds']:.1f} s", flush=True)
                for failure in numbers["failures"]:
                    print(f"  FAIL {failure}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
