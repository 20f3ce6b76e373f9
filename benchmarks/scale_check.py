"""Never crash, never damage, at scale. Scans every `.py` file of the installed transformers package
and a generated tree (each attention fixture in several variants: CRLF line endings, a BOM and coding line, a
comment after every logical line, three renamed copies in one file, no final newline), for each backend: safe
fixes only, then with unsafe fixes. Every file's fixed text (its fixes applied together) and every finding's own
patch, applied to a copy of the source as `git apply` reads a diff (lines end at `\\n`), must parse and compile;
the fixed text must encode as the file does and keep a CRLF file's line endings, and analysed again it must add
no finding and offer no fix (idempotent); a file with nothing to apply keeps its text.

    python benchmarks/scale_check.py [--only transformers|generated] [--limit N] [--shard I/N]
                                     [--backend sdpa flex] [--unsafe-only] [--json FILE] [--keep DIR]

--limit N takes N files spread evenly over each tree (a quick run). --shard I/N takes every Nth file from the Ith
(1 <= I <= N; after --limit), to run a slow machine's check in N chunks (each chunk is scanned as its own tree, so
facts proved from call sites in other chunks are not). --json FILE records each pass as it ends and skips those
it holds without failures, so a check too long for one run goes on shard by shard, one process each.

Prints files, lines, findings, patches, failures and seconds per tree and pass; each failure is listed (file,
rule, what failed) and the exit code is 1 when there is any. No cache is read or written.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tokenize
import warnings
from collections import Counter
from pathlib import Path

ROUNDS = 5  # fix rounds an idempotency check follows, for fixes left out by a conflict
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
def check(paths: list[str], unsafe: bool, backend: str = "sdpa") -> dict:
    """One scan of `paths` (`backend`, safe or also unsafe fixes) and every promise about its output checked."""
    from advisor.engine.static import scan_paths

    started = time.perf_counter()
    result = scan_paths(paths, unsafe_fixes=unsafe, backend=backend, patches=True, fixed=True, cache=False)
    seconds = time.perf_counter() - started
    failures = [f"{e.path}: scan error: {e.message}" for e in result.errors if e.internal]
    safe_patches = unsafe_patches = fixed_files = not_compiling = 0
    tree = None
    for file in result.files:
        applicable = file.applicable()
        failures += untouched(file) if not applicable else []
        if applicable and compiles(file.source, file.path) is not None:
            not_compiling += 1
            continue  # the file itself does not compile (an error only `compile` finds): nothing to compare
        if applicable:
            fixed_files += 1
            why = compiles(file.fixed, file.path) or encodes(file)
            if why is None:
                tree = tree or _tree(paths)
                why = idempotent(file, unsafe, backend, tree)
            if why:
                failures.append(f"{file.path}: the fixed file ({len(applicable)} fixes together): {why}")
        for finding in file.findings:
            if not finding.patch or not (finding.fix_safety == "safe" or unsafe):
                continue
            if finding.fix_safety == "safe":
                safe_patches += 1
            else:
                unsafe_patches += 1
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
            "findings": len(result.findings), "safe_patches": safe_patches, "unsafe_patches": unsafe_patches,
            "fixed_files": fixed_files, "errors": len(result.errors), "internal": sum(e.internal for e in result.errors),
            "not_compiling": not_compiling, "failures": failures, "seconds": round(seconds, 2)}


def untouched(file) -> list[str]:
    """A file with nothing to apply keeps its text (the writer then leaves it alone: `fix --apply` writes only a
    changed text)."""
    return [] if file.fixed == file.source else [f"{file.path}: no fix applies, yet its fixed text differs"]


def encodes(file) -> str | None:
    """None when the fixed text, encoded as the file's own bytes are (BOM, coding line), reads back as that text,
    and keeps the file's line endings: a CRLF file gets no bare LF line."""
    from advisor.static.source_encoding import SourceDecodeError, decode_source, encode_source

    data = Path(file.path).read_bytes()
    text, codec = decode_source(data)
    if text != file.source:
        return "the scanned text is not the file's decoded bytes"
    try:
        written = encode_source(file.fixed, codec)
    except SourceDecodeError as exc:
        return str(exc)
    if decode_source(written) != (file.fixed, codec):
        return "its bytes, once written, do not read back as the fixed text"
    if _bare_newlines(file.source) == 0 < file.source.count("\r\n") and _bare_newlines(file.fixed):
        return f"{_bare_newlines(file.fixed)} lines end in a bare LF in a CRLF file"
    return None


def _bare_newlines(text: str) -> int:
    return text.count("\n") - text.count("\r\n")


