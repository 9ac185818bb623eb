# usdtpatch's GNU make include file (package data of the Python package usdtpatch).
#
#   include $(shell usdtpatch --make-include)
#
#   app: app.o
#   	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
#   	$(call usdtpatch_rewrite,$@)
#
# usdtpatch_rewrite rewrites the just-linked file in place (1-byte probe sites become 5-byte
# NOP sites), checks the result, writes $(USDTPATCH_REPORT_DIR)/<name>.json and .html, and fails
# the recipe when a finding reaches $(USDTPATCH_FAIL_ON); the failed file is removed so that the
# next make runs the step again. usdtpatch_check only checks. Call usdtpatch_rewrite right after
# the link, before any strip, objcopy --only-keep-debug or eu-strip -f (the documented order:
# rewrite, then strip or split debug information; those tools keep the segment a rewrite adds,
# docs/build-integration.md). Each call touches only its own file and report, so make -j is
# safe. A file that is already rewritten is left as
# it is (byte for byte, mtime included).
#
# Settings (override on the command line, in the environment or before the include):

USDTPATCH ?= usdtpatch
USDTPATCH_FORM ?= nop5
USDTPATCH_REDZONE_GUARD ?= auto
USDTPATCH_FORK_GUARD ?= auto
USDTPATCH_FAIL_ON ?= error
USDTPATCH_REPORT_DIR ?= usdtpatch-reports
USDTPATCH_FLAGS ?=

# $(call usdtpatch_rewrite,FILE[,EXTRA FLAGS])
usdtpatch_rewrite = $(USDTPATCH) post-link $(1) --form $(USDTPATCH_FORM) \
	--redzone-guard $(USDTPATCH_REDZONE_GUARD) --fork-guard $(USDTPATCH_FORK_GUARD) \
	--fail-on $(USDTPATCH_FAIL_ON) \
	--report $(USDTPATCH_REPORT_DIR)/$(notdir $(1)).json $(USDTPATCH_FLAGS) $(2)

# $(call usdtpatch_check,FILE[,EXTRA FLAGS])
usdtpatch_check = $(USDTPATCH) post-link --check-only $(1) --fail-on $(USDTPATCH_FAIL_ON) \
	--report $(USDTPATCH_REPORT_DIR)/$(notdir $(1)).json $(USDTPATCH_FLAGS) $(2)

# -I flag for usdtpatch's sys/sdt.h (5-byte NOP sites at build time, nothing to rewrite):
#   CPPFLAGS += $(USDTPATCH_CPPFLAGS)
USDTPATCH_INCLUDE_DIR := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))../include)
USDTPATCH_CPPFLAGS = -I$(USDTPATCH_INCLUDE_DIR)
