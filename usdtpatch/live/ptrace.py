"""ptrace(2) through ctypes, the few requests kcheck needs to follow a process's threads and
forks without changing what they do: PTRACE_SEIZE with fork/clone/exec/exit events,
PTRACE_INTERRUPT, PTRACE_LISTEN, PTRACE_CONT (re-injecting the signal that stopped the
tracee), PTRACE_DETACH, PTRACE_GETSIGINFO, PTRACE_GETREGS and PTRACE_GETEVENTMSG.

Reference: ptrace(2) ("Stopped states", "PTRACE_SEIZE"), <sys/ptrace.h> and the x86-64
`struct user_regs_struct` (<sys/user.h>). Every request must come from the thread that seized
the tracee.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

PTRACE_CONT = 7
PTRACE_GETREGS = 12
PTRACE_DETACH = 17
PTRACE_SETOPTIONS = 0x4200
PTRACE_GETEVENTMSG = 0x4201
PTRACE_GETSIGINFO = 0x4202
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_LISTEN = 0x4208

O_TRACEFORK = 0x2
O_TRACEVFORK = 0x4
O_TRACECLONE = 0x8
O_TRACEEXEC = 0x10
O_TRACEEXIT = 0x40
O_EXITKILL = 0x100000

EVENT_FORK = 1
EVENT_VFORK = 2
EVENT_CLONE = 3
EVENT_EXEC = 4
EVENT_EXIT = 6
EVENT_STOP = 128

WALL = 0x40000000  # __WALL: wait for threads and tracees too

# x86-64 struct user_regs_struct: 27 unsigned longs in this order
_REG_NAMES = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs "
              "eflags rsp ss fs_base gs_base ds es fs gs").split()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def _call(request: int, tid: int, addr: int | None = None, data: int | None = None) -> int:
    ctypes.set_errno(0)
    rc = _libc.ptrace(request, tid, addr, data)
    if rc == -1:
        err = ctypes.get_errno()
        if err:
            raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")
    return int(rc)


def seize(tid: int, options: int) -> None:
    _call(PTRACE_SEIZE, tid, None, options)


def cont(tid: int, sig: int = 0) -> None:
    _call(PTRACE_CONT, tid, None, sig)


def listen(tid: int) -> None:
    _call(PTRACE_LISTEN, tid)


def interrupt(tid: int) -> None:
    _call(PTRACE_INTERRUPT, tid)


def detach(tid: int, sig: int = 0) -> None:
    _call(PTRACE_DETACH, tid, None, sig)


def event_message(tid: int) -> int:
    msg = ctypes.c_ulong(0)
    _call(PTRACE_GETEVENTMSG, tid, None, ctypes.addressof(msg))
    return int(msg.value)


@dataclass(frozen=True, slots=True)
class SigInfo:
    signo: int
    code: int
    addr: int  # si_addr (meaningful for SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP)


def siginfo(tid: int) -> SigInfo | None:
    """The siginfo of a signal-delivery-stop; None for other stops (group-stop: EINVAL)."""
    buf = (ctypes.c_ubyte * 128)()
    try:
        _call(PTRACE_GETSIGINFO, tid, None, ctypes.addressof(buf))
    except OSError:
        return None
    raw = bytes(buf)
    return SigInfo(int.from_bytes(raw[0:4], "little", signed=True),
                   int.from_bytes(raw[8:12], "little", signed=True),
                   int.from_bytes(raw[16:24], "little"))


def registers(tid: int) -> dict[str, int]:
    regs = (ctypes.c_ulong * len(_REG_NAMES))()
    _call(PTRACE_GETREGS, tid, None, ctypes.addressof(regs))
    return {name: int(regs[i]) for i, name in enumerate(_REG_NAMES)}
