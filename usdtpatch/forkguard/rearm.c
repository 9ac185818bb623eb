/* usdtpatch fork guard: the code that runs in a forked child and puts back the kernel's
 * int3 state at every site whose optimized `call` points into a page the child does not have.
 *
 * Freestanding x86-64 code: no libc, raw system calls only (async-signal-safe), no data
 * writable or otherwise: the output of the recipe (usdtpatch/forkguard/recipe.py) is one
 * position-independent block of bytes that a rewritten file carries in its new segment and
 * that sys/sdt.h embeds (the rearm part only).  Layout of the block:
 *   offset 0                  usdtpatch_rearm(table, table_end)
 *   [0, rearm_end)            everything usdtpatch_rearm needs (code and its string)
 *   offset register           usdtpatch_register(envp, child, dso_handle)
 *   offset interpose          usdtpatch_interpose(envp, table, table_end, rd_word), then
 *                             usdtpatch_rearm_all(rd_word, self), last: a guard without
 *                             interposition leaves [interpose_at, end) out
 *
 * The site table is an array of 12-byte entries, position independent (no relocation):
 *   int32  rel      site address - address of this entry (0: an empty entry, skipped)
 *   uint8  orig[5]  the site's bytes in the file (bytes 1..4 are the kernel's int3 state's)
 *   uint8  pad[3]
 *
 * Why int3 and not the original NOP: the kernel's own int3 state for a probed nop5 is `cc` +
 * the original bytes 1..4.  The child's text pages are private copies of the parent's, the
 * uprobe is still registered for the file, so the next hit in the child traps, the probe
 * fires for the child, and the kernel optimizes the site again in the child (with a
 * trampoline of its own).  On kernels that copy the trampoline on fork, its page is mapped in
 * the child and nothing is written.
 */

typedef unsigned long u64;
typedef long s64;
typedef int s32;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define SYS_read 0
#define SYS_open 2
#define SYS_close 3
#define SYS_mprotect 10
#define SYS_pwrite64 18
#define SYS_mincore 27
#define O_RDONLY 0
#define O_RDWR 02
#define O_CLOEXEC 02000000
#define PROT_RWX 7
#define PROT_RX 5
#define ENOMEM 12
#define PAGE 4096UL

#define REARM __attribute__((section(".text.usdtpatch_rearm"), used, noinline))
#define REARM_DATA __attribute__((section(".rodata.usdtpatch_rearm")))
#define REGISTER __attribute__((section(".text.usdtpatch_register"), used, noinline))
#define REGISTER_DATA __attribute__((section(".rodata.usdtpatch_register")))
#define INLINE static inline __attribute__((always_inline))

struct site {
  s32 rel;
  u8 orig[5];
  u8 pad[3];
};

INLINE long sys3(long nr, long a, long b, long c) {
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c)
                   : "rcx", "r11", "memory");
  return ret;
}

INLINE long sys4(long nr, long a, long b, long c, long d) {
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
}

static const char mem_path[] REARM_DATA = "/proc/self/mem";

/* Called in the child (an atfork child handler, through a stub that passes the table of one
   object).  Returns the number of sites written back. */
