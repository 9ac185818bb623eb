"""`usdtpatch bench`: how much faster tracing gets on this machine (docs/performance.md).

Package data: trigger.c (a loop hitting one USDT site, compiled at run time with the system
cc against systemtap's sys/sdt.h and usdtpatch's) and Bench.java (the JVM workload). The
runner is usdtpatch.live.bench.runner.
"""
