# The README's two commands: `make demo` and `make test`. Each bootstraps .venv by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests use as tools (readelf/gdb/tplist/bpftrace as independent readers
# and tracers, systemtap's sys/sdt.h and dtrace to build fixtures, clang for header tests;
# cmake, meson and ninja build the examples/ projects of the build-integration tests;
# chromium opens the HTML reports headless in tests/test_report_html*.py; ruby runs a
# rewritten libruby; elfutils' eu-strip and linux-perf's perf read rewritten files; the JRE
# and libpython3.11 are real binaries the tests copy and rewrite; rustc builds the Rust program
# whose fork routes tests/test_fork_routes.py traces, musl-tools' musl-gcc the musl ones;
# csmith and libcsmith-dev (its csmith.h) write the random programs of tools/fuzz_programs.py
# and cvise reduces a program that shows a difference to a small reproducer).
# Installed with apt-get when missing, and only when that upgrades no installed package.
DEB_PACKAGES := binutils gcc g++ make systemtap-sdt-dev gdb bpfcc-tools bpftrace clang \
	cmake meson ninja-build chromium ruby elfutils linux-perf openjdk-17-jre-headless \
	libpython3.11 rustc musl-tools csmith libcsmith-dev cvise
# PostgreSQL 15: tests/test_rewrite_real_debs.py rewrites its postgres and runs a cluster of its
# own with it (as the postgres user the package creates). Its service is never started: the
# install runs under a policy-rc.d that forbids every start (removed after, if we made it).
DEB_PACKAGES += postgresql-15
# Distribution builds (tests/test_distro_*.py, docs/distributions.md): debhelper (with
# dpkg-dev's dpkg-buildpackage) builds a source package with dh_usdtpatch; rpm's rpmbuild a
# spec with usdtpatch's macros, rpm2cpio and cpio unpack the .rpm (rpm's find-debuginfo needs
# cpio too).
DEB_PACKAGES += debhelper rpm cpio
# Guest kernels (tests/test_live_guest_*.py, docs/kernel.md "Kernels you can test on"):
# qemu-system-x86 runs the guests (under TCG: nested KVM fails here) that virtme-ng (PyPI, the
# test extra) boots; kmod's depmod indexes the modules of a kernel unpacked under build/cache
# (`depmod -b`), so that the guest can load its 9p and virtio modules; busybox-static makes
# the guest's initramfs (virtme-run wants a static one: the PyPI wheel ships no virtme-ng-init).
DEB_PACKAGES += qemu-system-x86 kmod busybox-static
# Installed without their recommended packages: chromium's would upgrade systemd and perl
# (its simulated install then refused it and the 55 browser tests skipped); postgresql-15's
# (sysstat) are not needed. Without them neither upgrades an installed package. debhelper,
# rpm and cpio recommend nothing in bookworm (only suggest): listed so that a later version's
# recommends cannot pull in more than the distribution-build tests use.
# qemu-system-x86's recommends (a GUI, ovmf, block drivers) pull in about 90 packages (a
# whole video stack) the guests never use; kmod's are none.
DEB_NO_RECOMMENDS := chromium postgresql-15 debhelper rpm cpio qemu-system-x86 kmod
# Debian packages the tests read as data, PACKAGE:THE-INSTALLED-PACKAGE-IT-BELONGS-TO. They are
# never installed: installing them pins their companion to the same version, so apt would
# upgrade it (libpython3.11-testsuite upgraded python3.11 itself; openjdk-17-jdk-headless
# would upgrade openjdk-17-jre-headless, whose libjvm.so the tests rewrite). Instead
# `apt-get download` and `dpkg -x` unpack them into $(DEB_CACHE)/PACKAGE/root (git-ignored),
# with the version in $(DEB_CACHE)/PACKAGE/version. The version is the companion's installed
# one when the archive still has it, else the archive's candidate (a security update may have
# replaced it: the CPython test files can then be a Debian patch newer than the interpreter,
# and tests/test_rewrite_real.py compares the original and the rewritten interpreter test by
# test rather than expecting every test to pass). A package already installed is used as it is.
#   libpython3.11-testsuite: CPython's own tests, run by the rewritten python3.11
#   openjdk-17-jdk-headless: javac, run on the rewritten libjvm.so
#   libvirt0, php8.2-cli: files that carry probes, rewritten by tests/test_rewrite_real_debs.py
#   (no companion of theirs is installed: libc6 stands in, so the archive's candidate is used)
DEB_DATA := libpython3.11-testsuite:python3.11 openjdk-17-jdk-headless:openjdk-17-jre-headless \
	libvirt0:libc6 php8.2-cli:libc6
