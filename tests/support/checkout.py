"""Where the tests find the checkout and the ansible-core under test.

The checkout is also the collection: ``.collections/ansible_collections/gpunode/tuning`` links back to it
(scripts/setup.sh makes the link, ``make setup``).
"""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, ".collections")
# The ansible-core under test: GPUNODE_ANSIBLE_BIN names a virtual environment's bin directory
# (scripts/matrix.py points it at each version's); by default the shared .venv.
VENV_BIN = os.environ.get("GPUNODE_ANSIBLE_BIN") or os.path.join(REPO, ".venv", "bin")


def ansible_env(**extra):
    """The environment of an ansible command run from the checkout: the venv first on PATH, the checkout's
    collection, no colours, the repository's ansible.cfg (the working directory's) and ``extra``."""
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_COLLECTIONS_PATH"] = COLLECTIONS
    env["ANSIBLE_NOCOLOR"] = "1"
    env.pop("ANSIBLE_CONFIG", None)
    env.update(extra)
    return env
