# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a module run loads the collection's module_utils from its AnsiballZ payload: each file compiled once.

How it works and why: docs/dev/node-code.md, "core/_zipload.py".
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
