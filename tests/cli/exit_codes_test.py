#!/usr/bin/python3
"""docs/cli.md's exit-code table, run: every command in a row's examples column must exit
with the row's code (commands run from the source folder, `ballast` being the binary under
test). Codes 1 and 2 must say why in one line on stderr (warnings aside).

Usage: exit_codes_test.py PATH/TO/ballast SOURCE_DIR"""
import os
import re
import shlex
import subprocess
import sys


def table_rows(markdown):
    """(code, [command, ...]) for each row of the '## Exit codes' table."""
    section = markdown.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        rows.append((int(cells[0]), re.findall(r"`([^`]+)`", cells[2])))
    return rows


def main():
    ballast, source_dir = sys.argv[1], sys.argv[2]
    with open(os.path.join(source_dir, "docs", "cli.md"), encoding="utf-8") as f:
        rows = table_rows(f.read())
    codes = [code for code, _ in rows]
    failures = []
    if codes != [0, 1, 2, 3]:
        failures.append(f"the table's codes are {codes}, expected 0, 1, 2, 3 (kExit* in commands.hpp)")
    checked = 0
    for code, commands in rows:
        if not commands:
            failures.append(f"row {code} has no example command")
        for command in commands:
            words = shlex.split(command)
            env = dict(os.environ)
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                name, value = words.pop(0).split("=", 1)
                env[name] = value
            if not words or words[0] != "ballast":
                failures.append(f"row {code}: '{command}' does not run ballast")
                continue
            result = subprocess.run([ballast] + words[1:], cwd=source_dir, env=env,
                                    capture_output=True, text=True, timeout=300)
            checked += 1
            if result.returncode != code:
                failures.append(f"row {code}: '{command}' exited {result.returncode}; "
                                f"stderr: {result.stderr.strip()[:300]}")
                continue
            messages = [line for line in result.stderr.splitlines()
                        if line.strip() and not line.startswith("ballast: warning:")]
            if code == 2 and len(messages) != 1:
                failures.append(f"row 2: '{command}' printed {len(messages)} lines on stderr, "
                                f"expected one: {messages[:3]}")
    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    print(f"exit codes: {checked} commands checked, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
