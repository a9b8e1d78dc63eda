"""Summarise JUnit XML files from one suite run.

Usage: python summarize.py --label LABEL --root SUITE_ROOT [--internal internal.tsv]
                           [--note TEXT] JUNIT...
Prints "LABEL: P passed, F failed, S skipped" and one line per failing test id:
"  FAIL <id> [ranks] [no counterpart (internal): <symbol>] -- <first line of message>".
Counts are per test run: a test run on 2 ranks counts twice. Errors (setup/teardown)
are counted as failed (pytest's own closing line counts a test that passed and then
errored at teardown both as passed and as an error).
"""

import argparse
import os
import re
import xml.etree.ElementTree as ET


def test_id(root, classname, name):
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        rel = "/".join(parts[:k]) + ".py"
        if os.path.exists(os.path.join(root, rel)):
            return rel + "".join("::" + p for p in parts[k:]) + "::" + name
    return classname + "::" + name


def read_internal(path):
    internal = {}
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if "\t" in line:
                    k, v = line.rstrip("\n").split("\t", 1)
                    internal[k] = v
    return internal


def outcome(tc):
    """('failed'|'error'|'skipped'|'passed', message)."""
    for tag, kind in (("failure", "failed"), ("error", "error")):
        el = tc.find(tag)
        if el is not None:
            lines = (el.get("message") or el.text or "").strip().splitlines()
            return kind, (lines[0][:200] if lines else "")
    return ("skipped" if tc.find("skipped") is not None else "passed"), ""


def tally(root, paths):
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    fails = {}  # id -> [ranks, message]
    found = False
    for path in paths:
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            continue
        m = re.search(r"rank(\d+)", os.path.basename(path))
        try:
            tree = ET.parse(path)
        except ET.ParseError:
            continue
        found = True
        for tc in tree.iter("testcase"):
            kind, msg = outcome(tc)
            counts[kind] += 1
            if kind in ("failed", "error"):
                tid = test_id(root, tc.get("classname", ""), tc.get("name", ""))
                fails.setdefault(tid, [[], msg])[0].append(m.group(1) if m else "-")
    return found, counts, fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--internal")
    ap.add_argument("--note", default="")
    ap.add_argument("junit", nargs="*")
    a = ap.parse_args()
    internal = read_internal(a.internal)
    found, c, fails = tally(a.root, a.junit)

    failed = c["failed"] + c["error"]
    line = f"{a.label}: {c['passed']} passed, {failed} failed, {c['skipped']} skipped"
    if c["error"]:
        line += f" ({c['error']} of the failed are setup/teardown errors)"
    if not found:
        line = f"{a.label}: no results (no JUnit file written)"
    print(line + (f" [{a.note}]" if a.note else ""))
    for tid in sorted(fails):
        ranks, msg = fails[tid]
        base = re.sub(r"\[.*\]$", "", tid)
        tag = f" [no counterpart (internal): {internal[base]}]" if base in internal else ""
        if any(r != "-" for r in ranks):
            rk = " [rank " + ",".join(sorted(set(ranks))) + "]"
        else:
            rk = f" [x{len(ranks)}]" if len(ranks) > 1 else ""
        print(f"  FAIL {tid}{rk}{tag} -- {msg}")


if __name__ == "__main__":
    main()
