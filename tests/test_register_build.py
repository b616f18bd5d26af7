"""Register corpora (monitor/scoring/register_build.py, `lstar corpus build-registers`), built from
small .debs made here with `dpkg-deb --build`, as the pool tests do."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.errors import CorpusError
from monitor.scoring.corpus import load_corpus
from monitor.scoring.register_build import REGISTER_PINS_DIR, build_register, code_units, load_register_pins

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian's dpkg-deb")

WORDS = "river stone light garden quiet morning letter window summer market bridge island".split()


def dpkg_build(root: Path, package: str, version: str, out: Path) -> Path:
    (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: Test <test@example.org>\nDescription: test package\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                   check=True, capture_output=True)
    return out


def module_text(i: int) -> str:
    funcs = "\n\n".join(f"def {w}_{i}(x):\n    \"\"\"Return the {w} of x.\"\"\"\n    return x + {j}\n"
                        for j, w in enumerate(WORDS))
    return f'"""Module {i}."""\n\nimport os\n\n\n{funcs}\n\n@decorated\n# a note\nclass Thing{i}:\n    pass\n'


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> dict:
    base = tmp_path_factory.mktemp("registers")
    root = base / "pylib"
    lib = root / "usr/lib/python3.11"
    (lib / "test").mkdir(parents=True)
    for i in range(40):
        (lib / f"mod{i:02d}.py").write_text(module_text(i))
    (lib / "test" / "test_skip.py").write_text("def never_read():\n    pass\n")
    cache = base / "cache"
    cache.mkdir()
    dpkg_build(root, "libtiny-stdlib", "3.11.2-1", cache / "libtiny-stdlib_3.11.2-1_all.deb")
    exclude = [shared_dir / "corpus" / "calib-v0"]
    built = build_register(base / "reg", ["libtiny-stdlib"], register="code", cache=cache, exclude=exclude,
                           documents=25, name="register-tiny", version="v1")
    return {"base": base, "cache": cache, "exclude": exclude, "built": built, "root": root}


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_code_units_cut_at_top_level_definitions() -> None:
    text = "import os\n\nX = 1\n\n# about f\n@dec\n@dec2\ndef f():\n    return 1\n\nclass C:\n    def m(self):\n        pass\n"
    units = code_units("usr/lib/python3.11/m.py", text.encode(), "code")
    # worked by hand: module head; f with its comment and both decorators; C with its method
    assert [u.text for u in units] == ["import os\n\nX = 1",
                                       "# about f\n@dec\n@dec2\ndef f():\n    return 1",
                                       "class C:\n    def m(self):\n        pass"]
    assert [u.origin for u in units] == ["usr/lib/python3.11/m.py:L1", "usr/lib/python3.11/m.py:L5",
                                         "usr/lib/python3.11/m.py:L11"]


def test_code_reader_is_linear_in_a_hostile_file() -> None:
    for n in (20_000, 200_000):
        data = ("@" * 50 + "\n") * n
        start = time.perf_counter()
        code_units("usr/lib/python3.11/evil.py", data.encode(), "code")
        elapsed = time.perf_counter() - start
        if n == 20_000:
            small = elapsed
    assert elapsed < max(30 * small, 2.0)


def test_register_is_a_loadable_sample_without_test_suites(world: dict) -> None:
    corpus = load_corpus(world["built"].path)
    assert len(corpus.documents) == 25
    assert {d.slice for d in corpus.documents} == {"code"}
    assert not any("never_read" in d.text for d in corpus.documents)
    manifest = world["built"].manifest
    assert manifest["corpus"]["sha256"] == corpus.sha256
    assert manifest["excluded"]["documents_before_sample"] > 25
    assert all(not s["path"].startswith("usr/lib/python3.11/test/") for s in manifest["sources"])


def test_pins_rebuild_the_register_byte_for_byte(world: dict, tmp_path: Path) -> None:
    pins = world["built"].path / "register.json"
    cache2 = tmp_path / "cache-copy"
    shutil.copytree(world["cache"], cache2)
    assert main(["corpus", "build-registers", str(tmp_path / "out"), "--pins", str(pins), "--cache", str(cache2),
                 *sum((["--exclude", str(p)] for p in world["exclude"]), [])]) == 0
    assert tree(tmp_path / "out" / "register-tiny") == tree(world["built"].path)


def test_another_package_version_is_refused_in_one_line(world: dict, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    pins = json.loads((world["built"].path / "register.json").read_text())
    pins["packages"][0]["version"] = "3.11.2-9"
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(pins))
    code = main(["corpus", "build-registers", str(tmp_path / "out"), "--pins", str(path),
                 "--cache", str(world["cache"]), *sum((["--exclude", str(p)] for p in world["exclude"]), [])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "package libtiny-stdlib: pinned version 3.11.2-9, found 3.11.2-1" in err
    assert not (tmp_path / "out" / "register-tiny").exists()


def test_a_changed_build_is_refused_against_its_pins(world: dict, tmp_path: Path) -> None:
    pins = json.loads((world["built"].path / "register.json").read_text())
    pins["corpus"]["sha256"] = "0" * 64
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(pins))
    with pytest.raises(CorpusError, match=r"differs from .*pins\.json: corpus sha256 [0-9a-f]{16}… vs pinned 0{16}…"):
        build_register(tmp_path / "out", None, cache=world["cache"], exclude=world["exclude"], pins=path)


def test_committed_register_pins_are_three_registers_clear_of_calibration() -> None:
    pins = [load_register_pins(p) for p in sorted(REGISTER_PINS_DIR.glob("*.json"))]
    assert sorted(p["register"] for p in pins) == ["code", "dictionary", "technical"]
    for p in pins:
        assert 200 <= p["corpus"]["documents"] <= 400
        assert [c["name"] for c in p["excluded"]["corpora"]].count("lstar-calib") >= 1
        assert all(len(e["deb_sha256"]) == 64 for e in p["packages"])
