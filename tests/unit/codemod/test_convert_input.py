"""`perfora convert` on input that is not a plain UTF-8 training script of a sane size.

Encodings follow PEP 263 (a latin-1 script with a coding declaration converts and is written
back in latin-1; one without gets exit 2 and says how to fix it), binary files, directories
and files over the size limit get exit 2 with a message, never a traceback. Line numbers of
findings come from the statement that holds them (not from positions of the whole module):
checked here against libcst's own PositionProvider.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("libcst", reason="perfora convert needs libcst (the dev extra has it)")

import libcst as cst  # noqa: E402
from libcst.metadata import MetadataWrapper, PositionProvider  # noqa: E402

from perfora.cli import main  # noqa: E402
from perfora.cli.convert import MAX_SIZE  # noqa: E402
from perfora.codemod.analysis import Analyzer  # noqa: E402
from tests.support.paths import ROOT, SCRIPTS

ROOT = ROOT
CORPUS = SCRIPTS / "convert_corpus"
TRAIN = (CORPUS / "single_argparse_steplr.py").read_text()
ACCENTED = TRAIN.replace("# one line per epoch", "# une ligne par époque")


def test_latin1_script_with_a_coding_declaration_converts_and_stays_latin1(tmp_path, capsys):
    script = tmp_path / "train.py"
    original = ("# -*- coding: latin-1 -*-\n" + ACCENTED).encode("latin-1")
    script.write_bytes(original)
    assert main(["convert", str(script)]) == 0
    assert "+    model = perfora.perforate(model)" in capsys.readouterr().out
    assert main(["convert", "--write", str(script)]) == 0
    assert (tmp_path / "train.py.bak").read_bytes() == original  # byte for byte
    written = script.read_bytes()
    assert "une ligne par époque".encode("latin-1") in written
    assert "perfora.perforate(model)" in written.decode("latin-1")
    assert main(["convert", "--check", str(script)]) == 0  # reads back as converted


def test_utf8_with_bom_keeps_its_bom(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_bytes(b"\xef\xbb\xbf" + ACCENTED.encode("utf-8"))
    assert main(["convert", "--write", str(script)]) == 0
    assert script.read_bytes().startswith(b"\xef\xbb\xbf")
    assert "époque" in script.read_text(encoding="utf-8-sig")


@pytest.mark.parametrize("first", [b"# caf\xe9 training script\n", b"\n# \xe9\n"],
                         ids=["line_1", "line_2"])
def test_a_non_utf8_byte_on_the_first_two_lines_is_named_too(tmp_path, capsys, first):
    # there Python's encoding detection fails first; its "invalid or missing encoding
    # declaration" would send the user to fix a declaration the script does not have
    script = tmp_path / "train.py"
    script.write_bytes(first + b"import torch\n")
    assert main(["convert", str(script)]) == 2
    line = first.split(b"\n").index(next(x for x in first.split(b"\n") if b"\xe9" in x)) + 1
    err = capsys.readouterr().err
    assert f"not utf-8 text (byte 0xe9 on line {line})" in err and "declaration" not in err
    bad = tmp_path / "bogus.py"
    bad.write_bytes(b"# -*- coding: bogus -*-\nx = 1\n")
    assert main(["convert", str(bad)]) == 2
    assert "unknown encoding: bogus: fix the coding declaration" in capsys.readouterr().err


def test_latin1_without_a_declaration_says_how_to_fix_it(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_bytes(ACCENTED.encode("latin-1"))
    line = ACCENTED.splitlines().index(next(x for x in ACCENTED.splitlines() if "é" in x)) + 1
    assert main(["convert", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{script}: not utf-8 text (byte 0xe9 on line {line})" in err
    assert "# -*- coding: latin-1 -*-" in err and "Traceback" not in err


def test_a_bad_coding_declaration_is_an_error(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("# -*- coding: no-such-codec -*-\n" + TRAIN)
    assert main(["convert", str(script)]) == 2
    assert "no-such-codec" in capsys.readouterr().err


def test_binary_file_and_directory_exit_2_with_a_message(tmp_path, capsys):
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"PK\x03\x04\x00\x00" + bytes(range(256)) * 4)
    assert main(["convert", str(binary)]) == 2
    assert "a binary file" in capsys.readouterr().err
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "models.py").write_text("import torch\n")
    assert main(["convert", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder}: is a directory, not a script" in err
    assert f"perfora convert {folder / 'train.py'}" in err  # a training script first
    assert "(Python files in it: train.py, models.py)" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["convert", str(empty)]) == 2
    assert "no .py files in it" in capsys.readouterr().err


def test_undecodable_file_in_a_real_process_exits_2_without_a_traceback(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes(ACCENTED.encode("latin-1"))
    code = f"import sys; from perfora.cli import main; sys.exit(main(['convert', {str(script)!r}]))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "not utf-8 text" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_files_over_the_size_limit_are_refused_before_parsing(tmp_path, capsys):
    big = tmp_path / "generated.py"
    big.write_text("# padding\n" * (MAX_SIZE // 10) + "x = 1\n")  # just over 1 MB
    assert big.stat().st_size > MAX_SIZE
    assert main(["convert", str(big)]) == 2  # instant: refused from the file's size
    err = capsys.readouterr().err
    assert f"{big.stat().st_size:,} bytes, over the {MAX_SIZE:,}-byte limit" in err
    assert "--max-size" in err
    small = tmp_path / "train.py"
    small.write_text(TRAIN)
    assert main(["convert", "--max-size", "1000", str(small)]) == 2
    assert "over the 1,000-byte limit" in capsys.readouterr().err
    assert main(["convert", "--max-size", "0", str(small)]) == 0  # 0: no limit


def test_line_numbers_match_libcst_positions_below_a_header():
    source = ("#!/usr/bin/env python\n# a header comment\n\n" + TRAIN.replace(
        "\n\ndef evaluate", "\n\n# a comment above\n\n\ndef evaluate"))
    analyzer = Analyzer(source)
    positions = MetadataWrapper(analyzer.module, unsafe_skip_copy=True).resolve(
        PositionProvider)
    nodes = [n for n in positions if isinstance(n, (cst.Call, cst.For, cst.SimpleStatementLine,
                                                    cst.FunctionDef))]
    assert len(nodes) > 50
    assert [analyzer.line(n) for n in nodes] == [positions[n].start.line for n in nodes]
