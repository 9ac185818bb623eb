/* <sys/sdt.h> from usdtpatch: USDT probe macros whose x86-64 sites are 5-byte NOPs.
 *
 * Source compatible with systemtap's <sys/sdt.h> API (STAP_PROBE, STAP_PROBE1..12,
 * STAP_PROBEV, DTRACE_PROBE*, semaphores with _SDT_HAS_SEMAPHORES, STAP_PROBE_ASM and the
 * assembler-side STAP_PROBEn for .S files), written from the SDT note format (see
 * docs/sdt-header.md and docs/usdt-format.md):
 *
 *   section .note.stapsdt (SHT_NOTE, not allocated), one note per probe site:
 *     namesz = 8, descsz, type = 3, name "stapsdt\0", padded to 4;
 *     desc = pc, base, semaphore (one address word each), "provider\0", "name\0", "args\0";
 *   base = address of the hidden weak symbol _.stapsdt.base, a 1-byte allocated section
 *     .stapsdt.base in the COMDAT group .stapsdt.base (one per linked file, shared with
 *     objects built with systemtap's header);
 *   args = space-separated "[-]N[f]@OPERAND": N the size in bytes, "-" when signed, "f" for
 *     a floating-point value, OPERAND in the assembler's syntax (AT&T on x86).
 *
 * What differs from systemtap's header is only the probe instruction, the red-zone guard
 * around it (by default, see below: then the argument operands are registers), and the
 * fork guard's table entry.  On x86-64, USDTPATCH_SITE_FORM picks the instruction:
 *   nop5    (default) 0f 1f 44 00 00        nopl 0x0(%rax,%rax,1); the note pc is on it.
 *                                           The nop5 generation (6.18.y) turns it into a
 *                                           call to the uprobe trampoline on the first hit.
 *   combo5  90 0f 1f 44 00 00               nop; nopl 0x0(%rax,%rax,1); pc on the 90.  Old
 *                                           consumers probe the 1-byte nop, libbpf >= 1.7 on
 *                                           the nop5 generation probes pc + 1.
 *   combo10 90 66 2e 0f 1f 84 00 00 00 00 00  nop; cs nopw 0x0(%rax,%rax,1); pc on the 90
 *                                           (what libbpf's usdt.h emits; the nop10
 *                                           generation, 7.3: optimized at pc + 1).
 *   nop1    90                              nop: exactly systemtap's site.
 * USDTPATCH_FORK_GUARD (default 1 with nop5 and combo5; 0 leaves it out) records every site
 * in a table and registers, once per linked object, an atfork child handler that re-arms the
 * sites a forked child inherited optimized (see "The fork guard" below).
 * USDTPATCH_REDZONE_GUARD, the red-zone guard, wraps the site in
 *   48 8d 64 24 80              lea -0x80(%rsp),%rsp
 *   <site>
 *   48 8d a4 24 80 00 00 00     lea 0x80(%rsp),%rsp
 * so that the optimized path's call (which writes the 32 bytes below rsp) lands below the
 * 128-byte red zone.  It is ON by default with the forms Linux 6.18 optimizes (nop5 and
 * combo5) in 64-bit code, because a function may keep live data there (gcc -O0 leaf
 * functions do) and an optimized hit would overwrite it.  -DUSDTPATCH_REDZONE_GUARD=0 turns
 * it off, for code built with -mno-red-zone (neither gcc nor clang tells the preprocessor
 * about -mno-red-zone, so the build has to say it); it is off in kernel code (__KERNEL__,
 * always built without a red zone), in x32 code, in assembler files (.S: their note
 * operands are hand-written text the header cannot re-express, see below), and with nop1
 * and combo10; -DUSDTPATCH_REDZONE_GUARD=1 asks for it there.  With the guard no argument
 * may be addressed through %rsp in the note (rsp is 128 lower at the probe than where the
 * compiler computed the operand): the guarded form gives every C argument the constraint
 * "nr" (a register or an immediate; never memory), so no note operand mentions %rsp and no
 * displacement needs adjusting.  A probe with an argument that fits no general register
 * (long double, __int128, _Complex, a struct of 3 or 16 bytes) cannot be guarded: it gets
 * systemtap's 1-byte nop and "nor" operands (never optimized, so nothing is written below
 * rsp).  See docs/sdt-header.md for why this is done at compile time rather than by
 * rewriting operand text in the assembler.  In .S files the arguments are written by hand:
 * with the guard, write rsp-relative ones with their displacement + 128.
 * Other architectures emit their usual 1-byte nop ("nop 0" on ia64 and s390).
 *
 * The argument descriptors: each C argument gets two asm operands, in this order, exactly
 * like systemtap's header so that the compiler allocates the same locations:
 *   [__usdt_dI] "n" (descriptor), [__usdt_aI] "nor" (value)   (STAP_SDT_ARG_CONSTRAINT)
 * The descriptor packs, for the assembler, what the note text needs:
 *   bit 0 signed, bit 1 floating point, bit 3 "the size has two digits", bits 4..7 the
 *   size's units digit, bits 8..11 its tens digit; the assembler prints them with
 *   `.byte 48 + digit` (no .altmacro: this header never changes the assembler's macro mode).
 */

#ifndef _SYS_SDT_H
#define _SYS_SDT_H 1
#define _USDTPATCH_SDT_H 1

/* --- the site -------------------------------------------------------------------------- */

#define _USDT_CAT2(a, b) a##b
#define _USDT_CAT(a, b) _USDT_CAT2(a, b)
#define _USDT_STR(x) #x
#define _USDT_XSTR(x) _USDT_STR(x)

#define _USDT_FORMID_nop5 1
#define _USDT_FORMID_combo5 2
#define _USDT_FORMID_combo10 3
#define _USDT_FORMID_nop1 4

#if defined(__x86_64__)
# ifndef USDTPATCH_SITE_FORM
#  define USDTPATCH_SITE_FORM nop5
# endif
# define _USDT_FORM _USDT_CAT(_USDT_FORMID_, USDTPATCH_SITE_FORM)
# if _USDT_FORM == 1
/* nopl 0x0(%rax,%rax,1) */
#  define _USDT_SITE_TEXT 771: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
#  define _USDT_SITE_STR "771: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00"
# elif _USDT_FORM == 2
/* nop; nopl 0x0(%rax,%rax,1) */
#  define _USDT_SITE_TEXT 771: .byte 0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00
#  define _USDT_SITE_STR "771: .byte 0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00"
# elif _USDT_FORM == 3
/* nop; cs nopw 0x0(%rax,%rax,1) */
#  define _USDT_SITE_TEXT 771: .byte 0x90, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00
#  define _USDT_SITE_STR "771: .byte 0x90, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00"
# elif _USDT_FORM == 4
/* nop */
#  define _USDT_SITE_TEXT 771: .byte 0x90
#  define _USDT_SITE_STR "771: .byte 0x90"
# else
#  error "USDTPATCH_SITE_FORM must be one of nop5, combo5, combo10, nop1"
# endif
/* Whether to guard: _USDT_RZ_ASKED is 1 when the build defined USDTPATCH_REDZONE_GUARD to
   anything but 0 (an empty definition counts as 1: `-DUSDTPATCH_REDZONE_GUARD=`), 0 for
   -DUSDTPATCH_REDZONE_GUARD=0, and undefined when the build said nothing. */
