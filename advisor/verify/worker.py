"""Child side of a workload worker (`python -m advisor.verify.worker IN_FD OUT_FD PARENT_PID`): load the workload
once and answer requests (run, time, profile, ...) until the request pipe closes.

Every request's reply is ("ok", value) or ("error", one line); ("progress", text) may come before it. User code
that calls sys.exit() inside a request is an error reply like any exception, so the worker survives it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import sys
import traceback
from multiprocessing.connection import Connection

from advisor.child_lifetime import end_with_parent
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
    def hello(self, sys_path: list[str], threads: int | None = None, overlay: dict[str, str] | None = None,
              overlay_root: str | None = None):
        sys.path[:] = sys_path  # the parent's import path, so TARGET resolves the same in both processes
        import torch

        if threads:
            torch.set_num_threads(threads)
        if overlay:
            from advisor.verify.overlay import install
            install(overlay, overlay_root)
        return {"pid": os.getpid(), "threads": torch.get_num_threads(),
                "environment": {name: os.environ.get(name) for name in WORKER_ENVIRONMENT}}

    def load(self, target: str, device=None, dtype=None, train=False, state=None, script=None, calls=1,
             roots=()):
        """Import TARGET (a module TARGET from the current directory or `roots` first) and build its workload, or
        with `script` (argv) run that script until its model's `calls`-th call; with `state` (from the original
        side) take its weights and inputs."""
        from advisor.runtime.runner import check_runs, prepare
        from advisor.verify.overlay import file_loader
        from advisor.workload_loader import load_workload

        self.target = target
        self.options = {"device": device, "dtype": dtype, "train": train}
        captured = None
        if script is not None:
            from advisor.script import parse_command, run_script

            self.workload, self.script_calls, captured = run_script(parse_command(script), calls, file_loader)
        else:
            self.workload, self.function = load_workload(target, loader=file_loader, with_function=True,
                                                         roots=tuple(roots))
        keys = None
        if state is not None:
            keys = self._take_state(state)
        self.prepared = prepare(self.workload, device, dtype, train)
        check_runs(self.prepared, target)
        return {"model": type(self.workload.model).__name__, "state_dict": keys, "captured": captured,
                "accepts_seed": _accepts_seed(self.function), "device": str(self.prepared.device),
                "inputs": len(self.script_calls) if self.script_calls is not None else None,
                "dtype": str(self.prepared.dtype or _parameter_dtype(self.prepared.model)).replace("torch.", "")}

    def _take_state(self, state) -> dict:
        import torch

        self.workload.args, self.workload.kwargs = state["args"], state["kwargs"]
        model = self.workload.model
        if not isinstance(model, torch.nn.Module):
            return {"missing": [], "unexpected": []}
        result = model.load_state_dict(state["state_dict"], strict=False)
        return {"missing": list(result.missing_keys), "unexpected": list(result.unexpected_keys)}

    def export(self):
        """Weights and inputs on the CPU, for the patched side to load."""
        import torch

        from advisor.runtime.runner import _move

        cpu = torch.device("cpu")
        model = self.prepared.model
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()} \
            if isinstance(model, torch.nn.Module) else {}
        return {"state_dict": state, "args": _move(self.workload.args, cpu, None),
                "kwargs": _move(self.workload.kwargs, cpu, None)}

    def autograd_requests(self):
        """What one step asks of autograd beyond first-order reverse mode (the first-order-autograd fact)."""
        from advisor.runtime.autograd_probe import higher_order_requests

        return higher_order_requests(self.prepared.step)

    def inputs(self, seed: int):
        """The inputs the TARGET function builds for `seed` (only when it takes a `seed` argument); in script mode
        those of the model's recorded call number `seed` (from 0)."""
        import torch

        from advisor.runtime.runner import _move
        from advisor.workload_loader import as_workload

        if self.script_calls is not None:
            call = self.script_calls[seed]
            args, kwargs = call.args, call.kwargs
        else:
            torch.manual_seed(seed)
            workload = as_workload(self.function(seed=seed), self.target)
            args, kwargs = workload.args, workload.kwargs
        cpu = torch.device("cpu")
        return {"args": _move(args, cpu, None), "kwargs": _move(kwargs, cpu, None)}

    # -- measurements --------------------------------------------------------------------------------------------
    def run(self, args=None, kwargs=None, grads=False, rng_seed=0):
        """Outputs (and with `grads` every parameter's gradient) of one eval-mode pass: dropout off, RNG seeded."""
        import torch

        from advisor.runtime.runner import _scalar_loss
        from advisor.verify.parity import to_tree

        args, kwargs = self._placed(args, kwargs)
        model = self.prepared.model
        with _in_eval_mode(model) as module:
            torch.manual_seed(rng_seed)
            if not grads:
                with torch.no_grad():
                    return {"output": to_tree(model(*args, **kwargs))}
            output = model(*args, **kwargs)
            if module is not None:
                module.zero_grad(set_to_none=True)
            _scalar_loss(output).backward()
            gradients = {name: p.grad for name, p in module.named_parameters()} if module is not None else {}
            result = {"output": to_tree(output), "grads": to_tree(gradients)}
            if module is not None:
                module.zero_grad(set_to_none=True)
            return result

    def observe(self, args=None, kwargs=None):
        """What every call of each attention block saw on these inputs (facts from the run): one eval-mode forward
        under the op recorder."""
        import torch

        from advisor.runtime.detect.attention_graph import block_calls
        from advisor.runtime.recorder import OpRecorder

        args, kwargs = self._placed(args, kwargs)
        model = self.prepared.model
        recorder = OpRecorder(model)
        with _in_eval_mode(model):
            torch.manual_seed(0)  # as `run` seeds it, so a model drawing random numbers sees what parity saw
            with torch.no_grad(), recorder:
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

    def time(self, steps: int, warmup: int = 0):
        """Wall time of each of `steps` unprofiled steps (microseconds), after `warmup` untimed ones."""
        from advisor.runtime.capture import time_steps

        for _ in range(warmup):
            self.prepared.step()
        self.prepared.sync()
        return time_steps(self.prepared, steps)

    def peak_memory(self):
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
            return {"bytes": int(torch.cuda.max_memory_allocated()), "method": "torch.cuda.max_memory_allocated"}
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            prepared.step()
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        allocated = peak = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            allocated += event.nbytes()
            peak = max(peak, allocated)
        return {"bytes": peak, "method": "torch.profiler memory events: peak bytes allocated during one step (CPU)"}

    def profile(self, trace_path: str | None = None):
        """`advisor profile` on the loaded workload: the report's JSON, its findings, op totals, the files run, and
        the runtime evidence that `scan/fix --profile` join to source lines."""
        from advisor.engine.profiling import evidence_from_report, profile_workload

        report = profile_workload(self.workload, self.target, self.options["device"], self.options["dtype"],
                                  self.options["train"], trace_path,
                                  progress=lambda message: self.send(("progress", message)))
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
        return {"json": document, "findings": report.findings, "evidence": evidence_from_report(report),
                "ops": [{"op": name, "count": round(n, 3), "us": round(us, 3)} for name, (n, us) in ops.items()],
                "files": [os.path.realpath(p) for p in files if p.endswith(".py") and os.path.isfile(p)],
                "lines": sorted([os.path.realpath(path), line] for path, line in ran if path.endswith(".py")),
                "summary": {"device": c.device, "dtype": c.dtype, "step_us": c.step_us, "step_iqr_us": c.step_iqr_us,
                            "op_us": t.op_us, "statement_share": t.statement_share,
                            "attributed_share": t.attributed_share}}


