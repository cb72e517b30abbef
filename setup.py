"""`pip install .`: builds ballast's Python package (python/ballast) with CMake.

Only Debian packages are needed (scripts/setup installs them: cmake, ninja-build, g++,
nlohmann-json3-dev, libfmt-dev, libcli11-dev, coinor-libcbc-dev, pybind11-dev,
python3-dev, python3-setuptools, python3-wheel). The extension is built by the project's
own CMakeLists.txt with -DBALLAST_PYTHON_ONLY=ON (no MPI, no tests); the bundled data
(presets, length distributions) is installed inside the package as ballast/data.

    python3 -m venv --system-site-packages .venv   # Debian's python3 refuses system-wide pip
    .venv/bin/pip install .                        # add --no-build-isolation with pip >= 23.1
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
(ROOT / "build-pip").mkdir(exist_ok=True)  # setuptools' build and egg-info folders (ignored by git)


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the `_ballast` target, then copies it and the data in place."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        jobs = str(os.cpu_count() or 1)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator,
                        "-DCMAKE_BUILD_TYPE=Release", "-DBALLAST_PYTHON_ONLY=ON",
                        f"-DPython_EXECUTABLE={sys.executable}"], check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "ballast_python",
                        "--parallel", jobs], check=True)
        built = next((build_dir / "python" / "ballast").glob("_ballast*.so"))
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
        # Bundled data next to the package; ballast/__init__.py points BALLAST_DATA_DIR at it.
        data_target = target.parent / "data"
        if data_target.exists():
            shutil.rmtree(data_target)
        shutil.copytree(ROOT / "data", data_target)


# The version is written once, in CMakeLists.txt's project(VERSION).
VERSION = re.search(r"project\(ballast VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)

setup(
    name="ballast",
    version=VERSION,
    description="Balanced variable-length steps for distributed LLM training (FlexSP, Zeppelin)",
    license="see the repository",
    python_requires=">=3.9",
    packages=["ballast"],
    package_dir={"": "python"},
    package_data={"ballast": ["py.typed", "*.pyi"]},
    ext_modules=[CMakeExtension("ballast._ballast")],
    cmdclass={"build_ext": CMakeBuild},
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    zip_safe=False,
    # Out of CMake's build/ (setuptools' default build_base is build/).
    options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}},
)
