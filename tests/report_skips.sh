#!/usr/bin/env bash
# report_skips.sh — after ctest (`make test`, `make test-demos`): which tests were skipped and
# why, read from ctest's JUnit file (ctest --output-junit). A test that cannot run what it is
# for exits 77 (ctest: "Not Run"/"Skipped") after printing "NAME: skipped: WHY"; a test that
# ran in part prints the same line for the part it skipped and passes. ctest's own list names
# the skipped tests without the reason; this adds the reasons, in a form that cannot be read
# as a failure. Usage: bash tests/report_skips.sh BUILD/Testing/junit.xml
set -u
J=${1:?usage: report_skips.sh JUNIT.xml}
[ -f "$J" ] || exit 0
awk '
  function unxml(s) { gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s);
                      gsub(/&apos;/, "\047", s); gsub(/&amp;/, "\\&", s); return s }
  /<testcase / {
    name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name)
    notrun = ($0 ~ /status="notrun"/); out = 0; why = ""
  }
  /<system-out>/ { out = 1 }
  out && /: skipped: / { w = $0; sub(/.*: skipped: /, "", w); why = why (why ? "; " : "") unxml(w) }
  /<\/system-out>/ { out = 0 }
  /<\/testcase>/ {
    if (notrun) full[++nf] = sprintf("  %-28s %s", name, why ? why : "(exit 77, no reason printed)")
    else if (why) part[++np] = sprintf("  %-28s %s", name, why)
  }
  END {
    if (nf) { print "\nskipped (exit 77; ctest lists them as Not Run):"; for (i = 1; i <= nf; i++) print full[i] }
    if (np) { print "ran in part (passed; these parts skipped):"; for (i = 1; i <= np; i++) print part[i] }
    if (!nf && !np) print "\nno test skipped"
  }' "$J"