def _top_lines(line_us: dict, op_us: float, count: int = 10) -> list[dict]:
    """The source lines that took the most op time per step, with their code (as scalene and py-spy show)."""
    import linecache

    ranked = sorted(line_us.items(), key=lambda item: -item[1])[:count]
    return [{"path": path, "line": line, "us": round(us, 3), "share": round(us / op_us, 5) if op_us else 0.0,
             "code": linecache.getline(path, line).strip()} for (path, line), us in ranked]


def _parameter_dtype(model) -> str:
    """The dtype the model computes in when the workload did not say: its first floating-point parameter's."""
    parameters = model.parameters() if hasattr(model, "parameters") else ()
    return next((str(p.dtype) for p in parameters if p.is_floating_point()), "as loaded")


def _accepts_seed(function) -> bool:
    try:
        return "seed" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


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
            send.send_bytes(pickle.dumps(("error", f"the workload's result cannot be sent back: "
                                                   f"{type(exc).__name__}: {exc}")))

    worker = Worker(reply)
    while True:
        try:
            command, payload = pickle.loads(receive.recv_bytes())
        except EOFError:
            return
        try:
            value = getattr(worker, command)(**payload)
        except BaseException as exc:  # noqa: BLE001 - user code: SystemExit and all become one error reply
            traceback.print_exc()  # into the worker's log, for --debug and post-mortems
            reply(("error", _one_line(exc)))
            continue
        reply(("ok", value))


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

