"""The model types read from transformers' auto-mapping sources equal those its import gives,
and a shape the reader does not understand falls back instead of guessing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from monitor.hub import model_types
from monitor.hub.model_types import mapping_keys_in_source, model_types_from_source


def test_the_source_reading_equals_the_imported_mappings() -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    read = model_types_from_source()
    assert read is not None, "transformers' auto mappings are no longer plain literals: the gate imports torch"
    known, causal = read
    assert known == frozenset(CONFIG_MAPPING_NAMES) and causal == frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert {"gpt2", "gpt_neox", "llama", "gpt-sw3"} <= known and "vit" in known - causal
    assert model_types.known_model_types() == known and model_types.causal_model_types() == causal


def test_the_gate_and_the_loader_checks_do_not_import_torch() -> None:
    code = ("import sys\nfrom monitor.hub.gate import known_model_types\n"
            "from monitor.scoring.loader import check_checkpoint_dir\n"
            "assert 'llama' in known_model_types()\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_literal_shapes_are_read_and_others_refused(tmp_path) -> None:
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text('from collections import OrderedDict\nM = OrderedDict([("a", "A"), ("b", "B")])\n')
    second.write_text(textwrap.dedent("""\
        from .first import M
        M.update({"c": "C"})
        M = OrderedDict(**{"d": "D"}, **M)
        def later():
            M["never"] = "at import"
        X = {k: v for k, v in M.items()}
        """))
    assert mapping_keys_in_source([first, second, tmp_path / "missing.py"], "M") == {"a", "b", "c", "d"}
    # a reassignment without M itself replaces the keys
    (tmp_path / "third.py").write_text('M = OrderedDict([("z", "Z")])\n')
    assert mapping_keys_in_source([first, tmp_path / "third.py"], "M") == {"z"}
    for body in ('M["x"] = "X"\n', 'del M["a"]\n', 'M.pop("a")\n', 'M = OrderedDict(OTHER)\n',
                 'M = OrderedDict([(1, "A")])\n', 'M.update(make())\n'):
        (tmp_path / "odd.py").write_text(body)
        assert mapping_keys_in_source([first, tmp_path / "odd.py"], "M") is None, body


def test_shapes_whose_keys_the_literals_do_not_say_are_refused(tmp_path) -> None:
    """Each body below gives the import a set of keys that differs from the string keys of its
    literals: a keyword argument's name is a key, a key computed by an expression is one, and a
    conditional update may or may not run. The reader must refuse them (fall back to the
    import), never answer a different set."""
    first = tmp_path / "first.py"
    first.write_text('from collections import OrderedDict\nM = OrderedDict([("a", "A"), ("b", "B")])\n')
    imported = {   # what importing each body after `first` leaves in M, worked by hand
        'M.update(c="C")\n': {"a", "b", "c"},
        'M = OrderedDict(c="C", **M)\n': {"a", "b", "c"},
        'M.update([("c" + "d", "CD")])\n': {"a", "b", "cd"},
        'M.update({"c" "d": "CD", f"{1}": "F"})\n': {"a", "b", "cd", "1"},
        'if False:\n    M.update({"c": "C"})\n': {"a", "b"},
        'M.update({"c": "C"}) if False else None\n': {"a", "b"},
    }
    for body, keys in imported.items():
        namespace: dict = {}
        exec(first.read_text() + body, namespace)   # the import's answer, to keep the table honest
        assert set(namespace["M"]) == keys, body
        (tmp_path / "odd.py").write_text(body)
        read = mapping_keys_in_source([first, tmp_path / "odd.py"], "M")
        assert read is None or read == keys, (body, read)
