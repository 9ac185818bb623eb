"""The real kernel: perf_event_open uprobes and /proc/PID/{maps,mem}."""
