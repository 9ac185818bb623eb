# The README's two commands: `make demo` and `make test`. Each bootstraps .venv by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests use (readelf/gdb/tplist/bpftrace as independent readers and
# tracers, systemtap's sys/sdt.h and dtrace to build fixtures, clang for header tests, CPython's
# test suite and a JDK to run rewritten copies of python3.11 and libjvm.so).
DEB_PACKAGES := binutils gcc g++ make systemtap-sdt-dev gdb bpfcc-tools bpftrace clang \
	libpython3.11-testsuite openjdk-17-jdk-headless

.PHONY: demo test lint typecheck unit system-packages fixtures bench clean

$(BIN)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e .
	touch $@

$(BIN)/.test: pyproject.toml $(BIN)/.runtime
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# The main job on the bundled fixture (list, check, rewrite, plan + verify, restore), then the
# rewritten copy run beside the original, then the zero-cost path: the same kind of program
# built with usdtpatch's own sys/sdt.h.
demo: $(BIN)/.runtime
	$(BIN)/usdtpatch demo fixtures/bin/demo --out build/demo
	@echo "--- the original and the rewritten copy print the same:"
	fixtures/bin/demo
	build/demo/demo.rewritten
	@echo "--- built with sdt_headers/sys/sdt.h: 5-byte sites at build time, nothing to rewrite:"
	mkdir -p build/demo
	gcc -O2 -Isdt_headers -o build/demo/sdt-usdt tests/data/sdt/probes.c tests/data/sdt/sema.c
	$(BIN)/usdtpatch check --summary --fail-on never build/demo/sdt-usdt
	gcc -O2 -Isdt_headers -DUSDTPATCH_REDZONE_GUARD -o build/demo/sdt-guard tests/data/sdt/probes.c tests/data/sdt/sema.c
	$(BIN)/usdtpatch check --summary build/demo/sdt-guard

# Installs the Debian packages above when they are missing and we are root with apt-get
# (CI and the project's machines); elsewhere the tests that need them skip with the reason.
system-packages:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install$$missing; tests that need them will skip"; \
	  else echo "note: missing Debian packages:$$missing (tests that need them will skip)"; fi; \
	fi

lint: $(BIN)/.test
	$(BIN)/ruff check usdtpatch tests bench

typecheck: $(BIN)/.test
	$(BIN)/mypy

unit: $(BIN)/.test
	$(BIN)/pytest -q

test: system-packages lint typecheck unit

fixtures:
	$(MAKE) -C fixtures

# Benchmarks print medians and ratios against a reference measured in the same run
# (docs/performance.md); they are not part of `make test`.
bench: $(BIN)/.test
	$(BIN)/python -m bench.bench_list
	$(BIN)/python -m bench.bench_check
	$(BIN)/python -m bench.bench_verify
	$(BIN)/python -m bench.bench_rewrite

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
