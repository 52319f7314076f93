#!/usr/bin/env python3
"""benchmarks/hot_set.py on traces small enough to follow by hand: the
clairvoyant bound (opt) takes out the row read again latest where LRU takes
the oldest, and reads no more rows back than any policy it is run beside.

Usage: hot_set_test.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = sys.argv[1] if len(sys.argv) > 1 else ""
SCRIPT = os.path.join(SOURCE_DIR, "benchmarks", "hot_set.py")
STEP = 512  # examples a step, as hot_set.py groups them


def criteo_line(value):
    # Label, 13 dense features, then 26 categorical fields: the first holds value.
    return "\t".join(["1"] + ["0"] * 13 + [value] + [""] * 25)


def run(steps, policies, fractions):
    """Disk reads per (fraction, policy) for steps, each a list of the values one
    step reads (its lines share them out)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.tsv")
        with open(path, "w") as f:
            for values in steps:
                for i in range(STEP):
                    f.write(criteo_line(values[i * len(values) // STEP]) + "\n")
        out = subprocess.run([sys.executable, SCRIPT, path, ",".join(policies),
                              ",".join(str(x) for x in fractions)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    reads = {}
    for line in out.splitlines():
        m = re.match(r"RAM (\d+)% of rows", line)
        if not m:
            continue
        for policy, count in re.findall(r"(\w+) [0-9.]+% \((\d+) disk reads\)", line):
            reads[(int(m.group(1)), policy)] = int(count)
    return reads


class HotSetTest(unittest.TestCase):
    def test_opt_keeps_the_row_read_again_first(self):
        # RAM for 2 of the 3 rows. At step 2, LRU takes a out (the oldest) and
        # reads it back at step 3, taking b out, which step 4 reads back; opt
        # takes b out (read again after a) and reads only it back.
        reads = run([["a"], ["b"], ["c"], ["a"], ["b"]], ["lru", "opt"], [0.67])
        self.assertEqual(reads[(67, "lru")], 2)
        self.assertEqual(reads[(67, "opt")], 1)

    def test_opt_reads_back_no_more_than_any_policy(self):
        # A cycle over 5 rows with RAM for 3: LRU reads back every row after
        # the first pass; opt keeps two of the cycle's rows through each pass.
        steps = [[f"v{s % 5}"] for s in range(40)]
        policies = ["lru", "sampled_lru", "sampled_lfu", "lfu", "opt"]
        reads = run(steps, policies, [0.6])
        self.assertEqual(reads[(60, "lru")], 35)
        for policy in policies[:-1]:
            self.assertLessEqual(reads[(60, "opt")], reads[(60, policy)], policy)
        self.assertLess(reads[(60, "opt")], reads[(60, "lru")])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
