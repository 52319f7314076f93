#!/usr/bin/env python3
"""Every repository path named in the docs and in code comments exists.

A path is a word that starts with one of the repository's top-level folders
(ps_server/..., docs/..., .ci/run) in README.md, CHANGELOG.md, docs/*.md, or
a comment of a C++, CUDA, proto, CMake, Python or shell file. A path may hold
a glob (`tests/e2e/*`) or an upper-case placeholder (`docs/bench/KIND.json`),
or name a folder; what a command writes (`--json=PATH`, `> PATH`) need not
exist yet.

Usage: docs_paths_test.py [REPO_ROOT]   (default: this file's repository)
"""
import glob
import os
import re
import subprocess
import sys

COMMENT_OF = {
    ".h": ("//",), ".cc": ("//",), ".cu": ("//",), ".cuh": ("//",), ".proto": ("//",),
    ".py": ("#",), ".sh": ("#",), ".txt": ("#",), ".cmake": ("#",), ".yaml": ("#",),
    ".yml": ("#",), ".textproto": ("#",), "": ("#",),
}


def tracked_files(root):
    """The repository's files: git's list, or the tree less build outputs."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                             check=True)
        return [line for line in out.stdout.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != ".git" and not d.startswith("build")]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
        return files


def path_pattern(root, files):
    tops = sorted({f.split("/", 1)[0] for f in files if "/" in f})
    alternatives = "|".join(re.escape(t) for t in tops)
    # A path: a top-level folder, then folder or file names; not part of a
    # longer word or of another path (/dev/shm/..., build/bin/...).
    return re.compile(r"(?<![\w./-])((?:" + alternatives + r")/[\w.*/-]*[\w*/])")


def texts(root, files):
    """(file, line number, text) of every doc line and code comment."""
    for name in files:
        path = os.path.join(root, name)
        if name.endswith(".md"):
            if not (name.startswith("docs/") or "/" not in name):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    yield name, number, line
            continue
        base = os.path.basename(name)
        ext = os.path.splitext(base)[1]
        if base == "CMakeLists.txt":
            markers = ("#",)
        elif ext in COMMENT_OF and (ext or name.startswith(".ci/") or name.startswith("scripts/")):
            markers = COMMENT_OF[ext]
        else:
            continue
        if name.startswith("fuzz/corpus/"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                for marker in markers:
                    at = line.find(marker)
                    if at >= 0:
                        yield name, number, line[at + len(marker):]
                        break


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = tracked_files(root)
    pattern = path_pattern(root, files)
    missing = []
    for name, number, text in texts(root, files):
        for match in pattern.finditer(text):
            named = match.group(1).rstrip(".")
            before = text[:match.start(1)]
            if before.endswith(("--json=", "> ")):
                continue  # what a command writes
            # An upper-case part is a placeholder (docs/bench/KIND.json).
            named = re.sub(r"(?<![\w])[A-Z][A-Z_]+(?![\w])", "*", named)
            if "*" in named:
                exists = bool(glob.glob(os.path.join(root, named)))
            else:
                exists = os.path.exists(os.path.join(root, named))
            if not exists:
                missing.append(f"{name}:{number}: names {named}, which does not exist")
    for line in missing:
        print(line)
    if missing:
        print(f"{len(missing)} path(s) named in docs or comments do not exist; fix or remove them")
        return 1
    print("every repository path named in docs and comments exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
