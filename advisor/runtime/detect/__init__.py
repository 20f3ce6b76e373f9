"""Detectors over the recorded op graph (run by advisor.engine.runtime_engine, through the rule units' graph
hooks). Each returns Detections (advisor.contracts.detection): a rule, the recorded ops whose measured time is the
finding's cost, and where in the user's source it happened."""
