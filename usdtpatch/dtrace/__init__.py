"""`usdtpatch dtrace`: systemtap's dtrace -h / -G, with usdtpatch's <sys/sdt.h> underneath.

parse: .d text -> DScript; header: DScript -> the text of the probe header (-h); stub: DScript
-> the C source of the semaphore object (-G). All pure; cli/cmd_dtrace.py runs cpp and the C
compiler and writes the files.
"""
