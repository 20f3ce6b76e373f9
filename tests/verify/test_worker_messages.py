"""The worker protocol (advisor.verify.messages): typed requests that the worker dispatches by type, typed replies;
what user code does inside a request (raise, sys.exit) is a Failed reply and the worker keeps serving."""

import pytest
import torch

from advisor.errors import AdvisorError
from advisor.verify.messages import Export, Load, Loaded, ModelState, Request, Run, RunOutputs, StepTimes, Time
from advisor.verify.process import WorkerFailed, start_worker
from advisor.verify.worker import Worker

WORKLOAD = """
import sys

import torch


class Picky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        if bool((x == 0).any()):
            raise ValueError("zero in the input")
        if bool((x < 0).any()):
            sys.exit(3)
        return x * self.scale


def workload():
    return Picky(), (torch.ones(2, 3),)
"""


def test_a_worker_answers_typed_requests_and_survives_what_user_code_does(tmp_path):
    path = tmp_path / "picky.py"
    path.write_text(WORKLOAD)
    with start_worker("messages") as worker:
        loaded = worker.call(Load(f"{path}:workload"))
        assert isinstance(loaded, Loaded)
        assert (loaded.model, loaded.state_dict, loaded.accepts_seed, loaded.dtype) == ("Picky", None, False,
                                                                                       "float32")
        ran = worker.call(Run(grads=True))
        assert isinstance(ran, RunOutputs) and torch.equal(ran.output, torch.full((2, 3), 2.0))
        assert list(ran.tree()) == ["output", "grads"] and list(ran.grads) == ["scale"]
        assert worker.call(Run()).grads is None
        times = worker.call(Time(2))
        assert isinstance(times, StepTimes) and len(times.us) == 2 and all(t > 0 for t in times.us)
        state = worker.call(Export())
        assert isinstance(state, ModelState) and list(state.state_dict) == ["scale"]

        with pytest.raises(WorkerFailed, match="^the workload raised ValueError: zero in the input$"):
            worker.call(Run((torch.zeros(2, 3),)))
        with pytest.raises(WorkerFailed, match=r"^the workload called sys.exit\(3\)$"):
            worker.call(Run((-torch.ones(2, 3),)))
        with pytest.raises(WorkerFailed, match="^the worker got a message that is not a request it knows: Request "
                                               r"\(it answers Hello, Load, "):
            worker.call(Request())
        assert not worker.closed and worker.failed  # failed: its log is kept for the user
        assert torch.equal(worker.call(Run((torch.full((2, 3), 3.0),))).output, torch.full((2, 3), 6.0))


def test_an_old_style_command_tuple_is_no_request():
    with pytest.raises(AdvisorError, match=r"not a request it knows: tuple \('run', \{\}\)"):
        Worker(send=None).handle(("run", {}))
