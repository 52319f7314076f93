#!/usr/bin/env python3
"""benchmarks/rounds.py: every round runs every variant in turn; a row is
matched across rounds by its variant, text fields and --keys, and written as
the median of each figure with its min and max; failures are one line.
With METRICS_BENCH, metrics_bench's --json rows go through it too.

Usage: rounds_test.py SOURCE_DIR [METRICS_BENCH]
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SOURCE_DIR = ""
METRICS_BENCH = ""

# A benchmark stand-in: appends its --x to calls.txt and prints, for the
# n-th call, rows whose figure is 10 * n + x (and a line that is not JSON).
FAKE = textwrap.dedent("""\
    import json, os, sys
    x = int(sys.argv[1].split("=")[1]) if len(sys.argv) > 1 else 0
    with open("calls.txt", "a") as f:
        f.write(f"{x}\\n")
    with open("calls.txt") as f:
        n = len(f.read().split())
    print("a table line for people")
    print(json.dumps({"name": "row", "workers": 2, "value": 10 * n + x,
                      "iperf": None if n == 1 else 1.5}))
    print(json.dumps({"name": "other", "workers": 2, "value": n}))
""")


class RoundsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="rounds_test.")
        self.fake = os.path.join(self.dir.name, "fake.py")
        with open(self.fake, "w") as f:
            f.write(FAKE)

    def tearDown(self):
        self.dir.cleanup()

    def rounds(self, *args, program=None):
        command = [sys.executable, os.path.join(SOURCE_DIR, "benchmarks", "rounds.py"),
                   *args, "--", *(program or [sys.executable, self.fake])]
        return subprocess.run(command, cwd=self.dir.name, capture_output=True, text=True)

    def test_alternates_variants_and_writes_medians(self):
        out = self.rounds("--benchmark=fake", "--rounds=3", "--vary=x=1,2", "--keys=workers",
                          "--json=rows.json")
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(os.path.join(self.dir.name, "calls.txt")) as f:
            self.assertEqual(f.read().split(), ["1", "2", "1", "2", "1", "2"])
        with open(os.path.join(self.dir.name, "rows.json")) as f:
            rows = [json.loads(line) for line in f]
        self.assertEqual([(r["name"], r["x"]) for r in rows],
                         [("row", "1"), ("other", "1"), ("row", "2"), ("other", "2")])
        first = rows[0]
        self.assertEqual(first["benchmark"], "fake")
        self.assertTrue(first["program"].endswith("fake.py --x=1"))
        self.assertIn("--vary=x=1,2", first["command"])
        self.assertEqual(first["workers"], 2)  # a key: named, not a median
        self.assertEqual(first["runs"], 3)
        # Calls 1, 3 and 5 were x=1.
        self.assertEqual((first["value"], first["value_min"], first["value_max"]), (31, 11, 51))
        # A null figure is left out of its median.
        self.assertEqual((first["iperf"], first["iperf_min"]), (1.5, 1.5))
        self.assertEqual((rows[2]["value"], rows[2]["value_min"], rows[2]["value_max"]),
                         (42, 22, 62))

    def test_prints_rows_without_json(self):
        out = self.rounds("--benchmark=fake", "--rounds=1", "--keys=workers")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([json.loads(line)["name"] for line in out.stdout.splitlines()],
                         ["row", "other"])

    def test_failures_are_one_line(self):
        cases = [
            # (arguments, program, exit code, message)
            (["--vary=x"], None, 2, "--vary=x: use FLAG=A,B,..."),
            (["--rounds=0"], None, 2, "--rounds=0: at least 1"),
            ([], ["./no_such_benchmark"], 2, "not found; build first"),
            ([], [sys.executable, "-c", "import sys; sys.exit(3)"], 1, "exited 3"),
            ([], [sys.executable, "-c", "print('no json')"], 1, "printed no JSON rows"),
            ([], [sys.executable, "-c", "print('{\"runs\": 5}')"], 1, "which this driver writes"),
        ]
        for args, program, code, message in cases:
            with self.subTest(args=args, program=program):
                out = self.rounds("--benchmark=fake", *args, program=program)
                self.assertEqual(out.returncode, code, out.stderr)
                self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
                self.assertIn(message, out.stderr)

    def test_metrics_bench_rows(self):
        if not METRICS_BENCH:
            self.skipTest("no metrics_bench given")
        out = self.rounds("--benchmark=metrics_bench", "--rounds=2", "--keys=threads",
                          "--vary=registry=prometheus-cpp,lock-free",
                          program=[METRICS_BENCH, "--json", "--ops=1000", "--runs=1"])
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        operations = [("Histogram::Observe (17 buckets)", 1), ("Counter::Increment", 1),
                      ("Histogram::Observe (17 buckets)", 2), ("Counter::Increment", 2),
                      ("one worker step's recording (4 shards)", 1),
                      ("scrape (12 histograms x 4 shards)", 1)]
        # Each registry's rows, alternated round by round.
        self.assertEqual([(r["registry"], r["operation"], r["threads"]) for r in rows],
                         [(registry, *operation) for registry in ("prometheus-cpp", "lock-free")
                          for operation in operations])
        for r in rows:
            figure = "us_per_op" if r["operation"].startswith("scrape") else "ns_per_op"
            self.assertEqual(r["runs"], 2)
            self.assertLessEqual(r[figure + "_min"], r[figure])
            self.assertLessEqual(r[figure], r[figure + "_max"])


if __name__ == "__main__":
    SOURCE_DIR = sys.argv[1]
    METRICS_BENCH = sys.argv[2] if len(sys.argv) > 2 else ""
    unittest.main(argv=sys.argv[:1], verbosity=2)