REARM int usdtpatch_rearm(const struct site *s, const struct site *end) {
  long fd = -1;
  int done = 0;
  for (; s < end; s++) {
    if (s->rel == 0)
      continue;
    volatile const u8 *p = (volatile const u8 *)s + s->rel;
    if (p[0] != 0xe8)
      continue;
    s32 rel = (s32)((u32)p[1] | (u32)p[2] << 8 | (u32)p[3] << 16 | (u32)p[4] << 24);
    u64 target = (u64)p + 5 + (u64)(s64)rel;
    u8 vec;
    /* mincore fails with ENOMEM on an unmapped page: the trampoline stayed in the parent */
    if (sys3(SYS_mincore, (long)(target & ~(PAGE - 1)), (long)PAGE, (long)&vec) != -ENOMEM)
      continue;
    u8 want[5];
    want[0] = 0xcc;
    want[1] = s->orig[1];
    want[2] = s->orig[2];
    want[3] = s->orig[3];
    want[4] = s->orig[4];
    if (fd == -1) {
      fd = sys3(SYS_open, (long)mem_path, O_RDWR | O_CLOEXEC, 0);
      if (fd < 0)
        fd = -2;
    }
    if (fd >= 0 && sys4(SYS_pwrite64, fd, (long)want, 5, (long)p) == 5) {
      done++;
      continue;
    }
    /* No /proc: make the page(s) writable for the five stores, then executable again. */
    u64 first = (u64)p & ~(PAGE - 1);
    u64 len = (((u64)p + 5 + PAGE - 1) & ~(PAGE - 1)) - first;
    if (sys3(SYS_mprotect, (long)first, (long)len, PROT_RWX) != 0)
      continue;
    volatile u8 *w = (volatile u8 *)p;
    for (int i = 1; i < 5; i++)
      w[i] = want[i];
    w[0] = 0xcc;
    sys3(SYS_mprotect, (long)first, (long)len, PROT_RX);
    done++;
  }
  if (fd >= 0)
    sys3(SYS_close, fd, 0, 0);
  return done;
}

/* --- registration, for rewritten files (sys/sdt.h calls pthread_atfork instead) ------------ */

#define AT_NULL 0
#define AT_BASE 7
#define PT_DYNAMIC 2
#define DT_NULL 0
#define DT_STRTAB 5
#define DT_SYMTAB 6
#define DT_GNU_HASH 0x6ffffef5L

struct dyn {
  s64 tag;
  u64 val;
};

struct sym {
  u32 st_name;
  u8 st_info;
  u8 st_other;
  u16 st_shndx;
  u64 st_value;
  u64 st_size;
};

/* The public head of glibc's struct link_map and struct r_debug (<link.h>). */
struct link_map {
  u64 l_addr;
  const char *l_name;
  const struct dyn *l_ld;
  const struct link_map *l_next;
  const struct link_map *l_prev;
};

struct r_debug {
  int r_version;
  const struct link_map *r_map;
};

typedef int (*register_atfork_fn)(void (*)(void), void (*)(void), void (*)(void), void *);

static const char r_debug_name[] REGISTER_DATA = "_r_debug";
static const char auxv_path[] REGISTER_DATA = "/proc/self/auxv";
static const char register_atfork_name[] REGISTER_DATA = "__register_atfork";

/* glibc relocates most d_ptr entries of a writable .dynamic in place; a read-only one (the
   vDSO's) keeps link-time values. */
INLINE u64 dyn_ptr(u64 bias, u64 v) { return v < bias ? v + bias : v; }

INLINE int same(const char *a, const char *b) {
  while (*a && *a == *b) {
    a++;
    b++;
  }
  return *a == *b;
}

/* A defined dynamic symbol of one loaded object, by its DT_GNU_HASH table; 0 when absent. */
REGISTER static u64 lookup(u64 bias, const struct dyn *d, const char *name) {
  const u32 *gh = 0;
  const struct sym *symtab = 0;
  const char *strtab = 0;
  if (!d)
    return 0;
  for (; d->tag != DT_NULL; d++) {
    if (d->tag == DT_GNU_HASH)
      gh = (const u32 *)dyn_ptr(bias, d->val);
    else if (d->tag == DT_SYMTAB)
      symtab = (const struct sym *)dyn_ptr(bias, d->val);
    else if (d->tag == DT_STRTAB)
      strtab = (const char *)dyn_ptr(bias, d->val);
  }
  if (!gh || !symtab || !strtab)
    return 0;
  u32 h = 5381;
  for (const char *c = name; *c; c++)
    h = h * 33 + (u8)*c;
  u32 nbuckets = gh[0], symoffset = gh[1], bloom_size = gh[2];
  if (nbuckets == 0)
    return 0;
  const u32 *buckets = gh + 4 + bloom_size * 2; /* 64-bit bloom words */
  const u32 *chain = buckets + nbuckets;
  u32 i = buckets[h % nbuckets];
  if (i < symoffset)
    return 0;
  for (;; i++) {
    u32 ch = chain[i - symoffset];
    const struct sym *s = symtab + i;
    if ((ch | 1) == (h | 1) && s->st_shndx != 0 && same(strtab + s->st_name, name))
      return bias + s->st_value;
    if (ch & 1)
      return 0;
  }
}