def idempotent(file, unsafe: bool, backend: str, tree) -> str | None:
    """None when the fixed text, analysed again at its path with the same tree's facts and options, has no more
    findings of a rule than the original had, and offers no fix (a fix left out for a conflict with another may be
    offered once more: `fix` applies it on the next run, so the rounds must reach a text that offers nothing)."""
    from advisor.engine.static import analyze_source

    text, left_out = file.fixed, file.applied.not_applied
    for _ in range(ROUNDS):
        try:
            again = analyze_source(text, file.path, unsafe, backend=backend, patches=False, tree_context=tree)
        except Exception as exc:  # noqa: BLE001 - the check reports any failure of the second analysis
            return f"analysing the fixed text fails ({type(exc).__name__}: {exc})"
        added = Counter(f.rule for f in again.findings) - Counter(f.rule for f in file.findings)
        if added and text == file.fixed:
            return "fixing it adds findings: " + ", ".join(f"{f.rule} at line {f.line} ({f.function})"
                                                           for f in again.findings if f.rule in added)
        offered = again.applicable()
        if not offered:
            return None
        if not left_out:
            return "fixing it again offers " + ", ".join(f"{f.rule} at line {f.line}" for f in offered)
        text, left_out = again.applied.text, again.applied.not_applied
        why = compiles(text, file.path)
        if why:
            return f"the next round of fixes does not compile: {why}"
    return f"still offers fixes after {ROUNDS} rounds"


def _tree(paths: list[str]):
    """The tree context the scan computed (the same files, the same call-site setting), for analysing fixed texts."""
    from advisor.static.discover import discover
    from advisor.static.tree_facts import tree_context

    return tree_context(discover(paths)[0])


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
    parser.add_argument("--backend", nargs="+", choices=("sdpa", "flex"), default=["sdpa", "flex"],
                        help="the attention backends the rewrites target, one pass each (default: both)")
    parser.add_argument("--unsafe-only", action="store_true",
                        help="one pass, with unsafe fixes (every patch one by one, all fixes together), not the safe "
                             "pass first")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="record each pass here and skip the passes it holds (a long run resumed chunk by chunk)")
    parser.add_argument("--keep", metavar="DIR", default=None, help="write the generated tree here and keep it")
    args = parser.parse_args()
    record = Record(Path(args.json), {"limit": args.limit, "shards": args.shard[1]}) if args.json else None
    if record is not None and record.problem:
        print(f"scale_check: {record.problem}", file=sys.stderr)
        return 2
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
            for backend in args.backend:
                for unsafe in (True,) if args.unsafe_only else (False, True):
                    key = f"{name} {backend} {'unsafe' if unsafe else 'safe'} {args.shard[0]}/{args.shard[1]}"
                    numbers = record.done(key) if record is not None else None
                    if numbers is None:
                        numbers = {**check(paths, unsafe, backend), "commit": _commit()}
                        if record is not None:
                            record.add(key, numbers)
                        print(_line(key, numbers), flush=True)
                        for failure in numbers["failures"]:
                            print(f"  FAIL {failure}", flush=True)
                    failed |= bool(numbers["failures"])
    if record is not None:
        print(record.totals(), flush=True)
    return 1 if failed else 0


def _line(key: str, numbers: dict) -> str:
    return (f"{key}: {numbers['files']} files, {numbers['lines']} lines, {numbers['findings']} findings, "
            f"{numbers['safe_patches']} safe and {numbers['unsafe_patches']} unsafe patches applied one by one, "
            f"{numbers['fixed_files']} files with their fixes together, {numbers['errors']} scan errors "
            f"({numbers['internal']} internal), {numbers['not_compiling']} files with fixes that do not compile as "
            f"they are (skipped), {len(numbers['failures'])} failures, {numbers['seconds']:.1f} s")


def _commit() -> str:
    """advisor's commit the pass ran on (`+` when the work tree had changes), so a resumed run says what it mixes."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


class Record:
    """The passes of a long run, one JSON entry each ("TREE BACKEND safe|unsafe I/N"), written after each pass so
    that the next run, of this shard or another, skips what is done. The options that change what a shard holds
    (--limit, the shard count) must match the file's."""

    def __init__(self, path: Path, options: dict):
        self.path, self.options, self.runs, self.problem = path, options, {}, None
        if path.exists():
            data = json.loads(path.read_text())
            if data["options"] != options:
                self.problem = f"{path} holds a run with {data['options']}, not {options}: use another file"
            self.runs = data["runs"]

    def done(self, key: str) -> dict | None:
        """The pass's numbers when it is recorded without failures (one with failures runs again, after a fix)."""
        numbers = self.runs.get(key)
        return numbers if numbers is not None and not numbers["failures"] else None

    def add(self, key: str, numbers: dict) -> None:
        self.runs[key] = numbers
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({"options": self.options, "runs": self.runs}, indent=1))
        os.replace(partial, self.path)

    def totals(self) -> str:
        """The recorded passes summed per tree, backend and pass, with how many of the shards they cover."""
        groups: dict[str, list[dict]] = {}
        for key, numbers in self.runs.items():
            groups.setdefault(key.rsplit(" ", 1)[0], []).append(numbers)
        lines = [f"recorded in {self.path} ({self.options['shards']} shards):"]
        for group, runs in sorted(groups.items()):
            summed = {field: sum(run[field] for run in runs) for field in runs[0]
                      if field not in ("failures", "commit")}
            summed["failures"] = [failure for run in runs for failure in run["failures"]]
            commits = ", ".join(sorted({run.get("commit", "?") for run in runs}))
            lines.append(_line(f"{group} ({len(runs)} of {self.options['shards']} shards)", summed) +
                         f", on {commits}")
        return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