# if defined(USDTPATCH_REDZONE_GUARD)
#  if (0 - USDTPATCH_REDZONE_GUARD - 1) == -1
#   define _USDT_RZ_ASKED 0
#  else
#   define _USDT_RZ_ASKED 1
#  endif
# endif
# if defined(_USDT_RZ_ASKED)
#  define _USDT_RZ _USDT_RZ_ASKED
# elif (_USDT_FORM == 1 || _USDT_FORM == 2) && defined(__LP64__) && !defined(__KERNEL__) \
       && !defined(__ASSEMBLER__)
#  define _USDT_RZ 1
# else
#  define _USDT_RZ 0
# endif
# if _USDT_RZ
/* lea -0x80(%rsp),%rsp ... lea 0x80(%rsp),%rsp */
#  define _USDT_GUARD_IN .byte 0x48, 0x8d, 0x64, 0x24, 0x80
#  define _USDT_GUARD_OUT .byte 0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00
#  define _USDT_GUARD_IN_STR ".byte 0x48, 0x8d, 0x64, 0x24, 0x80"
#  define _USDT_GUARD_OUT_STR ".byte 0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00"
#  define _USDT_GUARDED 1
# endif
#elif defined(__ia64__) || defined(__s390__) || defined(__s390x__)
# define _USDT_SITE_TEXT 771: nop 0
# define _USDT_SITE_STR "771: nop 0"
#else
# define _USDT_SITE_TEXT 771: nop
# define _USDT_SITE_STR "771: nop"
#endif

#ifndef _USDT_GUARD_IN
# define _USDT_GUARD_IN
# define _USDT_GUARD_OUT
# define _USDT_GUARD_IN_STR ""
# define _USDT_GUARD_OUT_STR ""
#endif

/* The fork guard (docs/fork-guard.md).  On Linux 6.18 a child forked while a nop5 site is
   optimized inherits the site's `call` but not the trampoline page it calls, and dies at the
   site.  USDTPATCH_FORK_GUARD (default 1 with the nop5 and combo5 forms on x86-64; 0 turns it
   off; nop1 and combo10 sites are never optimized by 6.18 and are never guarded) records each
   site in the allocated section __usdtpatch_fork_sites, 12 bytes per site and no relocation:
     .4byte site - .     (the site's address relative to the entry)
     .byte  the site's 5 bytes, 0, 0, 0
   and adds, once per linked object (a COMDAT group, whatever the number of translation
   units), a constructor that registers a child handler with pthread_atfork.  The handler
   runs in every forked child and, for each site of the object that reads `call rel32` into a
   page the child does not have, writes back the kernel's int3 state (0xcc + the site's bytes
   1..4) through /proc/self/mem: the next hit traps, the probe fires in the child, and the
   kernel optimizes the site again there.  Its code is usdtpatch/forkguard/rearm.c, built by
   usdtpatch/forkguard/recipe.py; the bytes below are that build's (a test compares them). */
#if defined(__x86_64__) && defined(__LP64__) && (_USDT_FORM == 1 || _USDT_FORM == 2)
# ifndef USDTPATCH_FORK_GUARD
#  define USDTPATCH_FORK_GUARD 1
# endif
# if USDTPATCH_FORK_GUARD
#  define _USDT_FORK_GUARDED 1
#  if _USDT_FORM == 1
#   define _USDT_FG_SITE 771b
#  else
#   define _USDT_FG_SITE 771b + 1
#  endif
#  define _USDT_FG_ENTRY                                                                  \
  .pushsection __usdtpatch_fork_sites, "a?", @progbits;                                   \
  .balign 4;                                                                               \
  .4byte _USDT_FG_SITE - .;                                                                \
  .byte 0x0f, 0x1f, 0x44, 0x00, 0x00, 0, 0, 0;                                             \
  .popsection
#  define _USDT_FG_ENTRY_STR _USDT_FG_ENTRY_IN(".pushsection __usdtpatch_fork_sites, \"a?\", @progbits\n")
/* In the probe macros' extended asm the entry's section is SHF_LINK_ORDER to the code around
   the site (label .Lusdt_fg_%=, unique per asm instance): a linker that garbage-collects
   sections keeps an entry exactly when it keeps the site's code, also under
   -z start-stop-gc.  (STAP_PROBE_ASM may be expanded in a basic asm, where %= is not
   available: there the entry is a plain one.) */
#  define _USDT_FG_ENTRY_LO_STR _USDT_FG_ENTRY_IN(                                        \
  ".Lusdt_fg_%=: .pushsection __usdtpatch_fork_sites, \"ao?\", @progbits, .Lusdt_fg_%=\n")
#  define _USDT_FG_ENTRY_IN(push)                                                         \
  push                                                                                     \
  ".balign 4\n"                                                                            \
  ".4byte " _USDT_XSTR(_USDT_FG_SITE) " - .\n"                                            \
  ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00, 0, 0, 0\n"                                          \
  ".popsection\n"
/* the entry's five lines come out of the line-count padding (see _USDT_PAD_0) */
#  define _USDT_FG_PAD ""
# endif
#endif
#ifndef _USDT_FORK_GUARDED
# define _USDT_FG_ENTRY
# define _USDT_FG_ENTRY_STR ""
# define _USDT_FG_ENTRY_LO_STR ""
# define _USDT_FG_PAD "\n\n\n\n\n"
#endif

#ifdef __LP64__
# define _USDT_ADDR .8byte
#else
# define _USDT_ADDR .4byte
#endif

/* "?" puts the note in the section group of the code around it (C++ inline functions and
   templates live in COMDAT groups: a note outside the group would point into a discarded
   copy). */