DEB_CACHE := build/cache

.PHONY: demo wheel test lint typecheck unit system-packages test-data fixtures bench bench-tracing fuzz \
	fuzz-programs fuzz-programs-summary clean

# The development install links the source tree by a plain path in a .pth file (setuptools'
# "compat" editable mode), as an installed package is found: the default editable mode adds an
# import hook that imports pathlib, re and urllib at every interpreter start (~8 ms, 4x
# readelf's whole run; docs/performance.md), which `list` and `check` would be timed with.
PIP_EDITABLE := -q --disable-pip-version-check --config-settings editable_mode=compat -e
# Debian's python3 makes a venv only with python3-venv: installed here when missing (as root).
$(BIN)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV) 2>/dev/null || { rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing python3-venv"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade python3-venv >/dev/null; \
	  fi; $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install $(PIP_EDITABLE) .
	touch $@

# What examples/README.md builds the examples with, from a checkout: the venv (usdtpatch on
# PATH once it is activated) and usdtpatch's wheel, for pip's isolated builds (--find-links).
wheel: $(BIN)/.runtime
	$(BIN)/python -m pip wheel -q --disable-pip-version-check --no-deps -w build/wheels .

$(BIN)/.test: pyproject.toml $(BIN)/.runtime
	$(BIN)/python -m pip install $(PIP_EDITABLE) '.[test]'
	touch $@

# The main job on the bundled fixture (list, check, rewrite, plan + verify, restore), then the
# rewritten copy run beside the original, then the zero-cost path: the same kind of program
# built with usdtpatch's own sys/sdt.h.
demo: $(BIN)/.runtime
	$(BIN)/usdtpatch demo fixtures/bin/demo --out build/demo
	@echo "--- the original and the rewritten copy print the same:"
	fixtures/bin/demo
	build/demo/demo.rewritten
	@echo "--- built with sdt_headers/sys/sdt.h: 5-byte sites at build time, but for fix:longdouble"
	@echo "    (its long double fits no register: systemtap's 1-byte nop, 1 after rewrite):"
	mkdir -p build/demo
	gcc -O2 -Isdt_headers -o build/demo/sdt-usdt tests/data/sdt/probes.c tests/data/sdt/sema.c
	$(BIN)/usdtpatch check --summary --fail-on never build/demo/sdt-usdt
	gcc -O2 -Isdt_headers -DUSDTPATCH_REDZONE_GUARD -o build/demo/sdt-guard tests/data/sdt/probes.c tests/data/sdt/sema.c
	$(BIN)/usdtpatch check --summary build/demo/sdt-guard

# Installs the tool packages above when they are missing and we are root with apt-get (CI and
# the project's machines), one at a time and only a package whose installation upgrades no
# installed package (checked with a simulated install first); elsewhere, or when a package
# would upgrade something, the tests that need it skip with the reason.
# No service is started by an installation: a policy-rc.d that forbids every start is put in
# place for the loop when the machine has none, and removed after it.
system-packages:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "note: missing Debian packages:$$missing (tests that need them will skip)"; exit 0; fi; \
	apt-get update -qq || true; \
	rcd=/usr/sbin/policy-rc.d; if [ ! -e $$rcd ]; then \
	  printf '#!/bin/sh\nexit 101\n' > $$rcd && chmod 755 $$rcd && trap 'rm -f '$$rcd EXIT; fi; \
	for p in $$missing; do \
	  opts="--no-upgrade"; case " $(DEB_NO_RECOMMENDS) " in *" $$p "*) opts="$$opts --no-install-recommends";; esac; \
	  sim=$$(apt-get install -s $$opts $$p 2>&1) || { echo "warning: cannot install $$p; tests that need it will skip"; continue; }; \
	  upg=$$(printf '%s\n' "$$sim" | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' | tr '\n' ' '); \
	  if [ -n "$$upg" ]; then echo "warning: not installing $$p: it would upgrade $$upg; tests that need it will skip"; continue; fi; \
	  echo "installing Debian package $$p"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$opts $$p >/dev/null \
	    || echo "warning: could not install $$p; tests that need it will skip"; \
	done

# Fetches the data packages above into $(DEB_CACHE) (no root needed, nothing installed).
test-data:
	@mkdir -p $(DEB_CACHE); \
	for spec in $(DEB_DATA); do pkg=$${spec%%:*}; companion=$${spec#*:}; \
	  if dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q 'install ok installed'; then continue; fi; \
	  have=$$(dpkg-query -W -f='$${Version}' $$companion 2>/dev/null) || { echo "note: $$companion is not installed: no $$pkg"; continue; }; \
	  dir=$(DEB_CACHE)/$$pkg; \
	  if [ -f $$dir/version ] && [ -d $$dir/root ] && [ "$$(cat $$dir/version)" = "$$have" ]; then continue; fi; \
	  if ! command -v apt-get >/dev/null; then echo "note: no apt-get: no $$pkg (tests that need it will skip)"; continue; fi; \
	  if ! apt-cache madison $$pkg 2>/dev/null | grep -q .; then apt-get update -qq 2>/dev/null || true; fi; \
	  if apt-cache madison $$pkg 2>/dev/null | awk -F'|' '{gsub(/ /, "", $$2); print $$2}' | grep -qxF "$$have"; then \
	    want=$$have; \
	  else \
	    want=$$(apt-cache policy $$pkg 2>/dev/null | sed -n 's/^ *Candidate: //p'); \
	    case "$$want" in ""|"(none)") echo "note: the archive has no $$pkg (tests that need it will skip)"; continue;; esac; \
	  fi; \
	  if [ -f $$dir/version ] && [ -d $$dir/root ] && [ "$$(cat $$dir/version)" = "$$want" ]; then continue; fi; \
	  echo "fetching $$pkg=$$want (installed $$companion: $$have) into $$dir"; \
	  rm -rf $$dir.new && mkdir -p $$dir.new && \
	  (cd $$dir.new && apt-get download -qq -o APT::Sandbox::User=root "$$pkg=$$want" >/dev/null) && \
	  dpkg -x $$dir.new/*.deb $$dir.new/root && echo "$$want" > $$dir.new/version && rm -f $$dir.new/*.deb && \
	  rm -rf $$dir && mv $$dir.new $$dir \
	    || { rm -rf $$dir.new; echo "warning: could not fetch $$pkg; tests that need it will skip"; }; \
	done

lint: $(BIN)/.test
	$(BIN)/ruff check usdtpatch tests bench tools

typecheck: $(BIN)/.test
	$(BIN)/mypy

# Both CPUs (pytest-xdist): each test module is one unit of work, and the tests that use the
# kernel's uprobes run one at a time, under one lock (tests/conftest.py says why); the guest
# kernels' tests (tests/test_live_guest_*.py) boot one guest at a time, under a lock of their
# own (tests/guests.py says why), each session 1-3 minutes of one core.
PYTEST_PARALLEL ?= -n auto --dist loadscope
# The tests start the CLI as a process a few thousand times: its modules compiled once here
# (compileall writes bytecode even where PYTHONDONTWRITEBYTECODE is set, as on this project's
# machines) save each start about 0.3 s of compiling (0.70 -> 0.40 s for a fixture's check).
unit: $(BIN)/.test
	$(BIN)/python -m compileall -q usdtpatch tools bench
	$(BIN)/pytest -q $(PYTEST_PARALLEL)

# Guest kernels (tests/test_live_guest_*.py, docs/kernel.md "Kernels you can test on"): one
# kernel of each generation the guest tests boot, the newest its Debian suite carries (Debian
# 12's own 6.1, sid's 7.2.13, experimental's 7.3), fetched with a private apt configuration
# under $(DEB_CACHE)/apt-kernels (the machine's archive URIs and keyrings, its own lists and
# package cache: the .debs stay there) and unpacked into $(GUEST_KERNELS)/KEY with its modules
# indexed (tools/fetch_kernels.py). A kernel already there at the archive's version is kept.
# Nothing is installed. A kernel that cannot be had leaves its reason in
# $(GUEST_KERNELS)/KEY.error, and the tests of that guest fail with it.
GUEST_KERNELS := $(DEB_CACHE)/kernels
.PHONY: guest-kernels
guest-kernels: $(BIN)/.runtime
	@nice $(BIN)/python -m tools.fetch_kernels $(GUEST_KERNELS) --cache $(DEB_CACHE) || true

test: system-packages test-data guest-kernels lint typecheck unit

# --- sys/sdt.h (issue 21): bpftrace's own USDT runtime tests (tests/test_bpftrace_usdt.py) --
# Debian's bpftrace source package at the installed bpftrace's version, unpacked into
# $(BPFTRACE_SRC) (tests/runtime/usdt, tests/testprogs, tests/testlibs) with a private apt
# configuration: a deb-src entry for the archive the installed version comes from, and apt's
# own state, lists and cache under $(DEB_CACHE)/apt-src (tools/fetch_source.py). Nothing is
# installed and the system's apt configuration is not changed. bpftrace is Apache-2.0: its
# tests are fetched at test time and built from there, never copied into this repository.
# Without network to the archive the tests skip with the reason ($(BPFTRACE_SRC).error).
BPFTRACE_SRC := $(DEB_CACHE)/bpftrace-src
.PHONY: bpftrace-src
bpftrace-src: $(BIN)/.runtime
	@$(BIN)/python -m tools.fetch_source bpftrace $(BPFTRACE_SRC) --cache $(DEB_CACHE) || true
unit: bpftrace-src
# The header's red-zone guard, untraced cost per probe pass (docs/performance.md).
.PHONY: bench-sdt-guard
bench-sdt-guard: $(BIN)/.test
	$(BIN)/python -m bench.bench_sdt_guard
bench: bench-sdt-guard
# --- end of sys/sdt.h's block ------------------------------------------------------------

fixtures:
	$(MAKE) -C fixtures

# Benchmarks print medians and ratios against a reference measured in the same run
# (docs/performance.md); they are not part of `make test`.
bench: $(BIN)/.test
	$(BIN)/python -m bench.bench_list
	$(BIN)/python -m bench.bench_check
	$(BIN)/python -m bench.bench_verify
	$(BIN)/python -m bench.bench_rewrite
	$(BIN)/python -m bench.bench_fork
	$(BIN)/python -m bench.bench_cfarows

# Tracing speed on this machine (root; docs/performance.md "Tracing speed"): the trigger
# program in every site form and OpenJDK 17 original vs rewritten, with a chart.
bench-tracing: $(BIN)/.test
	$(BIN)/python -m pip install $(PIP_EDITABLE) '.[chart]'
	mkdir -p build
	$(BIN)/python -m usdtpatch bench --chart build/bench-tracing.png

# The mutation corpus at length (tools/fuzz.py; `make test` runs 400 mutants of it): every
# command on every mutant, counts per command and exit status, every problem with the mutant's
# id; the mutants with problems are kept in build/fuzz. FUZZ_COUNT=N, FUZZ_SEED=S to vary;
# FUZZ_FLAGS=--markdown prints the summary docs/reliability.md shows.
FUZZ_COUNT ?= 2000
FUZZ_SEED ?= 20261130
FUZZ_FLAGS ?=
fuzz: $(BIN)/.test
	nice $(BIN)/python -m tools.fuzz --count $(FUZZ_COUNT) --seed $(FUZZ_SEED) --keep build/fuzz \
	  $(FUZZ_FLAGS)

# Differential fuzzing of whole programs (tools/fuzz_programs.py; `make test` runs 8 fixed
# pairs of it): csmith's programs and the templates of tests/data/fuzz_programs with probes,
# built a random way each, rewritten, run (and a seeded fraction traced) beside the original.
# COUNT=N pairs or SECONDS=T, SEED=S; the pairs add up in build/fuzz-programs/results.jsonl
# (a run goes on after the seed's last pair there) and `make fuzz-programs-summary` prints
# their totals. Differences are kept in build/fuzz-programs/work and reduced by cvise
# (REDUCE=seconds each, 0 for none). At nice 10: the campaign is meant to run beside work.
COUNT ?=
SECONDS ?=
SEED ?= 1
REDUCE ?= 900
fuzz-programs: system-packages $(BIN)/.test
	nice -n 10 $(BIN)/python -m tools.fuzz_programs --seed $(SEED) --reduce $(REDUCE) \
	  $(if $(SECONDS),--seconds $(SECONDS),--count $(or $(COUNT),50))
fuzz-programs-summary: $(BIN)/.test
	$(BIN)/python -m tools.fuzz_programs --summary

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
