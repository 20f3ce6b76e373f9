"""Child side of a workload worker (`python -m advisor.verify.worker IN_FD OUT_FD PARENT_PID`): load the workload
once and answer requests (`advisor.verify.messages`: Load, Run, Time, Profile, ...) until the request pipe closes.

Every request's reply is Ok(value) or Failed(one line); Progress(text) may come before it. The worker dispatches on
the request's type (HANDLERS). User code that calls sys.exit() inside a request is a Failed reply like any
exception, so the worker survives it; so is a message that is no request the worker knows.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from advisor.child_lifetime import end_with_parent
from advisor.verify.messages import (AutogradRequests, Export, Failed, Hello, Inputs, InputSet, Load, Loaded,
                                     MemoryPeak, ModelState, Observe, Ok, OpTotal, PeakMemory, Profile, Profiled,
                                     ProfileSummary, Progress, Request, Run, RunOutputs, StateKeys, StepTimes, Time,
                                     WorkerInfo)
from advisor.verify.process import WORKER_ENVIRONMENT


class Worker:
    def __init__(self, send):
        self.send = send
        self.target = None
        self.function = None
        self.workload = None
        self.prepared = None
        self.options: dict = {}
        self.script_calls: list | None = None  # script mode: the inputs of the model's recorded calls

    # -- setup -------------------------------------------------------------------------------------------------
    def hello(self, request: Hello) -> WorkerInfo:
        sys.path[:] = request.sys_path  # the parent's import path, so TARGET resolves the same in both processes
        import torch

        if request.threads:
            torch.set_num_threads(request.threads)
        if request.overlay:
            from advisor.verify.overlay import install
            install(request.overlay, request.overlay_root)
        return WorkerInfo(os.getpid(), torch.get_num_threads(),
                          {name: os.environ.get(name) for name in WORKER_ENVIRONMENT})

    def load(self, request: Load) -> Loaded:
        """Import TARGET (a module TARGET from the current directory or `roots` first) and build its workload, or
        with `script` (argv) run that script until its model's `calls`-th call; with `state` (from the original
        side) take its weights and inputs."""
        from advisor.runtime.runner import check_runs, prepare
        from advisor.verify.overlay import file_loader
        from advisor.workload_loader import load_workload, seed_parameter

        target, device, dtype, train = request.target, request.device, request.dtype, request.train
        self.target = target
        self.options = {"device": device, "dtype": dtype, "train": train}
        captured = None
        if request.script is not None:
            from advisor.script import parse_command, run_script

            self.workload, self.script_calls, captured = run_script(parse_command(request.script), request.calls,
                                                                    file_loader)
        else:
            self.workload, self.function = load_workload(target, loader=file_loader, with_function=True,
                                                         roots=tuple(request.roots))
        keys = None
        if request.state is not None:
            keys = self._take_state(request.state)
        self.prepared = prepare(self.workload, device, dtype, train)
        check_runs(self.prepared, target)
        return Loaded(model=type(self.workload.model).__name__, state_dict=keys, captured=captured,
                      accepts_seed=seed_parameter(self.function) is not None, device=str(self.prepared.device),
                      inputs=len(self.script_calls) if self.script_calls is not None else None,
                      dtype=str(self.prepared.dtype or _parameter_dtype(self.prepared.model)).replace("torch.", ""),
                      autocast=self.prepared.autocast)

    def _take_state(self, state: ModelState) -> StateKeys:
        import torch

        self.workload.args, self.workload.kwargs = state.args, state.kwargs
        model = self.workload.model
        if not isinstance(model, torch.nn.Module):
            return StateKeys()
        result = model.load_state_dict(state.state_dict, strict=False)
        return StateKeys(list(result.missing_keys), list(result.unexpected_keys))

    def export(self, request: Export) -> ModelState:
        """Weights and inputs on the CPU, for the patched side to load."""
        import torch

        from advisor.runtime.runner import _move

        cpu = torch.device("cpu")
        model = self.prepared.model
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()} \
            if isinstance(model, torch.nn.Module) else {}
        return ModelState(state, _move(self.workload.args, cpu, None), _move(self.workload.kwargs, cpu, None))

    def autograd_requests(self, request: AutogradRequests) -> list[str]:
        """What one step asks of autograd beyond first-order reverse mode (the first-order-autograd fact)."""
        from advisor.runtime.autograd_probe import higher_order_requests

        return higher_order_requests(self.prepared.step)

    def inputs(self, request: Inputs) -> InputSet:
        """The inputs the TARGET function builds for `seed` (only when it takes a `seed` argument); in script mode
        those of the model's recorded call number `seed` (from 0)."""
        import torch

        from advisor.runtime.runner import _move
        from advisor.workload_loader import as_workload, call_with_seed

        seed = request.seed
        if self.script_calls is not None:
            call = self.script_calls[seed]
            args, kwargs = call.args, call.kwargs
        else:
            torch.manual_seed(seed)
            workload = as_workload(call_with_seed(self.function, seed), self.target)
            args, kwargs = workload.args, workload.kwargs
        cpu = torch.device("cpu")
        return InputSet(_move(args, cpu, None), _move(kwargs, cpu, None))

    # -- measurements --------------------------------------------------------------------------------------------
    def run(self, request: Run) -> RunOutputs:
        """Outputs (and with `grads` every parameter's gradient, and each input's that requires grad: an attention core
        has no parameters, promise breaker round 31) of one eval-mode pass: dropout off, RNG seeded."""
        import torch

        from advisor.runtime.autocast_state import replayed
        from advisor.runtime.runner import _scalar_loss
        from advisor.verify.parity import to_tree

        args, kwargs = self._placed(request.args, request.kwargs)
        model = self.prepared.model
        with _in_eval_mode(model) as module:
            torch.manual_seed(request.rng_seed)
            if not request.grads:
                with torch.no_grad(), replayed(self.prepared.autocast):
                    return RunOutputs(to_tree(model(*args, **kwargs)))
            leaves = [t for t in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad]
            for leaf in leaves:
                leaf.grad = None
            with replayed(self.prepared.autocast):
                output = model(*args, **kwargs)
            if module is not None:
                module.zero_grad(set_to_none=True)
            _scalar_loss(output).backward()
            gradients = {name: p.grad for name, p in module.named_parameters()} if module is not None else {}
            gradients.update({f"input {index}": leaf.grad for index, leaf in enumerate(leaves)})
            result = RunOutputs(to_tree(output), to_tree(gradients))
            if module is not None:
                module.zero_grad(set_to_none=True)
            return result

    def observe(self, request: Observe) -> list:
        """What every call of each attention block saw on these inputs (facts from the run): one eval-mode forward
        under the op recorder."""
        import torch

        from advisor.runtime.autocast_state import replayed
        from advisor.runtime.detect.attention_graph import block_calls
        from advisor.runtime.recorder import OpRecorder

        args, kwargs = self._placed(request.args, request.kwargs)
        model = self.prepared.model
        recorder = OpRecorder(model)
        with _in_eval_mode(model):
            torch.manual_seed(0)  # as `run` seeds it, so a model drawing random numbers sees what parity saw
            with torch.no_grad(), recorder, replayed(self.prepared.autocast):
                model(*args, **kwargs)
        return block_calls(recorder.result())

    def _placed(self, args, kwargs) -> tuple[tuple, dict]:
        """Inputs (the workload's own when None) on the prepared device and dtype."""
        from advisor.runtime.runner import _move

        prepared = self.prepared
        args = tuple(_move(a, prepared.device, prepared.dtype) for a in (self.workload.args if args is None else args))
        kwargs = {k: _move(v, prepared.device, prepared.dtype) for k, v in
                  (self.workload.kwargs if kwargs is None else kwargs).items()}
        return args, kwargs

    def time(self, request: Time) -> StepTimes:
        """Wall time of each of `steps` unprofiled steps (microseconds), after `warmup` untimed ones."""
        from advisor.runtime.capture import time_steps

        for _ in range(request.warmup):
            self.prepared.step()
        self.prepared.sync()
        return StepTimes(time_steps(self.prepared, request.steps))

    def peak_memory(self, request: PeakMemory) -> MemoryPeak:
        """Peak memory of one step: CUDA's allocator peak, or on the CPU the peak of the bytes torch allocated
        during the step, summed from the profiler's memory events (RSS misses reuse of freed memory)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        prepared = self.prepared
        if prepared.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            prepared.step()
            torch.cuda.synchronize()
            return MemoryPeak(int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            prepared.step()
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        allocated = peak = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            allocated += event.nbytes()
            peak = max(peak, allocated)
        return MemoryPeak(peak, "torch.profiler memory events: peak bytes allocated during one step (CPU)")

    def profile(self, request: Profile) -> Profiled:
        """`advisor profile` on the loaded workload: the report's JSON, its findings, op totals, the files run, and
        the runtime evidence that `scan/fix --profile` join to source lines."""
        from advisor.engine.profiling import evidence_from_report, profile_workload

        report = profile_workload(self.workload, self.target, self.options["device"], self.options["dtype"],
                                  self.options["train"], request.trace_path,
                                  progress=lambda message: self.send(Progress(message)))
        c, t = report.capture, report.timing
        ops: dict[str, list[float]] = {}
        for event in c.events:
            if event.step >= 0:
                entry = ops.setdefault(event.name, [0.0, 0.0])
                entry[0] += 1 / c.profiled_steps
                entry[1] += event.self_us / c.profiled_steps
        files = sorted({path for path, _ in t.line_us} | {path for path, _, _ in t.function_us})
        ran = {(path, line) for path, line in t.line_us} | {(path, line) for path, line, _ in t.function_us}
        document = report.to_json()
        document["top_lines"] = _top_lines(t.line_us, t.op_us)
        return Profiled(
            document=document, findings=report.findings, evidence=evidence_from_report(report),
            ops=[OpTotal(name, round(n, 3), round(us, 3)) for name, (n, us) in ops.items()],
            files=[os.path.realpath(p) for p in files if p.endswith(".py") and os.path.isfile(p)],
            lines=sorted((os.path.realpath(path), line) for path, line in ran if path.endswith(".py")),
            summary=ProfileSummary(c.device, c.dtype, c.step_us, c.step_iqr_us, t.op_us, t.statement_share,
                                   t.attributed_share))

    def handle(self, request):
        """The reply value of one request, by its type; a message that is no request this worker knows is an
        AdvisorError (a Failed reply), whatever it names."""
        handler = HANDLERS.get(type(request))
        if handler is None:
            from advisor.errors import AdvisorError

            known = ", ".join(kind.__name__ for kind in HANDLERS)
            raise AdvisorError(f"the worker got a message that is not a request it knows: {_shown(request)} "
                               f"(it answers {known})")
        return handler(self, request)


HANDLERS: dict[type[Request], Callable] = {
    Hello: Worker.hello, Load: Worker.load, Export: Worker.export, AutogradRequests: Worker.autograd_requests,
    Inputs: Worker.inputs, Run: Worker.run, Observe: Worker.observe, Time: Worker.time,
    PeakMemory: Worker.peak_memory, Profile: Worker.profile}


def _shown(message) -> str:
    """A message as an error names it: its type, and for a non-request its start (e.g. an old-style tuple)."""
    return type(message).__name__ if isinstance(message, Request) else f"{type(message).__name__} {message!r}"[:80]


def _top_lines(line_us: dict, op_us: float, count: int = 10) -> list[dict]:
    """The source lines that took the most op time per step, with their code (as scalene and py-spy show); each
    path named as the findings name theirs (relative, a name's bytes that are not UTF-8 as `\\xNN`)."""
    import linecache

    from advisor.contracts.finding import display_path

    ranked = sorted(line_us.items(), key=lambda item: -item[1])[:count]
    return [{"path": display_path(path), "line": line, "us": round(us, 3),
             "share": round(us / op_us, 5) if op_us else 0.0,
             "code": linecache.getline(path, line).strip()} for (path, line), us in ranked]


def _parameter_dtype(model) -> str:
    """The dtype the model computes in when the workload did not say: its first floating-point parameter's."""
    parameters = model.parameters() if hasattr(model, "parameters") else ()
    return next((str(p.dtype) for p in parameters if p.is_floating_point()), "as loaded")


def _one_line(exc: BaseException) -> str:
    from advisor.errors import AdvisorError

    if isinstance(exc, AdvisorError):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"the workload called sys.exit({exc.code!r})"
    if isinstance(exc, KeyboardInterrupt):
        return "the workload was interrupted"
    return f"the workload raised {type(exc).__name__}: {exc}"


def serve(receive: Connection, send: Connection) -> None:
    def reply(message) -> None:
        try:
            send.send_bytes(pickle.dumps(message))
        except Exception as exc:  # noqa: BLE001 - e.g. a value pickle cannot carry
            send.send_bytes(pickle.dumps(Failed(f"the workload's result cannot be sent back: "
                                                f"{type(exc).__name__}: {exc}")))

    worker = Worker(reply)
    while True:
        try:
            data = receive.recv_bytes()
        except EOFError:
            return
        try:
            request = pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - e.g. a class this process cannot import
            reply(Failed(f"the worker could not read a request ({type(exc).__name__}: {exc})"))
            continue
        try:
            value = worker.handle(request)
        except BaseException as exc:  # noqa: BLE001 - user code: SystemExit and all become one Failed reply
            traceback.print_exc()  # into the worker's log, for --debug and post-mortems
            reply(Failed(_one_line(exc)))
            continue
        reply(Ok(value))


@contextlib.contextmanager
def _in_eval_mode(model):
    """The model (when it is a module, yielded; else None) in eval mode, put back in its own mode afterwards: parity
    and observation compare one deterministic pass, whatever mode the workload left it in."""
    import torch

    module = model if isinstance(model, torch.nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    try:
        yield module
    finally:
        if module is not None:
            module.train(was_training)


def main() -> None:
    """argv: the request and reply pipes' descriptors, and advisor's pid: the worker, and whatever the workload
    started in its process group, end when advisor does, however it ends."""
    end_with_parent(int(sys.argv[3]), group=True)
    receive = Connection(int(sys.argv[1]), writable=False)
    send = Connection(int(sys.argv[2]), readable=False)
    serve(receive, send)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: user atexit hooks and threads must not keep the worker alive


if __name__ == "__main__":
    main()