/* AT_BASE, the dynamic linker's load address (0: none, a static executable).  From
   /proc/self/auxv; without /proc, from the auxiliary vector that follows the initial
   environment on the stack, but only when `envp` is that initial array (an init function run
   by dlopen gets the current environ, which setenv may have moved to the heap). */
REGISTER static u64 at_base(char **envp) {
  u64 buf[128];
  long fd = sys3(SYS_open, (long)auxv_path, O_RDONLY | O_CLOEXEC, 0);
  if (fd >= 0) {
    long n = 0, r;
    while (n < (long)sizeof buf &&
           (r = sys3(SYS_read, fd, (long)((char *)buf + n), (long)sizeof buf - n)) > 0)
      n += r;
    sys3(SYS_close, fd, 0, 0);
    if (n >= 16) {
      for (long i = 0; i + 1 < n / 8 && buf[i] != AT_NULL; i += 2)
        if (buf[i] == AT_BASE)
          return buf[i + 1];
      return 0;
    }
  }
  char here;
  if (!envp || (u64)envp < (u64)&here || (u64)envp - (u64)&here > (256UL << 20))
    return 0;
  char **e = envp;
  while (*e)
    e++;
  for (const u64 *a = (const u64 *)(e + 1); a[0] != AT_NULL; a += 2)
    if (a[0] == AT_BASE)
      return a[1];
  return 0;
}

/* Called once when the object loads (from its init hook, which passes the envp the dynamic
   linker or libc gives every init function).  Finds __register_atfork (glibc, GLIBC_2.3.2)
   without an import: AT_BASE (the dynamic linker) -> its _r_debug -> the link map, the first
   object that defines it.  Returns __register_atfork's result, or a negative number when it
   was not found (then the object is not guarded). */
REGISTER int usdtpatch_register(char **envp, void (*child)(void), void *dso_handle) {
  u64 base = at_base(envp);
  if (!base)
    return -2; /* no dynamic linker: a static executable */
  const u8 *eh = (const u8 *)base;
  if (eh[0] != 0x7f || eh[1] != 'E' || eh[2] != 'L' || eh[3] != 'F')
    return -3;
  u64 phoff = *(const u64 *)(eh + 32);
  u16 phentsize = *(const u16 *)(eh + 54), phnum = *(const u16 *)(eh + 56);
  const struct dyn *ldyn = 0;
  for (u16 i = 0; i < phnum; i++) {
    const u8 *ph = eh + phoff + (u64)i * phentsize;
    if (*(const u32 *)ph == PT_DYNAMIC)
      ldyn = (const struct dyn *)(base + *(const u64 *)(ph + 16));
  }
  const struct r_debug *rd = (const struct r_debug *)lookup(base, ldyn, r_debug_name);
  if (!rd)
    return -4;
  for (const struct link_map *m = rd->r_map; m; m = m->l_next) {
    u64 fn = lookup(m->l_addr, m->l_ld, register_atfork_name);
    if (fn)
      return ((register_atfork_fn)fn)(0, 0, child, dso_handle);
  }
  return -5;
}

/* --- interposition of the file's own GOT slots of the C library's routes to a child that skip
   the atfork handlers (_Fork, clone, syscall): rewritten dynamically linked executables --- */

