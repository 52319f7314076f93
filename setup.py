"""`pip install --no-build-isolation .`: the pstrain module and the programs,
built by this checkout's CMake tree.

setuptools asks CMake for the module (_pstrain) and the programs only, no
test, in $PSTRAIN_BUILD_DIR (default build-pip/ in the checkout; a tree
configured there before is reused as it is, so PSTRAIN_BUILD_DIR=build
installs what scripts/build.sh built). The wheel holds the package `pstrain`
and pslaunch, ps_server, worker, psctl, psreport and ctr_datagen as scripts,
which pip puts in the environment's bin/ (pslaunch starts the ps_server and
worker beside it). setuptools' own build files and metadata go into the
build tree too, so the checkout keeps no trace of the install.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
# setuptools' own distutils (imported after setuptools, which provides it).
from distutils.command.build_scripts import build_scripts

ROOT = pathlib.Path(__file__).resolve().parent
BUILD = pathlib.Path(os.environ.get("PSTRAIN_BUILD_DIR") or ROOT / "build-pip").resolve()
PROGRAMS = ["pslaunch", "ps_server", "worker", "psctl", "psreport", "ctr_datagen"]


def version():
    match = re.search(r"project\(pstrain VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text())
    return match.group(1)


def fail(message):
    # One line: what, where, what to do (pip prints it under its own heading).
    sys.exit(f"pstrain setup.py: {message}")


def cmake(*args):
    command = ["cmake", *map(str, args)]
    if shutil.which("cmake") is None:
        fail("cmake is not installed; run scripts/install_deps.sh, then pip install again")
    if subprocess.run(command).returncode != 0:
        fail(f"`{' '.join(command)}` failed (its output is above; pip shows it with -v)")


class CMakeBuild(build_ext):
    """Configures BUILD if it holds no tree yet, builds the module and the
    programs there, and copies the module where the wheel takes it."""

    def run(self):
        if not (BUILD / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            # The interpreter the environment was made from: a virtual
            # environment's python3 has the same headers and ABI.
            python = getattr(sys, "_base_executable", sys.executable)
            cmake("-S", ROOT, "-B", BUILD, *generator, "-DCMAKE_BUILD_TYPE=Release",
                  "-DBUILD_TESTING=OFF", "-DPST_REQUIRE_PYTHON=ON",
                  f"-DPython3_EXECUTABLE={python}")
        cmake("--build", BUILD, "--target", "_pstrain", *PROGRAMS)
        super().run()

    def build_extension(self, ext):
        built = sorted((BUILD / "python" / "pstrain").glob("_pstrain.*.so"))
        if len(built) != 1:
            fail(f"expected one _pstrain module in {BUILD}/python/pstrain, found {len(built)}; "
                 f"remove {BUILD} and pip install again")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


class CopyPrograms(build_scripts):
    """The programs are executables, not Python scripts: copied as they are
    (setuptools' build_scripts would read them as text to fix a #! line)."""

    def run(self):
        os.makedirs(self.build_dir, exist_ok=True)
        for program in PROGRAMS:
            shutil.copy2(BUILD / "bin" / program, os.path.join(self.build_dir, program))

    def get_source_files(self):
        return []


# pip asks for bdist_wheel, which the `wheel` package brings: an environment
# made from another interpreter than Debian's lacks it (and Debian's NumPy
# and PyTorch, and the headers the module is built against).
try:
    import wheel  # noqa: F401
except ImportError:
    fail(f"{sys.executable} has no `wheel` package: make the environment with Debian's "
         "interpreter (/usr/bin/python3 -m venv --system-site-packages ENV, with python3-wheel "
         "installed), then run ENV/bin/pip install --no-build-isolation --no-index . again")

# setuptools writes its build folders and metadata into the build tree, not
# into the checkout.
(BUILD / "setuptools").mkdir(parents=True, exist_ok=True)
setup(
    version=version(),
    packages=["pstrain"],
    package_dir={"pstrain": "python/pstrain"},
    ext_modules=[Extension("pstrain._pstrain", sources=[])],
    scripts=PROGRAMS,
    cmdclass={"build_ext": CMakeBuild, "build_scripts": CopyPrograms},
    options={"build": {"build_base": str(BUILD / "setuptools")},
             "egg_info": {"egg_base": str(BUILD / "setuptools")}},
    zip_safe=False,
)
