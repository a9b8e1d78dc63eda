"""Counts for torch's test_run.py runs (JUnit XML), split by what each test exercises.

usage: summarize.py TEST_FILE LABEL=JUNIT.xml [LABEL=JUNIT.xml ...]

Each test method of TEST_FILE is classified from its source (following self._helper calls):
  launcher  calls launch.main / launch.run: a job through the launcher (unidist's when redirected)
  internal  calls only other launch.<name> (parse_min_max_nnodes, ...): torchrun internals,
            "no counterpart (internal API)"; they always run torch's code
  none      never touches `launch` (e.g. runs a script without any launcher)
Prints, per run, passed/failed/skipped/errors of the launcher tests and of the others apart,
each failing test with a one-line reason, then how often each test failed over the runs.
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

LAUNCH_CALLS = {"main", "run"}


def classify(test_file: str) -> dict[str, str]:
    tree = ast.parse(open(test_file).read())
    kinds: dict[str, str] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        uses: dict[str, set[str]] = {}
        calls: dict[str, set[str]] = {}
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            uses[fn.name], calls[fn.name] = set(), set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    if node.value.id == "launch":
                        uses[fn.name].add(node.attr)
                    elif node.value.id == "self":
                        calls[fn.name].add(node.attr)

        def reach(name: str, seen: set[str]) -> set[str]:
            found = set(uses.get(name, ()))
            for callee in calls.get(name, ()):
                if callee in uses and callee not in seen:
                    found |= reach(callee, seen | {callee})
            return found

        for name in uses:
            if not name.startswith("test"):
                continue
            used = reach(name, {name})
            kind = "launcher" if used & LAUNCH_CALLS else ("internal" if used else "none")
            kinds[name] = kind
    return kinds


def reason(case: ET.Element, bad: ET.Element) -> str:
    msg = (bad.get("message") or "").strip()
    if not msg:
        body = (bad.text or "").strip().splitlines()
        msg = body[-1] if body else "?"
    line = msg.splitlines()[0]
    err = case.findtext("system-err") or ""
    hint = next(
        (
            ln.strip()
            for ln in err.splitlines()
            if re.search(r"unidist launch.*(error|failed|did not)|is torchrun's", ln)
        ),
        "",
    )
    text = line[:220]
    if hint and hint[:80] not in text:
        text += " | stderr: " + hint[:220]
    return text


def main(argv: list[str]) -> int:
    test_file, runs = argv[0], [a.split("=", 1) for a in argv[1:]]
    kinds = classify(test_file)
    groups = {k: sorted(t for t, v in kinds.items() if v == k) for k in ("internal", "none")}
    print(f"classified from {test_file}:")
    print(f"  launcher tests: {sum(v == 'launcher' for v in kinds.values())}")
    print(f"  internal API (no counterpart, torch's code): {', '.join(groups['internal']) or '-'}")
    print(f"  no launcher at all: {', '.join(groups['none']) or '-'}")
    failed_in: dict[str, list[str]] = defaultdict(list)
    reasons: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for label, path in runs:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            print(f"\n{label}: no JUnit result ({exc})")
            continue
        counts = {k: Counter() for k in ("launcher", "other")}
        bad_lines = []
        for case in root.iter("testcase"):
            name = case.get("name", "?")
            group = "launcher" if kinds.get(name) == "launcher" else "other"
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is not None:
                state = "failed" if bad.tag == "failure" else "errors"
                why = reason(case, bad)
                bad_lines.append(
                    f"    {state[:-1] if state == 'errors' else 'FAIL'} {name} "
                    f"[{kinds.get(name, '?')}]: {why}"
                )
                failed_in[name].append(label)
                short = why.split(" | stderr: ")
                reasons[name].append((label, (short[1] if len(short) > 1 else short[0])[:160]))
            elif case.find("skipped") is not None:
                state = "skipped"
            else:
                state = "passed"
            counts[group][state] += 1
        fmt = lambda c: " ".join(
            f"{k}={c.get(k, 0)}" for k in ("passed", "failed", "skipped", "errors")
        )  # noqa: E731
        print(
            f"\n{label}: launcher tests: {fmt(counts['launcher'])} | "
            f"internal/no-launcher tests: {fmt(counts['other'])}"
        )
        print("\n".join(bad_lines) if bad_lines else "    (no failures)")
    if failed_in:
        print("\nfailures per test (baseline runs and unidist runs counted apart):")
        for name in sorted(failed_in):
            for side in ("baseline", "unidist"):
                labels = [label for label, _ in runs if label.startswith(side)]
                hits = [label for label in failed_in[name] if label.startswith(side)]
                if not hits:
                    continue
                top = Counter(
                    why for label, why in reasons[name] if label.startswith(side)
                ).most_common(1)[0][0]
                print(
                    f"  {name} [{kinds.get(name, '?')}] {side}: failed {len(hits)}/{len(labels)}"
                    f" -- {top}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
