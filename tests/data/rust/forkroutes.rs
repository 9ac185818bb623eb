// forkroutes.rs: a Rust program with a USDT probe (its stapsdt note written by inline asm, as
// Rust's `probe` crate does) that creates a child by the route argv[1] names (issue 31):
// command (std::process::Command with a pre_exec closure: std forks, the child runs this
// file's code before it execs /bin/true), fork (libc's fork through an extern "C"
// declaration), clone3 (a raw clone3 through syscall()). It hits the probe 5 times, prints
// "ready", waits for a line, creates the child (which hits the probe 7 times), prints
// "child-status N", then waits for stdin to close.
// Build: rustc -O --edition 2021 tests/data/rust/forkroutes.rs -o forkroutes-rs
use std::io::{BufRead, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;

extern "C" {
    fn fork() -> i32;
    fn syscall(n: i64, ...) -> i64;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn _exit(code: i32) -> !;
}

#[inline(never)]
fn site(x: i64) -> i64 {
    unsafe {
        std::arch::asm!(
            "990: nop",
            ".pushsection .note.stapsdt,\"\",\"note\"",
            ".balign 4",
            ".4byte 992f-991f, 994f-993f, 3",
            "991: .asciz \"stapsdt\"",
            "992: .balign 4",
            "993: .8byte 990b",
            ".8byte _.stapsdt.base",
            ".8byte 0",
            ".asciz \"rust\"",
            ".asciz \"site\"",
            ".asciz \"8@{x}\"",
            "994: .balign 4",
            ".popsection",
            ".ifndef _.stapsdt.base",
            ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat",
            ".weak _.stapsdt.base",
            ".hidden _.stapsdt.base",
            "_.stapsdt.base: .space 1",
            ".size _.stapsdt.base, 1",
            ".popsection",
            ".endif",
            x = in(reg) x,
            options(att_syntax, nostack, preserves_flags),
        );
    }
    x + 1
}

fn hits(n: i64) -> i64 {
    // (a volatile read keeps the calls: std::hint::black_box is newer than Debian 12's rustc)
    (0..n).map(|i| site(unsafe { std::ptr::read_volatile(&i) })).sum()
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

fn main() {
    let route = std::env::args().nth(1).unwrap_or_else(|| "fork".to_string());
    hits(5);
    println!("ready");
    std::io::stdout().flush().unwrap();
    let stdin = std::io::stdin();
    let mut line = String::new();
    stdin.lock().read_line(&mut line).unwrap();
    let status = match route.as_str() {
        "command" => {
            let mut cmd = Command::new("/bin/true");
            unsafe {
                cmd.pre_exec(|| {
                    hits(7);
                    Ok(())
                });
            }
            cmd.status().unwrap().into_raw()
        }
        "fork" | "clone3" => {
            let pid = if route == "fork" {
                unsafe { fork() }
            } else {
                let args = CloneArgs { exit_signal: 17, ..Default::default() };
                unsafe {
                    syscall(435, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
                        as i32
                }
            };
            if pid == 0 {
                hits(7);
                unsafe { _exit(0) }
            }
            assert!(pid > 0, "{route}: {}", std::io::Error::last_os_error());
            let mut st = -1;
            unsafe { waitpid(pid, &mut st, 0) };
            st
        }
        _ => {
            eprintln!("unknown route {route}");
            std::process::exit(2);
        }
    };
    println!("child-status {status} canary intact");
    std::io::stdout().flush().unwrap();
    for l in stdin.lock().lines() {
        if l.is_err() {
            break;
        }
    }
}
