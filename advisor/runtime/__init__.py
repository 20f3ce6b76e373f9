"""Runtime half of advisor: run a workload under torch.profiler and a dispatch-mode recorder, pin op time to
user source lines, and detect attention, useless copies and casts, SDPA math fallbacks and rebuilt masks."""
