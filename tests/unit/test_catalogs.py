"""The compiled gettext catalogs a project's build writes and git ignores, compiled from their
`.po` sources into the checkout (`workspace.catalogs`), read back by the standard library's own
`gettext` as the project's tests read them."""

from __future__ import annotations

import gettext
import os
from pathlib import Path

from fleet_pipelines.workspace.catalogs import MAX_CATALOG_BYTES, write_catalogs

HEADER = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n"Language: {language}\\n"\n'
HEADER += '"Plural-Forms: nplurals=2; plural=(n != 1);\\n"\n\n'
ENTRIES = (
    'msgid "second"\nmsgid_plural "seconds"\nmsgstr[0] "seconde"\nmsgstr[1] "secondes"\n\n'
    'msgid "minute"\nmsgid_plural "minutes"\nmsgstr[0] ""\nmsgstr[1] ""\n\n'
    'msgctxt "0 (male)"\nmsgid "th"\nmsgstr "e"\n\n'
    '#, fuzzy\nmsgid "yesterday"\nmsgstr "hier?"\n\n'
    'msgid "today"\nmsgstr "aujourd\'hui"\n'
)


def _catalog(project: Path, language: str, text: str) -> Path:
    folder = project / "src" / "pkg" / "locale" / language / "LC_MESSAGES"
    folder.mkdir(parents=True)
    (folder / "pkg.po").write_text(text)
    return folder


def test_a_catalog_the_checkout_lacks_is_compiled_and_gettext_reads_it(tmp_path):
    folder = _catalog(tmp_path, "fr_FR", HEADER.format(language="fr_FR") + ENTRIES)
    os.chmod(folder, 0o555)  # the checkout is read-only
    assert write_catalogs(tmp_path) == [
        "src/pkg/locale/fr_FR/LC_MESSAGES/pkg.mo (3 messages, compiled from pkg.po)"
    ]
    assert (folder / "pkg.mo").stat().st_mode & 0o777 == 0o444 and folder.stat().st_mode & 0o777 == 0o555
    translation = gettext.translation("pkg", tmp_path / "src" / "pkg" / "locale", ["fr_FR"])
    assert translation.ngettext("second", "seconds", 1) == "seconde"
    assert translation.ngettext("second", "seconds", 3) == "secondes"
    assert translation.pgettext("0 (male)", "th") == "e"
    assert translation.gettext("today") == "aujourd'hui"
    assert translation.gettext("yesterday") == "yesterday"  # fuzzy: left out, as msgfmt leaves it
    # an untranslated plural is left out as msgfmt leaves it (Babel would write "" for it)
    assert translation.ngettext("minute", "minutes", 2) == "minutes"


def test_a_compiled_catalog_is_left_alone_and_one_outside_lc_messages_or_through_a_link_is_not_read(tmp_path):
    folder = _catalog(tmp_path, "de", HEADER.format(language="de") + ENTRIES)
    (folder / "pkg.mo").write_bytes(b"the project's own")
    elsewhere = tmp_path / "po"
    elsewhere.mkdir()
    (elsewhere / "pkg.po").write_text(HEADER.format(language="it") + ENTRIES)
    linked = tmp_path / "locale" / "it"
    linked.mkdir(parents=True)
    (linked / "LC_MESSAGES").symlink_to(elsewhere)
    assert write_catalogs(tmp_path) == []
    assert (folder / "pkg.mo").read_bytes() == b"the project's own"
    assert not (elsewhere / "pkg.mo").exists()


def test_header_fields_babel_refuses_are_left_out_and_a_catalog_it_cannot_read_is_listed(tmp_path):
    # humanize 4.11.0's catalogs: `Language: arabic (عربي)` and an empty `PO-Revision-Date`,
    # which GNU msgfmt compiles and Babel refuses; gettext reads neither field
    arabic = _catalog(tmp_path, "ar", HEADER.format(language="arabic (عربي)") + ENTRIES)
    dated = HEADER.format(language="uk").replace('"Language', '"PO-Revision-Date: \\n"\n"Language', 1)
    ukrainian = _catalog(tmp_path, "uk", dated + ENTRIES)
    odd = _catalog(tmp_path, "fr", HEADER.format(language="fr") + 'msgid "a"\nmsgstr "b"\n\nthis is not po\n')
    charset = HEADER.format(language="de").replace("charset=UTF-8", "charset=no-such-charset")
    unknown = _catalog(tmp_path, "de", charset + ENTRIES)
    written = write_catalogs(tmp_path)
    assert written[0] == (
        "src/pkg/locale/ar/LC_MESSAGES/pkg.mo (3 messages, compiled from pkg.po, its header's "
        "Language and dates left out (Babel: expected only letters, got 'arabic (عربي)'))"
    )
    assert written[1].startswith("src/pkg/locale/de/LC_MESSAGES/pkg.mo: not written, pkg.po does not parse: ")
    assert written[2] == (
        "src/pkg/locale/fr/LC_MESSAGES/pkg.mo (1 messages, compiled from pkg.po, "
        "1 of its lines not understood)"
    )
    assert written[3].startswith(
        "src/pkg/locale/uk/LC_MESSAGES/pkg.mo (3 messages, compiled from pkg.po, its"
    )
    assert "(Babel: time data '' does not match format" in written[3]
    assert not (unknown / "pkg.mo").exists()
    for folder in (arabic, ukrainian, odd):
        assert (folder / "pkg.mo").exists()
    translation = gettext.translation("pkg", tmp_path / "src" / "pkg" / "locale", ["ar"])
    assert translation.ngettext("second", "seconds", 2) == "secondes"


def test_catalogs_past_the_size_cap_are_listed_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr("fleet_pipelines.workspace.catalogs.MAX_CATALOG_BYTES", 1000)
    assert MAX_CATALOG_BYTES > 1000
    _catalog(tmp_path, "de", HEADER.format(language="de") + ENTRIES)
    _catalog(tmp_path, "fr", HEADER.format(language="fr") + ENTRIES + "#" * 1000 + "\n")
    assert write_catalogs(tmp_path) == [
        "src/pkg/locale/de/LC_MESSAGES/pkg.mo (3 messages, compiled from pkg.po)",
        "src/pkg/locale/fr/LC_MESSAGES/pkg.mo: not written, the catalogs pass 1000 bytes",
    ]