#define PROT_RW 3

/* One interposed slot; every field is an address minus the entry's address (no relocation). */
struct ipo {
  s32 got;   /* the GOT slot the dynamic linker filled (JUMP_SLOT / GLOB_DAT) */
  s32 real;  /* an 8-byte word in the guard's block that receives the real function */
  s32 stub;  /* the guard's stub, written into the GOT slot */
  s32 name;  /* the symbol's name */
  s32 prot;  /* the GOT page's protection after the write when /proc is not there */
  s32 flags; /* IPO_RESOLVER: the entry of dlsym, whose real function finds what the link
                map does not give (musl) */
};

#define IPO_RESOLVER 1

typedef void *(*dlsym_fn)(void *, const char *);

/* Writes the word `v` at `at`: through /proc/self/mem (`fd`), else mprotect around a store. */
__attribute__((section(".usdtpatch_interpose"), used, noinline))
static int poke(long fd, u64 at, u64 v, long prot_after) {
  if (fd >= 0 && sys4(SYS_pwrite64, fd, (long)&v, 8, (long)at) == 8)
    return 0;
  u64 first = at & ~(PAGE - 1);
  u64 len = ((at + 8 + PAGE - 1) & ~(PAGE - 1)) - first;
  if (sys3(SYS_mprotect, (long)first, (long)len, prot_after == PROT_RX ? PROT_RWX : PROT_RW))
    return -1;
  *(volatile u64 *)at = v;
  sys3(SYS_mprotect, (long)first, (long)len, prot_after);
  return 0;
}

/* Called once when the executable loads, after its relocations (from its init hook): for
   each entry, the real function is looked up as the dynamic linker would (the first object of
   the link map that defines it; the value in the slot when none does; else what dlsym, when
   its entry came first, returns for the name), stored where the stub reads it, and the stub's
   address written into the slot, so that a call through the PLT, a `call *slot(%rip)` and an
   address read from the slot all go through the stub.  An entry without a slot (got 0) only
   fills the real function's word: its stub is reached through the interposed dlsym, which
   hands it out in place of the real function.  Returns the number of entries done, or a
   negative number. */
__attribute__((section(".usdtpatch_interpose"), used, noinline))
int usdtpatch_interpose(char **envp, const struct ipo *t, const struct ipo *end,
                        u64 *rd_word) {
  const struct link_map *map = 0;
  const struct r_debug *rd = 0;
  dlsym_fn resolver = 0;
  u64 base = at_base(envp);
  if (base) {
    const u8 *eh = (const u8 *)base;
    u64 phoff = *(const u64 *)(eh + 32);
    u16 phentsize = *(const u16 *)(eh + 54), phnum = *(const u16 *)(eh + 56);
    const struct dyn *ldyn = 0;
    for (u16 i = 0; i < phnum; i++) {
      const u8 *ph = eh + phoff + (u64)i * phentsize;
      if (*(const u32 *)ph == PT_DYNAMIC)
        ldyn = (const struct dyn *)(base + *(const u64 *)(ph + 16));
    }
    rd = (const struct r_debug *)lookup(base, ldyn, r_debug_name);
    if (rd)
      map = rd->r_map;
  }
  long fd = sys3(SYS_open, (long)mem_path, O_RDWR | O_CLOEXEC, 0);
  int done = 0;
  if (rd)
    poke(fd, (u64)rd_word, (u64)rd, PROT_RX);
  for (; t < end; t++) {
    u64 got = t->got ? (u64)t + (u64)(s64)t->got : 0;
    u64 stub = (u64)t + (u64)(s64)t->stub;
    const char *name = (const char *)t + t->name;
    u64 real = 0;
    for (const struct link_map *m = map; m && !real; m = m->l_next)
      real = lookup(m->l_addr, m->l_ld, name);
    if (!real && got)
      real = *(volatile const u64 *)got;
    if (!real && resolver)
      real = (u64)resolver(0, name); /* RTLD_DEFAULT */
    if (!real || real == stub)
      continue;
    if (poke(fd, (u64)t + (u64)(s64)t->real, real, PROT_RX) != 0)
      continue;
    if (got && poke(fd, got, stub, t->prot) != 0)
      continue;
    if (t->flags & IPO_RESOLVER)
      resolver = (dlsym_fn)real;
    done++;
  }
  if (fd >= 0)
    sys3(SYS_close, fd, 0, 0);
  return done;
}

