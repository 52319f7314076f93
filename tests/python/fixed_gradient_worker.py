"""The Python twin of tests/python/fixed_gradient_worker.cc: the same
variables, initial values and fixed-arithmetic gradient, driven through the
pstrain module, so that either may stand for the other in one SYNC job.

    fixed_gradient_worker.py CONFIG worker:<i> STEPS [OUT]
"""

import sys

import numpy as np

import pstrain

VARIABLES = {"dense/kernel": (300, 4), "dense/bias": (4,), "out/kernel": (4, 3)}


def initial(shape):
    i = np.arange(int(np.prod(shape)))
    return ((i % 11).astype(np.float32) * np.float32(0.0625) - np.float32(0.3125)).reshape(shape)


def target(worker, step, size):
    i = np.arange(size)
    return ((i % 7) * 0.125 + (worker + step % 3)).astype(np.float32)


def main(config, task, steps, out_path=None):
    client = pstrain.Client(config, task)
    client.register()
    client.declare(VARIABLES)
    client.init({name: initial(shape) for name, shape in VARIABLES.items()})
    values = client.pull()
    gradients = client.gradients
    for step in range(steps):
        for name, value in values.items():
            flat = gradients[name].reshape(-1)
            # 0.5 * v is exact; the subtraction rounds once, as in C++.
            np.subtract(np.float32(0.5) * value.reshape(-1), target(client.worker, step, flat.size),
                        out=flat)
        values = client.push_pull(gradients)
    client.done()
    if client.is_chief:
        client.wait_for_workers()
        values = client.pull()
        with open(out_path, "w") as out:
            for name, value in values.items():
                out.write(name + "".join(" %.9g" % v for v in value.reshape(-1)) + "\n")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    except pstrain.Error as error:
        print(f"fixed_gradient_worker.py: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
