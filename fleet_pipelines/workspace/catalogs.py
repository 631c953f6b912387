"""The compiled message catalogs a project's tests read, written into the checkout.

Projects translated with gettext keep the source catalogs (`locale/<lang>/LC_MESSAGES/<domain>.po`)
in git and compile them to the `.mo` files `gettext.translation` reads as a build step of their
own (`msgfmt`, a script, a tox step), ignoring the `.mo` in git. A checkout lacks them, so the
tests of the translations skip or fail where the project's CI and its sdist pass them (humanize
4.11.0: 23 tests). The judge runs no build script, so each `.po` under a `LC_MESSAGES` folder
whose `.mo` the checkout lacks is compiled here, with Babel's reader and writer (`babel.messages`:
parsing only, nothing of the catalog is evaluated), leaving out fuzzy entries as `msgfmt` does.

A catalog through a symbolic link is not read; one that does not parse is listed, not written;
past `MAX_CATALOG_BYTES` of catalogs in all, the rest are listed, not written.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po

from .version_files import write_generated

MAX_CATALOG_BYTES = 32 * 1024 * 1024


def source_catalogs(project: Path) -> list[Path]:
    """The `.po` files under `LC_MESSAGES` folders of the checkout whose `.mo` it lacks, sorted;
    none reached through a symbolic link."""
    found = []
    for directory, folders, files in os.walk(project):
        folders[:] = sorted(
            f for f in folders if f != ".git" and not os.path.islink(os.path.join(directory, f))
        )
        if os.path.basename(directory) != "LC_MESSAGES":
            continue
        for name in sorted(files):
            path = Path(directory, name)
            if (
                name.endswith(".po")
                and not path.is_symlink()
                and not os.path.lexists(path.with_suffix(".mo"))
            ):
                found.append(path)
    return found


def write_catalogs(project: Path) -> list[str]:
    """Compiles the catalogs `source_catalogs` finds; one line for each (its `.mo` path relative
    to `project`, the entries written), or why it was not written."""
    written, total = [], 0
    for source in source_catalogs(project):
        relative = source.with_suffix(".mo").relative_to(project)
        total += source.stat().st_size
        if total > MAX_CATALOG_BYTES:
            written.append(f"{relative}: not written, the catalogs pass {MAX_CATALOG_BYTES} bytes")
            continue
        # Babel prints each line it skips ("WARNING: Problem on line N"): counted here
        problems = io.StringIO()
        try:
            with source.open("rb") as text, contextlib.redirect_stdout(problems):
                catalog = read_po(text)
            compiled = io.BytesIO()
            write_mo(compiled, catalog)
        except Exception as error:  # Babel raises what the text makes it raise; the line says which
            why = f"{type(error).__name__}: {error}"
            written.append(f"{relative}: not written, {source.name} does not parse: {why}"[:300])
            continue
        write_generated(source.with_suffix(".mo"), compiled.getvalue())
        entries = sum(1 for message in catalog if message.id and message.string and not message.fuzzy)
        skipped = problems.getvalue().count("WARNING: Problem on line")
        note = f", {skipped} of its lines not understood" if skipped else ""
        written.append(f"{relative} ({entries} messages, compiled from {source.name}{note})")
    return written
