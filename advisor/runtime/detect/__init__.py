"""Detectors over the recorded op graph (run by advisor.engine.runtime_engine, as the rule units list them). Each returns
Detections: a rule, the recorded ops whose measured time is the finding's cost, and where in the user's source it
happened."""

from __future__ import annotations
