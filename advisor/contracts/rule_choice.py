"""The rules a verb without --select/--ignore of its own runs where (`optimize`): [tool.advisor]'s select and
ignore, and its path rules (advisor.config.PathRules: exclude, per-file-ignores), which the surface reads and the
verification pipeline obeys (promise breaker round 31: an ignored rule's patch was applied)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class PathChoice(Protocol):
    def excludes(self, path: str) -> bool: ...

    def ignored_codes(self, path: str) -> list[str]: ...


@dataclass(frozen=True)
class RuleChoice:
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    paths: PathChoice | None = None

    def excludes(self, path: str) -> bool:
        return self.paths is not None and self.paths.excludes(path)

    def codes(self, path: str) -> tuple[list[str] | None, list[str]]:
        """(select, ignore) for one file."""
        ignored = self.paths.ignored_codes(path) if self.paths is not None else []
        return list(self.select) if self.select is not None else None, [*self.ignore, *ignored]