#define _USDT_NOTE_SECTION .pushsection .note.stapsdt, "?", "note"
#define _USDT_BASE_SECTION .pushsection .stapsdt.base, "aG", "progbits", .stapsdt.base, comdat
#define _USDT_NOTE_SECTION_STR ".pushsection .note.stapsdt, \"?\", \"note\""
#define _USDT_BASE_SECTION_STR \
  ".pushsection .stapsdt.base, \"aG\", \"progbits\", .stapsdt.base, comdat"

#if defined(_SDT_HAS_SEMAPHORES)
# define _USDT_SEMA_SYM(p, n) p##_##n##_semaphore
# define _USDT_SEMA_ADDR(p, n) _USDT_SEMA_SYM(p, n)
#else
# define _USDT_SEMA_ADDR(p, n) 0
#endif

#ifdef __ASSEMBLER__
/* --- assembler side: STAP_PROBEn(provider, name, "N@operand"...) in .S files --------- */
/* The arguments are note argument specs written out, e.g. STAP_PROBE2(p, n, 8@%rdi, -4@%esi).
   Statements are separated with ';'. */
# define _USDT_ASM_PROBE(provider, name, argtext)                                             \
  _USDT_GUARD_IN;                                                                              \
  _USDT_SITE_TEXT;                                                                             \
  _USDT_GUARD_OUT;                                                                             \
  _USDT_FG_ENTRY;                                                                              \
  _USDT_NOTE_SECTION;                                                                          \
  .balign 4;                                                                                   \
  .4byte 773f - 772f, 775f - 774f, 3;                                                          \
  772: .asciz "stapsdt";                                                                       \
  773: .balign 4;                                                                              \
  774: _USDT_ADDR 771b;                                                                        \
  _USDT_ADDR _.stapsdt.base;                                                                   \
  _USDT_ADDR _USDT_SEMA_ADDR(provider, name);                                                  \
  .asciz _USDT_XSTR(provider);                                                                 \
  .asciz _USDT_XSTR(name);                                                                     \
  .asciz argtext;                                                                              \
  775: .balign 4;                                                                              \
  .popsection;                                                                                 \
  .ifndef _.stapsdt.base;                                                                      \
  _USDT_BASE_SECTION;                                                                          \
  .weak _.stapsdt.base;                                                                        \
  .hidden _.stapsdt.base;                                                                      \
  _.stapsdt.base: .space 1;                                                                    \
  .size _.stapsdt.base, 1;                                                                     \
  .popsection;                                                                                 \
  .endif
