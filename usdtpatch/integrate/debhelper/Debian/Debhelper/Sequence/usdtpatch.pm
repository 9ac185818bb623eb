#!/usr/bin/perl
# The dh sequence addon of usdtpatch (`dh $@ --with usdtpatch`, or a Build-Depends on
# dh-sequence-usdtpatch): dh_usdtpatch after the install step, before dh_dwz (compat 12 and
# later run it) and dh_strip, so that the debug information dh_strip takes out is the
# rewritten file's (its build-id names the -dbgsym package's file).

use strict;
use warnings;
use Debian::Debhelper::Dh_Lib qw(compat);

if (compat(11)) {
	insert_before('dh_strip', 'dh_usdtpatch');
} else {
	insert_before('dh_dwz', 'dh_usdtpatch');
}

1;
