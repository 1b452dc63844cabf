"""Offline stand-in for get-pip.py, used by ansible-test to bootstrap pip in its sanity venvs.

ansible-test (``_util/target/setup/requirements.py``, ``bootstrap()``) runs
``~/.ansible/test/cache/get_pip_<pip version with dots as underscores>.py`` as ``__main__``
with pip-install style arguments, for example::

    --disable-pip-version-check pip==24.2 --no-setuptools --no-wheel

and downloads that file from ci-files.testing.ansible.com when it is missing. That host is
unreachable here, so scripts/setup.sh places this file there instead. It installs pip from
the interpreter's bundled ensurepip wheel, then lets that pip install the requested packages
from PyPI, which is reachable.
"""

from __future__ import annotations

import ensurepip
import importlib.util
import os
import subprocess
import sys

# get-pip.py options that pip itself does not know.
GET_PIP_ONLY_OPTIONS = {"--no-setuptools", "--no-wheel"}


def main() -> None:
    """Bootstrap pip, install the requested packages, honour --no-setuptools/--no-wheel."""
    args = sys.argv[1:]
    had_setuptools = importlib.util.find_spec("setuptools") is not None
    # ensurepip.bootstrap() deletes PIP_* from os.environ and sets PIP_CONFIG_FILE=/dev/null;
    # the pip runs after it must still see pip's configuration (index, proxy CA, ...).
    environ = dict(os.environ)

    # Python 3.11's ensurepip installs setuptools alongside pip.
    ensurepip.bootstrap(upgrade=True)

    pip = [sys.executable, "-m", "pip"]
    pip_args = [arg for arg in args if arg not in GET_PIP_ONLY_OPTIONS]
    subprocess.check_call([*pip, "install", *pip_args], env=environ)

    if "--no-setuptools" in args and not had_setuptools:
        subprocess.check_call([*pip, "uninstall", "--yes", "--quiet", "setuptools"], env=environ)


if __name__ == "__main__":
    main()
