"""A Python worker for tests/python/restart_test.py: worker:1 kills itself
with SIGKILL before its step KILL_AT on its first start; restarted by
pslaunch, it rejoins and resumes at the steps the shard counted.

    killed_worker.py STEPS KILL_AT     (run by pslaunch: cluster.worker_command)
"""

import os
import signal
import sys

import numpy as np

import pstrain


def main(steps, kill_at):
    client = pstrain.Client()
    view = client.register()
    client.init({"w": np.zeros(1000, np.float32)})
    first = view["worker_clock"]  # 0 on a first start
    client.pull()
    gradient = {"w": np.ones(1000, np.float32)}
    for step in range(first, steps):
        if client.worker == 1 and first == 0 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        client.push_pull(gradient)
    client.done()
    missing = client.wait_for_workers()["missing_workers"] if client.is_chief else []
    client.report(samples=(steps - first) * 8, missing_workers=missing,
                  final_loss=float(client.pull()["w"][0]))


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), int(sys.argv[2]))
    except pstrain.Error as error:
        print(f"killed_worker.py: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
