# Shared by the CLI test scripts (sourced): a scratch folder $work removed at exit, the
# pass/fail counters, check, has, and finish. Each script defines its own run().
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

check() {  # check NAME CONDITION-COMMAND...: counts a pass or prints the failure
  local name="$1"; shift
  if "$@"; then passed=$((passed + 1)); return; fi
  failed=$((failed + 1))
  echo "FAILED: $name" >&2
  # The last command's stderr (each script's run() writes $work/err): why a run exited non-zero.
  if [ -s "$work/err" ]; then echo "  stderr of the last run:" >&2; tail -15 "$work/err" >&2; fi
}
# has FILE TEXT: FILE contains TEXT; otherwise shows FILE's start (check adds $work/err).
has() {
  grep -q -- "$2" "$1" && return 0
  echo "  '$1' lacks '$2':" >&2
  head -5 "$1" >&2
  return 1
}
finish() {  # finish NAME: prints the counts; the exit status is 0 only when nothing failed
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