# define _USDT_J0()
# define _USDT_J1(a) a
# define _USDT_J2(a, b) a b
# define _USDT_J3(a, b, c) a b c
# define _USDT_J4(a, b, c, d) a b c d
# define _USDT_J5(a, b, c, d, e) a b c d e
# define _USDT_J6(a, b, c, d, e, f) a b c d e f
# define _USDT_J7(a, b, c, d, e, f, g) a b c d e f g
# define _USDT_J8(a, b, c, d, e, f, g, h) a b c d e f g h
# define _USDT_J9(a, b, c, d, e, f, g, h, i) a b c d e f g h i
# define _USDT_J10(a, b, c, d, e, f, g, h, i, j) a b c d e f g h i j
# define _USDT_J11(a, b, c, d, e, f, g, h, i, j, k) a b c d e f g h i j k
# define _USDT_J12(a, b, c, d, e, f, g, h, i, j, k, l) a b c d e f g h i j k l
# define _USDT_PROBE(provider, name, n, arglist) \
  _USDT_ASM_PROBE(provider, name, _USDT_XSTR(_USDT_J##n arglist))

#else /* C and C++ */

/* --- argument descriptors --------------------------------------------------------------- */
/* __builtin_classify_type: 1 integer, 2 char, 3 enum, 4 bool, 5 pointer, 8 real, 14 array. */
# define _USDT_CLASS(x) __builtin_classify_type(x)
# define _USDT_IS_PTR(x) (_USDT_CLASS(x) == 5 || _USDT_CLASS(x) == 14)
# define _USDT_IS_FLOAT(x) (_USDT_CLASS(x) == 8)
# define _USDT_SIZE(x) (_USDT_IS_PTR(x) ? sizeof(void *) : sizeof(x))

# ifdef __cplusplus
/* Signed: the standard signed integer types (cv-qualified or not), and char and wchar_t where
   they are signed.  Everything else (unsigned types, bool, enums, pointers, floating point,
   classes, the extended integer types) is described as unsigned.  extern "C++": the header
   may be included inside an extern "C" block. */
extern "C++" {
template <typename __usdt_T> struct __usdt_signed_type { static const bool __value = false; };
template <typename __usdt_T> struct __usdt_signed_type<const __usdt_T>
    : __usdt_signed_type<__usdt_T> {};
template <typename __usdt_T> struct __usdt_signed_type<volatile __usdt_T>
    : __usdt_signed_type<__usdt_T> {};
template <typename __usdt_T> struct __usdt_signed_type<const volatile __usdt_T>
    : __usdt_signed_type<__usdt_T> {};
template <> struct __usdt_signed_type<signed char> { static const bool __value = true; };
template <> struct __usdt_signed_type<short> { static const bool __value = true; };
template <> struct __usdt_signed_type<int> { static const bool __value = true; };
template <> struct __usdt_signed_type<long> { static const bool __value = true; };
/* long long is C++11: before, g++ -pedantic warns even under __extension__ */
#  if __cplusplus < 201103L
#   pragma GCC diagnostic push
#   pragma GCC diagnostic ignored "-Wlong-long"
#  endif
template <> struct __usdt_signed_type<long long> { static const bool __value = true; };
#  if __cplusplus < 201103L
#   pragma GCC diagnostic pop
#  endif
template <> struct __usdt_signed_type<char> {
  static const bool __value = ((char)-1 < (char)1);
};
template <> struct __usdt_signed_type<wchar_t> {
  static const bool __value = ((wchar_t)-1 < (wchar_t)1);
};
}
#  define _USDT_SIGNED(x) (!_USDT_IS_PTR(x) && __usdt_signed_type<__typeof__(x)>::__value)
# else
/* C: an integer, char, enum or bool expression keeps its type, anything else is looked at as
   unsigned int; the type is signed when (T)-1 < (T)1. */
#  define _USDT_INTTYPE(x) \
  __typeof__(__builtin_choose_expr(_USDT_CLASS(x) >= 1 && _USDT_CLASS(x) <= 4, (x), 0U))
#  define _USDT_SIGNED(x) ((_USDT_INTTYPE(x))-1 < (_USDT_INTTYPE(x))1)
# endif

# define _USDT_DESC(x)                                                         \
  ((int)(((_USDT_SIZE(x) / 10) % 10) << 8) | (int)((_USDT_SIZE(x) % 10) << 4)   \
   | (_USDT_SIZE(x) >= 10 ? 8 : 0) | (_USDT_IS_FLOAT(x) ? 2 : 0) | (_USDT_SIGNED(x) ? 1 : 0))

# if defined(STAP_SDT_ARG_CONSTRAINT)
#  define _USDT_CONSTRAINT _USDT_XSTR(STAP_SDT_ARG_CONSTRAINT)
# elif defined(__powerpc__)
#  define _USDT_CONSTRAINT "nZr"
# elif defined(__ia64__)
#  define _USDT_CONSTRAINT "nr"
# elif defined(__arm__)
#  define _USDT_CONSTRAINT "g"
# else
#  define _USDT_CONSTRAINT "nor"
# endif

# if defined(__powerpc__) || defined(__powerpc64__)
#  define _USDT_OPERAND(i) "%I[__usdt_a" #i "]%[__usdt_a" #i "]"
# elif defined(__i386__)
#  define _USDT_OPERAND(i) "%k[__usdt_a" #i "]"
# else
#  define _USDT_OPERAND(i) "%[__usdt_a" #i "]"
# endif

# define _USDT_OPS(i, x) \
  [__usdt_d##i] "n"(_USDT_DESC(x)), [__usdt_a##i] _USDT_CONSTRAINT(x)
/* The guarded form's operands: a register or an immediate, never memory (see above). */
# define _USDT_ROPS(i, x) [__usdt_d##i] "n"(_USDT_DESC(x)), [__usdt_a##i] "nr"(x)
/* Whether an argument fits a general register, as "nr" needs: a pointer (or an array or a
   function, which decay to one), or a value of 1, 2, 4 or 8 bytes that is not complex.  A
   probe with an argument that does not (long double, __int128, a large or odd-sized struct,
   _Complex) cannot be guarded: it gets systemtap's 1-byte nop site (never optimized, so
   nothing is written below rsp) and systemtap's operands. */
# define _USDT_FIT1(x)                                                          \
  (_USDT_CLASS(x) != 9                                                          \
   && (_USDT_SIZE(x) == 1 || _USDT_SIZE(x) == 2 || _USDT_SIZE(x) == 4 || _USDT_SIZE(x) == 8))

/* One argument's text, [-]N[f]@OPERAND, from its descriptor D: `.fill COUNT, 1, BYTE` with a
   COUNT of 0 or 1 emits a character only when its bit is set (no .if blocks: an asm's line
   count is what the compiler's inliner weighs, keep it close to systemtap's). */
# define _USDT_ARGTEXT(i)                                                     \
  ".fill %c[__usdt_d" #i "] & 1, 1, 0x2d\n"                                   \
  ".fill (%c[__usdt_d" #i "] >> 3) & 1, 1, 48 + ((%c[__usdt_d" #i "] >> 8) & 15)\n" \
  ".byte 48 + ((%c[__usdt_d" #i "] >> 4) & 15)\n"                             \
  ".fill (%c[__usdt_d" #i "] >> 1) & 1, 1, 0x66\n"                            \
  ".ascii \"@" _USDT_OPERAND(i) "\"\n"
# define _USDT_SP ".ascii \" \"\n"

# define _USDT_TEXT_0 ""
# define _USDT_TEXT_1 _USDT_ARGTEXT(1)
# define _USDT_TEXT_2 _USDT_TEXT_1 _USDT_SP _USDT_ARGTEXT(2)
# define _USDT_TEXT_3 _USDT_TEXT_2 _USDT_SP _USDT_ARGTEXT(3)
# define _USDT_TEXT_4 _USDT_TEXT_3 _USDT_SP _USDT_ARGTEXT(4)
# define _USDT_TEXT_5 _USDT_TEXT_4 _USDT_SP _USDT_ARGTEXT(5)
# define _USDT_TEXT_6 _USDT_TEXT_5 _USDT_SP _USDT_ARGTEXT(6)
# define _USDT_TEXT_7 _USDT_TEXT_6 _USDT_SP _USDT_ARGTEXT(7)
# define _USDT_TEXT_8 _USDT_TEXT_7 _USDT_SP _USDT_ARGTEXT(8)
# define _USDT_TEXT_9 _USDT_TEXT_8 _USDT_SP _USDT_ARGTEXT(9)
# define _USDT_TEXT_10 _USDT_TEXT_9 _USDT_SP _USDT_ARGTEXT(10)
# define _USDT_TEXT_11 _USDT_TEXT_10 _USDT_SP _USDT_ARGTEXT(11)
# define _USDT_TEXT_12 _USDT_TEXT_11 _USDT_SP _USDT_ARGTEXT(12)

/* Line-count parity: GCC weighs an asm statement by its number of lines when it decides
   what to inline and unroll (tree-inline.c, estimate_num_insns).  Each probe asm is padded
   with empty lines to the count of systemtap's, so that a file builds into the same code
   around its probes, and the same argument locations, with either header. */
# define _USDT_PAD_0 "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_1 "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_2 "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_3 "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_4 "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_5 "\n\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_6 "\n\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_7 "\n\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_8 "\n\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_9 "\n\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_10 "\n\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_11 "\n\n\n\n\n\n\n\n" _USDT_FG_PAD
# define _USDT_PAD_12 "\n\n\n\n\n\n\n" _USDT_FG_PAD

# define _USDT_FIT_0() 1
# define _USDT_FIT_1(a) _USDT_FIT1(a)
# define _USDT_FIT_2(a, b) (_USDT_FIT1(a) && _USDT_FIT1(b))
# define _USDT_FIT_3(a, b, c) (_USDT_FIT_2(a, b) && _USDT_FIT1(c))
# define _USDT_FIT_4(a, b, c, d) (_USDT_FIT_3(a, b, c) && _USDT_FIT1(d))
# define _USDT_FIT_5(a, b, c, d, e) (_USDT_FIT_4(a, b, c, d) && _USDT_FIT1(e))
# define _USDT_FIT_6(a, b, c, d, e, f) (_USDT_FIT_5(a, b, c, d, e) && _USDT_FIT1(f))
# define _USDT_FIT_7(a, b, c, d, e, f, g) (_USDT_FIT_6(a, b, c, d, e, f) && _USDT_FIT1(g))
# define _USDT_FIT_8(a, b, c, d, e, f, g, h) \
  (_USDT_FIT_7(a, b, c, d, e, f, g) && _USDT_FIT1(h))
# define _USDT_FIT_9(a, b, c, d, e, f, g, h, i) \
  (_USDT_FIT_8(a, b, c, d, e, f, g, h) && _USDT_FIT1(i))
# define _USDT_FIT_10(a, b, c, d, e, f, g, h, i, j) \
  (_USDT_FIT_9(a, b, c, d, e, f, g, h, i) && _USDT_FIT1(j))
# define _USDT_FIT_11(a, b, c, d, e, f, g, h, i, j, k) \
  (_USDT_FIT_10(a, b, c, d, e, f, g, h, i, j) && _USDT_FIT1(k))
# define _USDT_FIT_12(a, b, c, d, e, f, g, h, i, j, k, l) \
  (_USDT_FIT_11(a, b, c, d, e, f, g, h, i, j, k) && _USDT_FIT1(l))

# define _USDT_ROPERANDS_0() [__usdt_none] "g"(0)
# define _USDT_ROPERANDS_1(a) _USDT_ROPS(1, a)
# define _USDT_ROPERANDS_2(a, b) _USDT_ROPERANDS_1(a), _USDT_ROPS(2, b)
# define _USDT_ROPERANDS_3(a, b, c) _USDT_ROPERANDS_2(a, b), _USDT_ROPS(3, c)
# define _USDT_ROPERANDS_4(a, b, c, d) _USDT_ROPERANDS_3(a, b, c), _USDT_ROPS(4, d)
# define _USDT_ROPERANDS_5(a, b, c, d, e) _USDT_ROPERANDS_4(a, b, c, d), _USDT_ROPS(5, e)
# define _USDT_ROPERANDS_6(a, b, c, d, e, f) \
  _USDT_ROPERANDS_5(a, b, c, d, e), _USDT_ROPS(6, f)
# define _USDT_ROPERANDS_7(a, b, c, d, e, f, g) \
  _USDT_ROPERANDS_6(a, b, c, d, e, f), _USDT_ROPS(7, g)
# define _USDT_ROPERANDS_8(a, b, c, d, e, f, g, h) \
  _USDT_ROPERANDS_7(a, b, c, d, e, f, g), _USDT_ROPS(8, h)
# define _USDT_ROPERANDS_9(a, b, c, d, e, f, g, h, i) \
  _USDT_ROPERANDS_8(a, b, c, d, e, f, g, h), _USDT_ROPS(9, i)
# define _USDT_ROPERANDS_10(a, b, c, d, e, f, g, h, i, j) \
  _USDT_ROPERANDS_9(a, b, c, d, e, f, g, h, i), _USDT_ROPS(10, j)
# define _USDT_ROPERANDS_11(a, b, c, d, e, f, g, h, i, j, k) \
  _USDT_ROPERANDS_10(a, b, c, d, e, f, g, h, i, j), _USDT_ROPS(11, k)
# define _USDT_ROPERANDS_12(a, b, c, d, e, f, g, h, i, j, k, l) \
  _USDT_ROPERANDS_11(a, b, c, d, e, f, g, h, i, j, k), _USDT_ROPS(12, l)

# define _USDT_OPERANDS_0() [__usdt_none] "g"(0)
# define _USDT_OPERANDS_1(a) _USDT_OPS(1, a)
# define _USDT_OPERANDS_2(a, b) _USDT_OPERANDS_1(a), _USDT_OPS(2, b)
# define _USDT_OPERANDS_3(a, b, c) _USDT_OPERANDS_2(a, b), _USDT_OPS(3, c)
# define _USDT_OPERANDS_4(a, b, c, d) _USDT_OPERANDS_3(a, b, c), _USDT_OPS(4, d)
# define _USDT_OPERANDS_5(a, b, c, d, e) _USDT_OPERANDS_4(a, b, c, d), _USDT_OPS(5, e)
# define _USDT_OPERANDS_6(a, b, c, d, e, f) _USDT_OPERANDS_5(a, b, c, d, e), _USDT_OPS(6, f)
# define _USDT_OPERANDS_7(a, b, c, d, e, f, g) \
  _USDT_OPERANDS_6(a, b, c, d, e, f), _USDT_OPS(7, g)
# define _USDT_OPERANDS_8(a, b, c, d, e, f, g, h) \
  _USDT_OPERANDS_7(a, b, c, d, e, f, g), _USDT_OPS(8, h)
# define _USDT_OPERANDS_9(a, b, c, d, e, f, g, h, i) \
  _USDT_OPERANDS_8(a, b, c, d, e, f, g, h), _USDT_OPS(9, i)
# define _USDT_OPERANDS_10(a, b, c, d, e, f, g, h, i, j) \
  _USDT_OPERANDS_9(a, b, c, d, e, f, g, h, i), _USDT_OPS(10, j)
# define _USDT_OPERANDS_11(a, b, c, d, e, f, g, h, i, j, k) \
  _USDT_OPERANDS_10(a, b, c, d, e, f, g, h, i, j), _USDT_OPS(11, k)
# define _USDT_OPERANDS_12(a, b, c, d, e, f, g, h, i, j, k, l) \
  _USDT_OPERANDS_11(a, b, c, d, e, f, g, h, i, j, k), _USDT_OPS(12, l)

/* The whole probe as asm text: site, note, base.  `argtext` is a string of assembler lines
   that emit the argument string without its terminating NUL. */
# define _USDT_BODY(provider, name, argtext) \
  _USDT_BODY_E(provider, name, argtext, _USDT_FG_ENTRY_STR)
# define _USDT_BODY_E(provider, name, argtext, fgentry) \
  _USDT_BODY_S(provider, name, argtext, fgentry, _USDT_GUARD_IN_STR, _USDT_SITE_STR, \
               _USDT_GUARD_OUT_STR)
# define _USDT_BODY_S(provider, name, argtext, fgentry, gin, site, gout)       \
  gin "\n"                                                                     \
  site "\n"                                                                    \
  gout "\n"                                                                    \
  fgentry                                                                      \
  _USDT_NOTE_SECTION_STR "\n"                                          \
  ".balign 4\n"                                                                \
  ".4byte 773f - 772f, 775f - 774f, 3\n"                                       \
  "772: .asciz \"stapsdt\"\n"                                                  \
  "773: .balign 4\n"                                                           \
  "774: " _USDT_XSTR(_USDT_ADDR) " 771b\n"                                     \
  _USDT_XSTR(_USDT_ADDR) " _.stapsdt.base\n"                                   \
  _USDT_XSTR(_USDT_ADDR) " " _USDT_XSTR(_USDT_SEMA_ADDR(provider, name)) "\n"  \
  ".asciz " _USDT_XSTR(_USDT_XSTR(provider)) "\n"                               \
  ".asciz " _USDT_XSTR(_USDT_XSTR(name)) "\n"                                   \
  argtext                                                                      \
  ".byte 0\n"                                                                  \
  "775: .balign 4\n"                                                           \
  ".popsection\n"
# define _USDT_BASE                                                             \
  ".ifndef _.stapsdt.base\n"                                                   \
  _USDT_BASE_SECTION_STR "\n"                                          \
  ".weak _.stapsdt.base\n"                                                     \
  ".hidden _.stapsdt.base\n"                                                   \
  "_.stapsdt.base: .space 1\n"                                                 \
  ".size _.stapsdt.base, 1\n"                                                  \
  ".popsection\n"                                                              \
  ".endif\n"

# if defined(_SDT_HAS_SEMAPHORES)
/* Tell the compiler the semaphore is used, so that it is kept and (with LTO) not localized
   away; the note names it only in assembler text. */
#  define _USDT_SEMA_USE(provider, name) \
  __asm__ __volatile__("" ::"m"(_USDT_SEMA_SYM(provider, name)));
# else
#  define _USDT_SEMA_USE(provider, name)
# endif

/* A probe is one asm statement for the site and the note, and one for the base.  The
   asm strings of a probe exceed the 509 characters C90 promises: `__extension__` on a
   statement expression keeps -std=c89 -pedantic quiet about it, as about nothing else.
   _USDT_ASM is that statement, as an expression: `body`, the line-count padding and `pad`,
   and the operand list `operands##n` (_USDT_ROPERANDS_ or _USDT_OPERANDS_); _USDT_SITE_ASM
   is the one of a probe on this header's site, guarded or not as the operands say. */
# define _USDT_ASM(operands, n, arglist, body, pad) \
  __extension__ ({ __asm__ __volatile__(body _USDT_PAD_##n pad ::operands##n arglist); })
# define _USDT_SITE_ASM(operands, provider, name, n, arglist) \
  _USDT_ASM(operands, n, arglist,                                                      \
            _USDT_BODY_E(provider, name, _USDT_TEXT_##n, _USDT_FG_ENTRY_LO_STR), "")
# ifdef _USDT_GUARDED
/* Guarded: the guarded nop5 site with register operands when every argument fits a
   register, else systemtap's site and operands.  The choice is a constant: in C,
   __builtin_choose_expr compiles only the chosen asm; in C++ the other branch of the `if`
   is dropped before code is generated (at -O0 too; g++ -O0 still warns "unsupported size
   for integer register" for a 16-byte argument there). */
#  ifdef _USDT_FORK_GUARDED
#   define _USDT_FALLBACK_PAD "\n\n\n\n\n"
#  else
#   define _USDT_FALLBACK_PAD ""
#  endif
#  define _USDT_GUARDED_ASM(provider, name, n, arglist) \
  _USDT_SITE_ASM(_USDT_ROPERANDS_, provider, name, n, arglist)
#  define _USDT_FALLBACK_ASM(provider, name, n, arglist)                               \
  _USDT_ASM(_USDT_OPERANDS_, n, arglist,                                               \
            _USDT_BODY_S(provider, name, _USDT_TEXT_##n, "", "", "771: nop", ""),      \
            _USDT_FALLBACK_PAD)
#  ifdef __cplusplus
#   define _USDT_PROBE_ASM(provider, name, n, arglist)                                 \
  if (_USDT_FIT_##n arglist)                                                           \
    _USDT_GUARDED_ASM(provider, name, n, arglist);                                     \
  else                                                                                 \
    _USDT_FALLBACK_ASM(provider, name, n, arglist);
#  else
#   define _USDT_PROBE_ASM(provider, name, n, arglist)                                 \
  __builtin_choose_expr(_USDT_FIT_##n arglist,                                         \
                        _USDT_GUARDED_ASM(provider, name, n, arglist),                 \
                        _USDT_FALLBACK_ASM(provider, name, n, arglist));
#  endif
# else
#  define _USDT_PROBE_ASM(provider, name, n, arglist) \
  _USDT_SITE_ASM(_USDT_OPERANDS_, provider, name, n, arglist);
# endif
# define _USDT_PROBE(provider, name, n, arglist)                                       \
  do {                                                                                 \
    _USDT_SEMA_USE(provider, name)                                                     \
    _USDT_PROBE_ASM(provider, name, n, arglist)                                        \
    __asm__ __volatile__(_USDT_BASE);                                                  \
  } while (0)

/* STAP_PROBE_ASM(provider, name, args) gives the probe as a string to place inside an asm
   statement's template.  `args` is either note argument text written out (e.g.
   %eax 4(%esi) in a basic asm; write %%eax in an extended one), or
   STAP_PROBE_ASM_TEMPLATE(n), whose operands STAP_PROBE_ASM_OPERANDS(n, a1, ..., an) then
   supplies in the asm's input list. */
# define _USDT_ASM_ARGS_1(text) ".ascii \"" #text "\"\n"
# define _USDT_ASM_ARGS_2(mark, tmpl) tmpl
# ifdef _USDT_GUARDED
#  define _USDT_ASM_OPERANDS(n) _USDT_ROPERANDS_##n
# else
#  define _USDT_ASM_OPERANDS(n) _USDT_OPERANDS_##n
# endif
# if (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L) \
     || (defined(__cplusplus) && __cplusplus >= 201103L)
#  define _USDT_ASM_NARGS(...) _USDT_ASM_NARGS_(__VA_ARGS__, 2, 1, 0)
#  define _USDT_ASM_NARGS_(a, b, n, ...) n
#  define _USDT_ASM_ARGS_N(n, ...) _USDT_CAT(_USDT_ASM_ARGS_, n)(__VA_ARGS__)
#  define STAP_PROBE_ASM(provider, name, ...)  \
  _USDT_BODY(provider, name, _USDT_ASM_ARGS_N(_USDT_ASM_NARGS(__VA_ARGS__), __VA_ARGS__)) _USDT_BASE
#  define STAP_PROBE_ASM_OPERANDS(n, ...) _USDT_ASM_OPERANDS(n)(__VA_ARGS__)
# else
#  define STAP_PROBE_ASM(provider, name, args) \
  _USDT_BODY(provider, name, _USDT_ASM_ARGS_1(args)) _USDT_BASE
# endif
# define STAP_PROBE_ASM_TEMPLATE(n) _usdt_template_mark, _USDT_TEXT_##n


# ifdef _USDT_FORK_GUARDED
/* The fork guard's handler and constructor, once per linked object: everything is in the
   COMDAT group __usdtpatch_fork_guard (and `.ifndef` keeps an LTO partition that merges
   several translation units from defining it twice).
     __usdtpatch_fork_child   the atfork child handler: rearm(this object's table)
     __usdtpatch_fork_init    in .init_array: pthread_atfork(0, 0, __usdtpatch_fork_child)
                              (glibc's pthread_atfork passes the object's __dso_handle, so the
                              handler goes away when a shared object is unloaded)
     __usdtpatch_fork_rearm   rearm.c's usdtpatch_rearm, as built by the recipe
   The empty entry (rel 0, skipped) makes __start_/__stop___usdtpatch_fork_sites exist in
   every object that has the handler. */
__extension__ __asm__(".ifndef __usdtpatch_fork_child\n"
  ".pushsection .text.__usdtpatch_fork_guard, \"axG\", @progbits, __usdtpatch_fork_guard, comdat\n"
  ".balign 16\n"
  ".globl __usdtpatch_fork_child\n"
  ".hidden __usdtpatch_fork_child\n"
  ".type __usdtpatch_fork_child, @function\n"
  "__usdtpatch_fork_child:\n"
  "leaq __start___usdtpatch_fork_sites(%rip), %rdi\n"
  "leaq __stop___usdtpatch_fork_sites(%rip), %rsi\n"
  "jmp __usdtpatch_fork_rearm\n"
  ".size __usdtpatch_fork_child, . - __usdtpatch_fork_child\n"
  ".globl __usdtpatch_fork_init\n"
  ".hidden __usdtpatch_fork_init\n"
  ".type __usdtpatch_fork_init, @function\n"
  "__usdtpatch_fork_init:\n"
  "leaq __usdtpatch_fork_child(%rip), %rdx\n"
  "xorl %esi, %esi\n"
  "xorl %edi, %edi\n"
  "jmp pthread_atfork@PLT\n"
  ".size __usdtpatch_fork_init, . - __usdtpatch_fork_init\n"
  ".globl __usdtpatch_fork_rearm\n"
  ".hidden __usdtpatch_fork_rearm\n"
  ".type __usdtpatch_fork_rearm, @function\n"
  "__usdtpatch_fork_rearm:\n"
  "/* usdtpatch-forkguard-code begin */\n"
  ".byte 0x41, 0x57, 0x49, 0x89, 0xf9, 0x49, 0x83, 0xc8, 0xff, 0x41, 0xbf, 0x1b, 0x00, 0x00, 0x00, 0x41\n"
  ".byte 0x56, 0x41, 0xbe, 0x07, 0x00, 0x00, 0x00, 0x41, 0x55, 0x41, 0xbd, 0x0a, 0x00, 0x00, 0x00, 0x41\n"
  ".byte 0x54, 0x55, 0x48, 0x89, 0xf5, 0x53, 0x31, 0xdb, 0x4c, 0x8d, 0x64, 0x24, 0xfa, 0x49, 0x39, 0xe9\n"
  ".byte 0x0f, 0x83, 0x22, 0x01, 0x00, 0x00, 0x4d, 0x63, 0x11, 0x45, 0x85, 0xd2, 0x0f, 0x84, 0x0d, 0x01\n"
  ".byte 0x00, 0x00, 0x4d, 0x01, 0xca, 0x41, 0x8a, 0x02, 0x3c, 0xe8, 0x0f, 0x85, 0xff, 0x00, 0x00, 0x00\n"
  ".byte 0x41, 0x0f, 0xb6, 0x4a, 0x01, 0x41, 0x0f, 0xb6, 0x42, 0x02, 0x41, 0x0f, 0xb6, 0x72, 0x03, 0x41\n"
  ".byte 0x8a, 0x52, 0x04, 0xc1, 0xe0, 0x08, 0xc1, 0xe6, 0x10, 0xc1, 0xe2, 0x18, 0x09, 0xf0, 0xbe, 0x00\n"
  ".byte 0x10, 0x00, 0x00, 0x09, 0xc8, 0x09, 0xd0, 0x4c, 0x89, 0xe2, 0x48, 0x98, 0x49, 0x8d, 0x7c, 0x02\n"
  ".byte 0x05, 0x4c, 0x89, 0xf8, 0x48, 0x81, 0xe7, 0x00, 0xf0, 0xff, 0xff, 0x0f, 0x05, 0x48, 0x83, 0xf8\n"
  ".byte 0xf4, 0x0f, 0x85, 0xb8, 0x00, 0x00, 0x00, 0x41, 0x8a, 0x41, 0x05, 0xc6, 0x44, 0x24, 0xfb, 0xcc\n"
  ".byte 0x88, 0x44, 0x24, 0xfc, 0x41, 0x8a, 0x41, 0x06, 0x88, 0x44, 0x24, 0xfd, 0x41, 0x8a, 0x41, 0x07\n"
  ".byte 0x88, 0x44, 0x24, 0xfe, 0x41, 0x8a, 0x41, 0x08, 0x88, 0x44, 0x24, 0xff, 0x49, 0x83, 0xf8, 0xff\n"
  ".byte 0x75, 0x18, 0xb8, 0x02, 0x00, 0x00, 0x00, 0x48, 0x8d, 0x3d, 0xb2, 0x00, 0x00, 0x00, 0xbe, 0x02\n"
  ".byte 0x00, 0x08, 0x00, 0x31, 0xd2, 0x0f, 0x05, 0x49, 0x89, 0xc0, 0x4d, 0x85, 0xc0, 0x78, 0x1c, 0x48\n"
  ".byte 0x8d, 0x74, 0x24, 0xfb, 0xb8, 0x12, 0x00, 0x00, 0x00, 0xba, 0x05, 0x00, 0x00, 0x00, 0x4c, 0x89\n"
  ".byte 0xc7, 0x0f, 0x05, 0x48, 0x83, 0xf8, 0x05, 0x75, 0x09, 0xeb, 0x52, 0x49, 0xc7, 0xc0, 0xfe, 0xff\n"
  ".byte 0xff, 0xff, 0x4c, 0x89, 0xd7, 0x49, 0x8d, 0xb2, 0x04, 0x10, 0x00, 0x00, 0x4c, 0x89, 0xe8, 0x4c\n"
  ".byte 0x89, 0xf2, 0x48, 0x81, 0xe7, 0x00, 0xf0, 0xff, 0xff, 0x48, 0x81, 0xe6, 0x00, 0xf0, 0xff, 0xff\n"
  ".byte 0x48, 0x29, 0xfe, 0x0f, 0x05, 0x48, 0x85, 0xc0, 0x75, 0x25, 0xba, 0x01, 0x00, 0x00, 0x00, 0x8a\n"
  ".byte 0x4c, 0x14, 0xfb, 0x49, 0x8d, 0x04, 0x12, 0x48, 0xff, 0xc2, 0x88, 0x08, 0x48, 0x83, 0xfa, 0x05\n"
  ".byte 0x75, 0xed, 0x41, 0xc6, 0x02, 0xcc, 0xb8, 0x0a, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xff, 0xc3, 0x49\n"
  ".byte 0x83, 0xc1, 0x0c, 0xe9, 0xd5, 0xfe, 0xff, 0xff, 0x4d, 0x85, 0xc0, 0x78, 0x0f, 0x31, 0xd2, 0xb8\n"
  ".byte 0x03, 0x00, 0x00, 0x00, 0x4c, 0x89, 0xc7, 0x48, 0x89, 0xd6, 0x0f, 0x05, 0x89, 0xd8, 0x5b, 0x5d\n"
  ".byte 0x41, 0x5c, 0x41, 0x5d, 0x41, 0x5e, 0x41, 0x5f, 0xc3, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00\n"
  ".byte 0x2f, 0x70, 0x72, 0x6f, 0x63, 0x2f, 0x73, 0x65, 0x6c, 0x66, 0x2f, 0x6d, 0x65, 0x6d, 0x00\n"
  "/* usdtpatch-forkguard-code end */\n"
  ".size __usdtpatch_fork_rearm, . - __usdtpatch_fork_rearm\n"
  ".section .init_array, \"awG\", @init_array, __usdtpatch_fork_guard, comdat\n"
  ".balign 8\n"
  ".quad __usdtpatch_fork_init\n"
  ".section __usdtpatch_fork_sites, \"aG\", @progbits, __usdtpatch_fork_guard, comdat\n"
  ".balign 4\n"
  ".4byte 0, 0, 0\n"
  ".popsection\n"
  ".hidden __start___usdtpatch_fork_sites\n"
  ".hidden __stop___usdtpatch_fork_sites\n"
  ".endif\n");
# endif

#endif /* __ASSEMBLER__ */

/* --- the public macros ---------------------------------------------------------------- */

#define STAP_PROBE(provider, name) _USDT_PROBE(provider, name, 0, ())
#define STAP_PROBE1(provider, name, a1) _USDT_PROBE(provider, name, 1, (a1))
#define STAP_PROBE2(provider, name, a1, a2) _USDT_PROBE(provider, name, 2, (a1, a2))
#define STAP_PROBE3(provider, name, a1, a2, a3) _USDT_PROBE(provider, name, 3, (a1, a2, a3))
#define STAP_PROBE4(provider, name, a1, a2, a3, a4) \
  _USDT_PROBE(provider, name, 4, (a1, a2, a3, a4))
#define STAP_PROBE5(provider, name, a1, a2, a3, a4, a5) \
  _USDT_PROBE(provider, name, 5, (a1, a2, a3, a4, a5))
#define STAP_PROBE6(provider, name, a1, a2, a3, a4, a5, a6) \
  _USDT_PROBE(provider, name, 6, (a1, a2, a3, a4, a5, a6))
#define STAP_PROBE7(provider, name, a1, a2, a3, a4, a5, a6, a7) \
  _USDT_PROBE(provider, name, 7, (a1, a2, a3, a4, a5, a6, a7))
#define STAP_PROBE8(provider, name, a1, a2, a3, a4, a5, a6, a7, a8) \
  _USDT_PROBE(provider, name, 8, (a1, a2, a3, a4, a5, a6, a7, a8))
#define STAP_PROBE9(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9) \
  _USDT_PROBE(provider, name, 9, (a1, a2, a3, a4, a5, a6, a7, a8, a9))
#define STAP_PROBE10(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10) \
  _USDT_PROBE(provider, name, 10, (a1, a2, a3, a4, a5, a6, a7, a8, a9, a10))
#define STAP_PROBE11(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11) \
  _USDT_PROBE(provider, name, 11, (a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11))
#define STAP_PROBE12(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12) \
  _USDT_PROBE(provider, name, 12, (a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12))

/* STAP_PROBEV(provider, name, args...) with 0 to 12 arguments; like systemtap's, only when
   SDT_USE_VARIADIC is defined (it needs variadic macros and the GNU ", ##__VA_ARGS__"). */
#ifdef SDT_USE_VARIADIC
# define _USDT_COUNT(...) _USDT_COUNT_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
# define _USDT_COUNT_(z, a, b, c, d, e, f, g, h, i, j, k, l, n, ...) n
# define _USDT_PROBE_N(provider, name, n, ...) _USDT_PROBE(provider, name, n, (__VA_ARGS__))
# define _USDT_PROBE_N1(provider, name, n, ...) _USDT_PROBE_N(provider, name, n, __VA_ARGS__)
# define STAP_PROBEV(provider, name, ...) \
  _USDT_PROBE_N1(provider, name, _USDT_COUNT(0, ##__VA_ARGS__), ##__VA_ARGS__)
#endif

/* DTrace's names for the same macros. */
#define DTRACE_PROBE(provider, name) STAP_PROBE(provider, name)
#define DTRACE_PROBE1(provider, name, a1) STAP_PROBE1(provider, name, a1)
#define DTRACE_PROBE2(provider, name, a1, a2) STAP_PROBE2(provider, name, a1, a2)
#define DTRACE_PROBE3(provider, name, a1, a2, a3) STAP_PROBE3(provider, name, a1, a2, a3)
#define DTRACE_PROBE4(provider, name, a1, a2, a3, a4) \
  STAP_PROBE4(provider, name, a1, a2, a3, a4)
#define DTRACE_PROBE5(provider, name, a1, a2, a3, a4, a5) \
  STAP_PROBE5(provider, name, a1, a2, a3, a4, a5)
#define DTRACE_PROBE6(provider, name, a1, a2, a3, a4, a5, a6) \
  STAP_PROBE6(provider, name, a1, a2, a3, a4, a5, a6)
#define DTRACE_PROBE7(provider, name, a1, a2, a3, a4, a5, a6, a7) \
  STAP_PROBE7(provider, name, a1, a2, a3, a4, a5, a6, a7)
#define DTRACE_PROBE8(provider, name, a1, a2, a3, a4, a5, a6, a7, a8) \
  STAP_PROBE8(provider, name, a1, a2, a3, a4, a5, a6, a7, a8)
#define DTRACE_PROBE9(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9) \
  STAP_PROBE9(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9)
#define DTRACE_PROBE10(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10) \
  STAP_PROBE10(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
#define DTRACE_PROBE11(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11) \
  STAP_PROBE11(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11)
#define DTRACE_PROBE12(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12) \
  STAP_PROBE12(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12)

#endif /* _SYS_SDT_H */
