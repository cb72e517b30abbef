#!/usr/bin/env python3
"""The runtime checks every MPI call: every MPI function called in src/, tools/ and
include/ must be the direct argument of check_mpi(...) (include/ballast/runtime/mpi.hpp),
which names the call and the rank and aborts the job on an error code. The few calls that
must not or cannot be checked are listed in ALLOWED with the reason; an entry that no
longer matches a call is an error too, so the list stays true.

Usage: check_mpi_calls.py SOURCE_DIR   (exit 0: every call checked)
"""
import pathlib
import re
import sys

# (file relative to SOURCE_DIR, MPI function) -> why it is not wrapped in check_mpi.
ALLOWED = {
    ("src/runtime/mpi_check.cpp", "MPI_Error_string"):
        "inside check_mpi itself: its code is compared with MPI_SUCCESS by hand",
    ("src/runtime/mpi_check.cpp", "MPI_Initialized"):
        "inside check_mpi itself, already failing: decides whether MPI_Abort is allowed",
    ("src/runtime/mpi_check.cpp", "MPI_Finalized"):
        "inside check_mpi itself, already failing: decides whether MPI_Abort is allowed",
    ("src/runtime/mpi_check.cpp", "MPI_Comm_rank"):
        "inside check_mpi itself, already failing: only names the rank (-1 if it fails)",
    ("src/runtime/mpi_check.cpp", "MPI_Abort"):
        "the failure path: does not return; if it fails, _Exit follows",
    ("tools/ballast/run_command.cpp", "MPI_Abort"):
        "the failure path (abort_job): does not return; if it fails, _Exit follows",
    ("tools/ballast/calibrate_host_command.cpp", "MPI_Abort"):
        "the failure path: does not return; if it fails, _Exit follows",
}
# Functions without an error code to check, allowed anywhere.
NO_ERROR_CODE = {
    "MPI_Wtime": "returns the time (a double), not an error code",
    "MPI_Wtick": "returns the clock resolution (a double), not an error code",
}

CALL = re.compile(r"\bMPI_[A-Z][a-z][A-Za-z0-9_]*(?=\s*\()")
CHECKED = re.compile(r"check_mpi\s*\(\s*$")


def strip_comments_and_strings(text):
    """The source with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    blank = lambda s: re.sub(r"[^\n]", " ", s)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i)
            delimiter = text[i + 2:open_paren]
            end = text.find(")" + delimiter + '"', open_paren)
            end = n if end < 0 else end + len(delimiter) + 2
        elif text[i] in "\"'":
            quote, end = text[i], i + 1
            while end < n and text[end] != quote:
                end += 2 if text[end] == "\\" else 1
            end = min(n, end + 1)
            if quote == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(text[i])
                i += 1
                continue
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(blank(text[i:end]))
        i = end
    return "".join(out)


def main():
    root = pathlib.Path(sys.argv[1])
    files = sorted(p for folder in ("src", "tools", "include") for p in (root / folder).rglob("*")
                   if p.suffix in (".cpp", ".hpp", ".h", ".cc"))
    unchecked, used_allowances, checked = [], set(), 0
    for path in files:
        relative = path.relative_to(root).as_posix()
        code = strip_comments_and_strings(path.read_text(encoding="utf-8", errors="replace"))
        for match in CALL.finditer(code):
            name = match.group(0)
            line = code.count("\n", 0, match.start()) + 1
            if CHECKED.search(code[max(0, match.start() - 200):match.start()]):
                checked += 1
            elif name in NO_ERROR_CODE:
                pass
            elif (relative, name) in ALLOWED:
                used_allowances.add((relative, name))
            else:
                unchecked.append(f"{relative}:{line}: {name} is not checked: wrap it as check_mpi({name}(...), \"{name}\")")
    stale = [f"ALLOWED lists {name} in {file}, which no longer calls it: remove the entry"
             for (file, name) in sorted(set(ALLOWED) - used_allowances)]
    for problem in unchecked + stale:
        print(problem)
    if checked == 0:
        print(f"no check_mpi(MPI_...) calls found under {root}: is SOURCE_DIR right?")
        return 1
    print(f"MPI calls: {checked} checked, {len(used_allowances)} allowed unchecked "
          f"({len(files)} files); {len(unchecked)} unchecked, {len(stale)} stale allowances")
    return 1 if unchecked or stale or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
