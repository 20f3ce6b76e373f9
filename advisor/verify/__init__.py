"""Run user workloads in child processes, and verify patches: parity and interleaved timing of two live workers."""