/* The mark a rewritten object's guard carries in the 10 bytes before its init stub (the
   function its hooked DT_PREINIT_ARRAY[0], DT_INIT_ARRAY[0] or DT_INIT points at), whose
   child stub is 32 bytes before it: `jmp .+10` (never run) and "USDTguar". */
#define DT_INIT 12
#define DT_INIT_ARRAY 25
#define DT_INIT_ARRAYSZ 27
#define DT_PREINIT_ARRAY 32
#define DT_PREINIT_ARRAYSZ 33
#define GUARD_MARK 0x7261756754445355UL /* "USDTguar" */
#define CHILD_BEFORE_INIT 32

typedef void (*stub_fn)(void);

/* Whether the init function at p is a rewritten object's init stub (its mark before it). */
INLINE int guard_init(u64 p) {
  u8 vec;
  /* the mark's first byte on the page before p's: read it only when that page is mapped */
  if ((p & (PAGE - 1)) < 10 &&
      sys3(SYS_mincore, (long)((p - 10) & ~(PAGE - 1)), (long)PAGE, (long)&vec) == -ENOMEM)
    return 0;
  const volatile u8 *c = (const volatile u8 *)(p - 10);
  return c[0] == 0xeb && c[1] == 0x08 && *(const volatile u64 *)(p - 8) == GUARD_MARK;
}

/* Called in a child that a route skipping the atfork handlers created through this object's
   stub (a fork, _Fork, clone or syscall() of a fork): re-arms the sites of every rewritten
   object the link map lists (each found by its init hook's mark, its child stub called), not
   only this one's; `self` (this object's child stub) is called when the walk did not find
   it (no link map: musl). */
__attribute__((section(".usdtpatch_interpose"), used, noinline))
void usdtpatch_rearm_all(const u64 *rd_word, u64 self) {
  const struct r_debug *rd = (const struct r_debug *)*(volatile const u64 *)rd_word;
  int seen = 0;
  for (const struct link_map *m = rd ? rd->r_map : 0; m; m = m->l_next) {
    u64 pre = 0, presz = 0, arr = 0, arrsz = 0, init = 0;
    for (const struct dyn *d = m->l_ld; d && d->tag != DT_NULL; d++) {
      if (d->tag == DT_PREINIT_ARRAY)
        pre = dyn_ptr(m->l_addr, d->val);
      else if (d->tag == DT_PREINIT_ARRAYSZ)
        presz = d->val;
      else if (d->tag == DT_INIT_ARRAY)
        arr = dyn_ptr(m->l_addr, d->val);
      else if (d->tag == DT_INIT_ARRAYSZ)
        arrsz = d->val;
      else if (d->tag == DT_INIT)
        init = dyn_ptr(m->l_addr, d->val);
    }
    u64 cand[3];
    cand[0] = pre && presz >= 8 ? *(volatile const u64 *)pre : 0;
    cand[1] = arr && arrsz >= 8 ? *(volatile const u64 *)arr : 0;
    cand[2] = init;
    for (int i = 0; i < 3; i++) {
      if (cand[i] && guard_init(cand[i])) {
        u64 child = cand[i] - CHILD_BEFORE_INIT;
        ((stub_fn)child)();
        seen |= child == self;
        break;
      }
    }
  }
  if (!seen)
    ((stub_fn)self)();
}
