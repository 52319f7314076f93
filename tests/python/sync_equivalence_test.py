"""A Python worker and a C++ worker are interchangeable in one SYNC job: two
workers of fixed arithmetic (tests/python/fixed_gradient_worker.cc and its
twin fixed_gradient_worker.py) leave bitwise the same parameters whichever
language each worker is written in, over one shard or two, with the bytes
over TCP or through shared memory."""

import os
import subprocess
import sys
import unittest

from ps_cluster import PsCluster

BIN_DIR = os.environ["PSTRAIN_BIN_DIR"]
CPP_WORKER = os.path.join(os.environ["PSTRAIN_TEST_BIN_DIR"], "fixed_gradient_worker")
PY_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixed_gradient_worker.py")
STEPS = 12


def command(language, config, task, out):
    if language == "c++":
        return [CPP_WORKER, config, task, str(STEPS), out]
    return [sys.executable, PY_WORKER, config, task, str(STEPS), out]


def train(languages, shards, shm):
    """Final parameters of a SYNC job whose worker i is written in languages[i]."""
    with PsCluster(BIN_DIR, workers=len(languages), shards=shards,
                   optimizer="adam { learning_rate: 0.01 }",
                   cluster="" if shm else "shm: SHM_OFF") as cluster:
        out = os.path.join(cluster.dir, "final.txt")
        workers = [subprocess.Popen(command(lang, cluster.config_path, f"worker:{i}", out),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for i, lang in enumerate(languages)]
        for i, worker in enumerate(workers):
            try:
                output, _ = worker.communicate(timeout=120)
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
            if worker.returncode != 0:
                raise AssertionError(f"worker:{i} ({languages[i]}) exited with "
                                     f"{worker.returncode}: {output}")
        stats = cluster.log()
        with open(out) as f:
            return f.read(), stats


class SyncEquivalenceTest(unittest.TestCase):
    def test_a_python_worker_trains_as_a_cpp_worker_does(self):
        for shards, shm in ((1, False), (2, True)):
            with self.subTest(shards=shards, shm=shm):
                reference, _ = train(["c++", "c++"], shards, shm)
                self.assertEqual(len(reference.splitlines()), 3)
                # The job trained: the bias moved from its initial values.
                self.assertNotEqual(reference.splitlines()[1],
                                    "dense/bias -0.3125 -0.25 -0.1875 -0.125")
                for languages in (["c++", "python"], ["python", "c++"], ["python", "python"]):
                    final, log = train(languages, shards, shm)
                    self.assertEqual(final, reference, f"{languages}: {log}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
