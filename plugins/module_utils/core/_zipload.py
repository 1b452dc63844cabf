# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a module run loads the collection's module_utils from its AnsiballZ payload: each file compiled once.

A module run on a node imports module_utils from the AnsiballZ payload, a zip file, with Python's
``zipimport``. ``zipimport`` compiles each module from source twice (CPython 3.8 to 3.13 at least):
once in ``find_spec``, whose ``get_filename`` works the file name out by compiling the module, and once
more in ``exec_module``. The payload carries no bytecode, so every run compiles what it imports, and
module_utils is most of a module run's code: compiling was about 60% of a ``tuning_rollout`` run's
CPU (issue 31, docs/performance.md).

Every module imports this file first (``from ...module_utils.core import _zipload, ...``, for its side
effect; tests/unit/test_zip_loading.py checks that each does). Loaded from a zip, it puts ``_ZipFinder``
in front of Python's finders: it finds the rest of module_utils in the same zip with the same
``zipimporter``, but names each file without compiling it, so each is compiled once, by
``exec_module``. Nothing else changes: the same archive, the same ``__file__``, the same packages;
anything it cannot place (not in a zip, no source) is left to Python's own finders. Loaded any other
way (the controller, the tests) it does nothing. It is not in a package ``__init__``: Ansible ships
the packages down to module_utils as empty synthetic ones, and ansible-test 2.16 wants the others empty.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipimport

# The collection's module_utils package: everything below it is found by _ZipFinder.
_PACKAGE = __name__.rsplit(".", 2)[0]


class _ZipImporter(zipimport.zipimporter):
    """A zipimporter whose ``get_filename`` does not compile the module to name its file."""

    def get_filename(self, fullname):
        is_package = self.is_package(fullname)  # ZipImportError when the archive does not have it
        if self.get_source(fullname) is None:  # bytecode only: zipimport's own rules decide the name
            return super().get_filename(fullname)
        path = os.path.join(self.archive, self.prefix + fullname.rpartition(".")[2])
        return os.path.join(path, "__init__.py") if is_package else path + ".py"


class _ZipFinder:
    """Finds module_utils' modules in the zip this file was loaded from, for ``_ZipImporter`` to load."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):  # pylint: disable=unused-argument
        if not fullname.startswith(_PACKAGE + ".") or not path:
            return None
        for entry in path:
            try:
                importer = _ZipImporter(entry)
                is_package = importer.is_package(fullname)
            except zipimport.ZipImportError:  # not a path into a zip, or not in it
                continue
            return importlib.util.spec_from_loader(fullname, importer, is_package=is_package)
        return None

    @staticmethod
    def invalidate_caches():
        """Nothing is cached here (zipimport keeps the archive's directory)."""


if isinstance(getattr(__spec__, "loader", None), zipimport.zipimporter) and not any(
        getattr(finder, "__qualname__", None) == "_ZipFinder" and getattr(finder, "__module__", None) == __name__
        for finder in sys.meta_path):
    sys.meta_path.insert(0, _ZipFinder)
