"""What "proved" means for a rewritten site, and what it rests on.

A site's `proved` (or `emulated`) says one thing: its detour behaves as its window for every
state that enters the window, from its start and from every way in the rewrite aims at the
copy (the prover for all states, else the emulator from each way in). It says nothing of the
world around the window; that is the model's (the ELF constructs the tool reads, refusing by
name those it does not: usdtpatch/elf/model.py) and the assumptions below, each a fact about
code or tools the file cannot show, each held by the tests named. The rewrite report names
them (`verification_basis` in its JSON, the last words of its summary line), and
docs/rewrite.md, "What is assumed", lists the same: tests/test_assumptions.py checks that the
page names each one and that each test exists.
"""

from __future__ import annotations

from dataclasses import dataclass

PROVED = ("each detour against its window, for every state entering the window from its start "
          "or a way in the rewrite aims at the copy")
RESTS_ON = ("the file's model and the assumptions `usdtpatch explain assumptions` prints "
            "(docs/rewrite.md, \"What is assumed\", in the sources)")


@dataclass(frozen=True, slots=True)
class Assumption:
    """One named assumption: what it says and the tests that hold it (`FILE::TEST`)."""

    name: str
    says: str
    tests: tuple[str, ...]


ASSUMPTIONS: tuple[Assumption, ...] = (
    Assumption(
        "model-meanings",
        "each construct of the model (usdtpatch/elf/model.py) means for the loader what its "
        "table says, and the table covers what real files use",
        ("tests/test_model.py::test_files_the_tests_use_need_nothing_outside_the_model",
         "tests/test_model.py::test_the_tables_name_what_real_files_use",
         "tests/test_text_relocations.py::test_relr_pointer_is_a_way_in")),
    Assumption(
        "no-foreign-jumps",
        "no code outside the file jumps into the middle of one of its functions; other "
        "objects reach it only at the addresses it gives out (symbols, relocations, data)",
        ("tests/test_analysis_waysin.py::test_ways_in_from_elsewhere",)),
    Assumption(
        "code-pointers-as-taken",
        "a value jumped to as it was loaded, popped, returned or copied is an address taken "
        "somewhere as it is (a lea, a relocation, a data word), which the ways-in index "
        "collects",
        ("tests/test_analysis_waysin.py::test_ways_in_from_elsewhere",
         "tests/test_analysis_waysin_more.py::test_each_way_in_skips_its_site_and_is_named")),
    Assumption(
        "computed-arithmetic-in-sight",
        "arithmetic on a code address is seen in the straight line after the lea that takes "
        "it (12 instructions); a computed jmp *%reg is classified by the definitions reaching "
        "it",
        ("tests/test_computed_flow.py::test_each_computed_way_in_is_refused_by_name",
         "tests/test_computed_flow.py::test_a_computed_target_of_unknown_base_poisons_every_"
         "function")),
    Assumption(
        "code-differences",
        "a code address less a register's value (not one set to an immediate just before) is a "
        "distance (a reach check, an offset), not an address of code",
        ("tests/test_computed_flow.py::test_what_the_file_wide_pass_finds",
         "tests/test_rewrite_real_debs.py::test_ruby_runs_with_the_rewritten_libruby")),
    Assumption(
        "switch-in-its-function",
        "a relative table without bounds lands where its entries read so far land, and a PIC "
        "switch whose table address is not followed lands in its own function",
        ("tests/test_computed_flow.py::test_what_the_file_wide_pass_finds",)),
    Assumption(
        "frame-stores-apart",
        "a store to the stack frame between a bounds check of memory and its jump does not "
        "change the compared memory",
        ("tests/test_computed_flow.py::test_what_the_file_wide_pass_finds",)),
    Assumption(
        "pointer-demangling",
        "glibc's pointer demangling gives back a pointer as it was taken, and a load bias plus "
        "a symbol's value is that symbol's address",
        ("tests/test_rewrite_fixtures.py::test_rewritten_fixture_runs_like_original",)),
    Assumption(
        "code-not-read",
        "the program does not read its own code bytes as data (a checksum of its text, a "
        "copy of a function): those bytes differ after a rewrite",
        ("tests/test_verification_loops.py::test_a_window_reading_its_own_bytes_is_refused",)),
    Assumption(
        "tracer-bytes-unread",
        "nothing reads the 32 bytes a traced hit writes below the stack pointer the red-zone "
        "guard gives the tracer",
        ("tests/test_live_kernel.py::test_live_red_zone_matches_emulator",)),
    Assumption(
        "gcc-personality",
        "the personality routine reads a detour's LSDA as GCC's __gxx_personality_v0 does "
        "(call-site table, LPStart, type table); args_size as libgcc reads it",
        ("tests/test_rewrite_eh_unwind.py::test_exception_through_a_call_moved_under_pushed_"
         "arguments",
         "tests/test_rewrite_eh_unwind.py::test_args_size_the_unwinders_read_differently_is_"
         "refused")),
    Assumption(
        "synchronous-faults",
        "an exception thrown from a signal handler is thrown for a synchronous fault of an "
        "instruction that can fault (what -fnon-call-exceptions covers), not from an "
        "asynchronous signal at any pc",
        ("tests/test_rewrite_eh_unwind.py::test_a_fault_in_a_detour_reaches_its_landing_pad",)),
    Assumption(
        "fault-pc-compared-in-file",
        "a signal handler that recognises a fault by its pc compares it with an address the "
        "file's own code forms (a label or a function's range); one in another object, or one "
        "that asks dladdr, is not seen, and the site's report says where its faults now land",
        ("tests/test_rewrite_observed.py::test_a_fault_recognised_by_its_pc_keeps_its_pc",
         "tests/test_rewrite_observed.py::test_a_moved_fault_is_reported_per_site")),
    Assumption(
        "callee-return-address",
        "a callee that observes its return address is served by emulating the call wherever "
        "the window allows; where the call moves, the report names the detour's address",
        ("tests/test_rewrite_observed.py::test_callee_sees_the_original_return_address",
         "tests/test_rewrite_observed.py::test_a_moved_call_says_what_its_callee_sees")),
    Assumption(
        "gdb-line-breakpoints",
        "a debugger puts a line breakpoint only at statement rows, one per line and block, "
        "the first in address order; the rows inside a window move with their instructions",
        ("tests/test_rewrite_gdb_lines.py::test_break_on_the_statement_after_a_probe",
         "tests/test_rewrite_gdb_lines.py::test_every_line_moved_breaks_as_before")),
    Assumption(
        "debug-info-in-file",
        "a debugger reads the rewritten file's own debug sections, or a debug file split "
        "from the rewritten file; the output's build-id is its own (a debug file of the "
        "original is not found by it), but a debuglink to the original's debug file, or "
        "one found by build-id with --keep-build-id, still names the original rows",
        ("tests/test_rewrite_debuginfo.py::test_gdb_bt_through_the_debug_split",
         "tests/test_rewrite_buildid.py::"
         "test_gdb_takes_the_originals_debug_file_only_with_keep_build_id")),
    Assumption(
        "index-counters-bounded",
        "a register counted up by a step below 64 KiB from a value below 2^32 (a loop "
        "counter) stays below 2^60, and a 32-bit one (a C int counter, sign-extended by "
        "movslq before it indexes) counted up from a value below 2^31 stays below 2^31 (its "
        "overflow would be undefined in C), so a stack access indexed by it never wraps below "
        "%rsp: the red-zone analysis takes such an index as non-negative",
        ("tests/test_redzone_index.py::test_a_counted_index_is_not_red_zone_live_an_argument_is",
         "tests/test_redzone_index.py::test_the_cleared_site_optimized_leaves_the_output_as_"
         "it_was")),
    Assumption(
        "fork-routes-in-sight",
        "a process forked from the file's code gets there through a route the fork guard "
        "sees (the C library's fork, the file's GOT slots of _Fork, clone, syscall, dlsym "
        "and dlvsym, its hooked system calls, an initializer after the guard's); a pointer "
        "to _Fork, clone or syscall handed out by an object that is not rewritten, a "
        "library constructor reaching the file other than by an exported function, and an "
        "ifunc resolver that forks are not seen",
        ("tests/test_fork_routes.py::test_every_route_traced",
         "tests/test_fork_routes.py::test_a_fork_in_a_librarys_constructor_is_guarded",
         "tests/test_fork_routes.py::test_a_looked_up_fork_is_guarded")),
    Assumption(
        "kernel-as-measured",
        "the running kernel optimizes and restores sites as docs/kernel.md measured on 6.18",
        ("tests/test_live_kernel.py::test_live_nop5_site_matches_plan",)),
)


def assumption_names() -> list[str]:
    """The names of the assumptions, in the registry's order."""
    return [a.name for a in ASSUMPTIONS]
