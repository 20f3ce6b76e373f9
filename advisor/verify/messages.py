"""What advisor and a workload worker say to each other (`verify/process.py` sends, `verify/worker.py` answers).

Each request is a frozen dataclass, one per thing a worker does, and the worker dispatches on its type. Each reply is
`Ok(value)`, `Failed(line)` (user code raised or exited; the worker is still usable) or, before either, any number
of `Progress(text)`. The values the parent reads field by field are dataclasses too; `to_json` where a value ends
up in a report's JSON. Both sides import this module, so it imports nothing heavier than the contracts: a pickled
value must be readable on both sides without importing the engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from advisor.contracts.evidence import RuntimeEvidence


# -- requests ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """A request; `name` is how error messages name it (`the original process did not finish \\`run\\` ...`)."""

    name: ClassVar[str] = "request"


@dataclass(frozen=True)
class Hello(Request):
    """First request: import like the parent (its sys.path), set the thread count, overlay the patched files.
    Reply: WorkerInfo."""

    name: ClassVar[str] = "hello"
    sys_path: tuple[str, ...]
    threads: int | None = None
    overlay: dict[str, str] | None = None  # path -> patched text
    overlay_root: str | None = None


@dataclass(frozen=True)
class ModelState:
    """The original side's weights and inputs on the CPU, for the patched side to load (Export's reply)."""

    state_dict: dict[str, Any]
    args: Any
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Load(Request):
    """Import TARGET and build its workload, or with `script` (argv) run that script to its model's `calls`-th call;
    with `state` take the original's weights and inputs. Reply: Loaded."""

    name: ClassVar[str] = "load"
    target: str
    device: str | None = None
    dtype: str | None = None
    train: bool = False
    state: ModelState | None = None
    script: list[str] | None = None
    calls: int = 1
    roots: tuple[str, ...] = ()


@dataclass(frozen=True)
class Export(Request):
    """Reply: ModelState."""

    name: ClassVar[str] = "export"


@dataclass(frozen=True)
class AutogradRequests(Request):
    """What one step asks of autograd beyond first-order reverse mode. Reply: a list of str."""

    name: ClassVar[str] = "autograd_requests"


@dataclass(frozen=True)
class Inputs(Request):
    """The inputs the TARGET function builds for `seed`, or in script mode those of the model's recorded call number
    `seed` (from 0). Reply: InputSet."""

    name: ClassVar[str] = "inputs"
    seed: int


@dataclass(frozen=True)
class Run(Request):
    """One eval-mode pass on these inputs (None: the workload's own), RNG seeded; with `grads` every parameter's
    gradient too. Reply: RunOutputs."""

    name: ClassVar[str] = "run"
    args: Any = None
    kwargs: dict[str, Any] | None = None
    grads: bool = False
    rng_seed: int = 0


@dataclass(frozen=True)
class Observe(Request):
    """What every call of each attention block saw on these inputs. Reply: a list of BlockCall."""

    name: ClassVar[str] = "observe"
    args: Any = None
    kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class Time(Request):
    """Unprofiled step times after `warmup` untimed steps. Reply: StepTimes."""

    name: ClassVar[str] = "time"
    steps: int
    warmup: int = 0


@dataclass(frozen=True)
class PeakMemory(Request):
    """Reply: MemoryPeak."""

    name: ClassVar[str] = "peak_memory"


@dataclass(frozen=True)
class Profile(Request):
    """`advisor profile` on the loaded workload, its Chrome trace written to `trace_path`. Reply: Profiled."""

    name: ClassVar[str] = "profile"
    trace_path: str | None = None


# -- replies -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ok:
    value: Any


@dataclass(frozen=True)
class Failed:
    """User code raised or exited inside the request (or the request could not be served): one line for the user."""

    line: str


@dataclass(frozen=True)
class Progress:
    text: str


# -- reply values --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerInfo:
    pid: int
    threads: int
    environment: dict[str, str | None]  # the worker's values of process.WORKER_ENVIRONMENT's names


@dataclass(frozen=True)
class StateKeys:
    """What `load_state_dict(strict=False)` did not match when the patched side took the original's weights."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[str]]:
        return {"missing": list(self.missing), "unexpected": list(self.unexpected)}


@dataclass(frozen=True)
class Loaded:
    model: str  # the model's class name
    state_dict: StateKeys | None  # None: no state was given
    captured: str | None  # script mode: what was captured and how the script ended
    accepts_seed: bool  # the TARGET function takes a `seed` (more parity inputs)
    device: str
    inputs: int | None  # script mode: how many model calls were recorded
    dtype: str
    autocast: tuple = ()  # advisor.runtime.autocast_state.Autocast: the regions the model's calls run in


@dataclass(frozen=True)
class InputSet:
    args: Any
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class RunOutputs:
    """One pass's outputs (and gradients by parameter name), as plain containers of CPU tensors (parity.to_tree)."""

    output: Any
    grads: dict[str, Any] | None = None

    def tree(self) -> dict[str, Any]:
        """What parity compares: the outputs under "output" and, when asked, the gradients under "grads" (the names
        its failures print)."""
        return {"output": self.output} if self.grads is None else {"output": self.output, "grads": self.grads}


@dataclass(frozen=True)
class StepTimes:
    us: list[float]  # wall time of each step, microseconds


@dataclass(frozen=True)
class MemoryPeak:
    bytes: int
    method: str  # how it was measured, as the report's environment states it


@dataclass(frozen=True)
class OpTotal:
    """One aten op's calls and self time per profiled step."""

    op: str
    count: float
    us: float

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "count": self.count, "us": self.us}


@dataclass(frozen=True)
class ProfileSummary:
    device: str
    dtype: str
    step_us: float
    step_iqr_us: float
    op_us: float
    statement_share: float
    attributed_share: float


@dataclass(frozen=True)
class Profiled:
    """A profile: its JSON document (`advisor profile --format json`, with `top_lines`), its ranked findings, the
    runtime evidence `scan/fix --profile` join to source lines, op totals, the source files run and their lines."""

    document: dict[str, Any]
    findings: list[Any]  # contracts.finding.Finding, ranked by measured time
    evidence: RuntimeEvidence
    ops: list[OpTotal]
    files: list[str]  # real paths of the .py files that ran
    lines: list[tuple[str, int]]  # (real path, line) of every statement that ran, sorted
    summary: ProfileSummary

