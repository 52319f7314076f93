#!/usr/bin/env python3
"""docs/architecture.md states the tree's facts, checked against it.

- Its table of libraries names every library the CMake files make
  (add_library(pst_...), outside tests/ and fuzz/), each in the folder
  whose CMakeLists.txt makes it, and no other.
- Its row for docs/ names every document in docs/.

Usage: docs_facts_test.py [REPO_ROOT]   (default: this file's repository)
"""
import glob
import os
import re
import sys


def libraries_made(root):
    """{library: folder} of every add_library(pst_...) that is no object library."""
    made = {}
    for path in glob.glob(os.path.join(root, "**", "CMakeLists.txt"), recursive=True):
        folder = os.path.relpath(os.path.dirname(path), root)
        if folder.split(os.sep)[0] in ("tests", "fuzz") or folder.startswith("build"):
            continue
        with open(path, encoding="utf-8") as f:
            for name, kind in re.findall(r"add_library\((pst_\w+)\s+(\w+)", f.read()):
                if kind != "OBJECT":
                    made[name] = folder + "/"
    return made


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    problems = []
    table = dict(re.findall(r"^\| `(pst_\w+)` \| `([\w/]+)` \|", text, re.M))
    made = libraries_made(root)
    for name, folder in sorted(made.items()):
        if name not in table:
            problems.append(f"library {name} ({folder}) is not in the table of libraries")
        elif table[name] != folder:
            problems.append(f"library {name} is made in {folder}, the table says {table[name]}")
    for name in sorted(set(table) - set(made)):
        problems.append(f"the table of libraries names {name}, which no CMakeLists.txt makes")
    docs_row = re.search(r"^\| `docs/` \|(.*)\|$", text, re.M)
    if not docs_row:
        problems.append("the table of folders has no row for docs/")
    else:
        for path in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
            name = os.path.basename(path)
            if name != "architecture.md" and f"`{name}`" not in docs_row.group(1):
                problems.append(f"the row for docs/ does not name {name}")
    for problem in problems:
        print(f"docs/architecture.md: {problem}")
    if problems:
        return 1
    print(f"docs_facts_test: {len(made)} libraries, each in its folder; every document listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
