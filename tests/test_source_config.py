"""Kernel source annotations (kfray.source) and the typed run configuration (kfray.config)."""
from __future__ import annotations

import pytest

from kfray.config import RunConfig, load_config, parse_override
from kfray.errors import ConfigError
from kfray.source import (ParamSpace, define_flags, normalize, parse_params, safe_eval,
                          source_hash)

SRC = """\
// A tiled kernel.
// @kf.param BLOCK  in [64, 128, 256, 512]
// @kf.param UNROLL in [1, 2, 4, 8]
// @kf.require BLOCK * UNROLL <= 512
/* @kf.require UNROLL <= 4 */
extern "C" int kf_forward(float* x) { return 0; }
"""


# ---------------------------------------------------------------- source

def test_parse_params_values_and_requires():
    space = parse_params(SRC)
    assert space.values == {"BLOCK": (64, 128, 256, 512), "UNROLL": (1, 2, 4, 8)}
    assert space.requires == ("BLOCK * UNROLL <= 512", "UNROLL <= 4")
    assert space.size() == 16


def test_parse_params_literals():
    space = parse_params("// @kf.param SCALE in [0.5, 1.5]\n// @kf.param MODE in [row, 'col']\n")
    assert space.values == {"SCALE": (0.5, 1.5), "MODE": ("row", "col")}
    assert space.requires == ()


def test_no_params():
    space = parse_params("int main() { return 0; }")
    assert space.values == {} and space.requires == ()
    assert space.default() == {}
    assert list(space.settings()) == [{}]


def test_allows():
    space = parse_params(SRC)
    assert space.allows({"BLOCK": 128, "UNROLL": 4})
    assert not space.allows({"BLOCK": 256, "UNROLL": 4})    # 1024 > 512
    assert not space.allows({"BLOCK": 64, "UNROLL": 8})     # UNROLL > 4


def test_settings_respect_requires():
    space = parse_params(SRC)
    got = list(space.settings())
    expected = [{"BLOCK": b, "UNROLL": u} for b in (64, 128, 256, 512) for u in (1, 2, 4, 8)
                if b * u <= 512 and u <= 4]
    assert got == expected                      # declaration order, constraints applied
    assert len(got) == 9
    assert all(space.allows(s) for s in got)


def test_default_is_first_allowed_setting():
    assert parse_params(SRC).default() == {"BLOCK": 64, "UNROLL": 1}
    space = ParamSpace({"A": (8, 4, 2)}, ("A < 8",))
    assert space.default() == {"A": 4}
    assert ParamSpace({"A": (8,)}, ("A < 8",)).default() == {}


def test_require_with_c_operators():
    space = parse_params("// @kf.param A in [1, 2]\n// @kf.param B in [1, 2]\n"
                         "// @kf.require A == 1 || B == 1\n// @kf.require A >= 1 && B >= 1\n")
    assert [tuple(s.values()) for s in space.settings()] == [(1, 1), (1, 2), (2, 1)]


def test_define_flags():
    assert define_flags({"UNROLL": 4, "BLOCK": 128, "SCALE": 0.5}) == [
        "-DBLOCK=128", "-DSCALE=0.5", "-DUNROLL=4"]
    assert define_flags({}) == []


@pytest.mark.parametrize("params", [
    {"1BAD": 1}, {"A B": 1}, {"A;rm -rf /": 1}, {"": 1}, {"X=1 -DY": 2},
])
def test_define_flags_rejects_bad_names(params):
    with pytest.raises(ValueError, match="bad parameter name"):
        define_flags(params)


@pytest.mark.parametrize("value", ["4", "4 -DEVIL=1", None, True, [1]])
def test_define_flags_rejects_bad_values(value):
    with pytest.raises(ValueError, match="must be a number"):
        define_flags({"BLOCK": value})


def test_normalize_ignores_comments_and_whitespace():
    a = "// @kf.param B in [1, 2]\nint f(int x) {\n    return x + 1; // add one\n}\n"
    b = "// @kf.param B in [1, 2]\n/* header */\nint f(int x)   {  return x + 1;\n\n}"
    assert normalize(a) == normalize(b)
    assert "add one" not in normalize(a) and "header" not in normalize(b)
    assert normalize(a) != normalize(a.replace("x + 1", "x + 2"))


def test_normalize_keeps_param_lines():
    a = "// @kf.param B in [1, 2]\nint f();"
    b = "// @kf.param B in [1, 2, 4]\nint f();"
    assert "@kf.param B in [1, 2]" in normalize(a)
    assert normalize(a) != normalize(b)
    assert normalize(a) != normalize("int f();")


def test_source_hash():
    assert source_hash(SRC, {"BLOCK": 64}) == source_hash(SRC + "\n// trailing comment\n", {"BLOCK": 64})
    assert source_hash(SRC, {"BLOCK": 64}) != source_hash(SRC, {"BLOCK": 128})
    assert source_hash(SRC, {"BLOCK": 64, "UNROLL": 1}) == source_hash(SRC, {"UNROLL": 1, "BLOCK": 64})
    assert source_hash(SRC) == source_hash(SRC, {})
    assert source_hash(SRC) != source_hash(SRC.replace("return 0", "return 1"))


def test_safe_eval_arithmetic():
    env = {"A": 6, "B": 4}
    assert safe_eval("A * B + 1", env) == 25
    assert safe_eval("A // B", env) == 1 and safe_eval("A % B", env) == 2
    assert safe_eval("-A + 2 ** 3", env) == 2
    assert safe_eval("A > B and not B > A", env) is True
    assert safe_eval("1 < B < A", env) is True
    assert safe_eval("1 < A < B", env) is False
    assert safe_eval("max(A, B) - min(A, B)", env) == 2


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')",
    "open('/etc/passwd')",
    "A.__class__",
    "A.bit_length()",
    "(lambda: 1)()",
    "[A][0]",
    "'x' * 3",
    "A if B else 0",
    "abs(A)",
    "pow(A, B)",
    "eval('1')",
])
def test_safe_eval_rejects_non_arithmetic(expr):
    with pytest.raises(ValueError):
        safe_eval(expr, {"A": 1, "B": 2})


def test_safe_eval_unknown_name_and_syntax():
    with pytest.raises(ValueError, match="unknown name 'C'"):
        safe_eval("C + 1", {"A": 1})
    with pytest.raises(ValueError, match="cannot parse"):
        safe_eval("A +* 2", {"A": 1})


# ---------------------------------------------------------------- config

def _yaml(tmp_path, text, name="run.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults():
    cfg = load_config()
    assert isinstance(cfg, RunConfig)
    assert cfg.tasks == ["axpb", "softmax", "matmul"]
    assert cfg.search.islands == 4 and cfg.search.topology == "ring"
    assert cfg.eval.backend == "cpu" and cfg.proposer.kind == "offline"
    assert cfg.to_dict()["search"]["min_gain"] == 0.02


def test_yaml_values(tmp_path):
    p = _yaml(tmp_path, "tasks: [matmul]\nsearch:\n  islands: 2\n  min_gain: 0.05\n"
                        "  topology: full\neval:\n  timeout_s: 10\n  flags: [-O3]\n")
    cfg = load_config(p)
    assert cfg.tasks == ["matmul"]
    assert cfg.search.islands == 2 and cfg.search.min_gain == 0.05
    assert cfg.search.topology == "full"
    assert cfg.eval.timeout_s == 10.0 and isinstance(cfg.eval.timeout_s, float)   # int accepted as float
    assert cfg.eval.flags == ["-O3"]
    defaults = RunConfig()
    assert cfg.search.budget == defaults.search.budget            # untouched keys keep their defaults
    assert cfg.eval.backend == defaults.eval.backend == "cpu"


def test_empty_yaml_gives_defaults(tmp_path):
    assert load_config(_yaml(tmp_path, "")) == RunConfig()


def test_set_overrides_with_yaml_typed_values(tmp_path):
    p = _yaml(tmp_path, "search:\n  islands: 2\n")
    cfg = load_config(p, ["search.islands=6", "search.explore=0.5", "tasks=[axpb, softmax]",
                          "proposer.kind=llm", "eval.flags=[-O3, -march=native]",
                          "search.adjacency=[[1], [0]]", "run_dir=/tmp/x"])
    assert cfg.search.islands == 6 and isinstance(cfg.search.islands, int)
    assert cfg.search.explore == 0.5
    assert cfg.tasks == ["axpb", "softmax"]
    assert cfg.proposer.kind == "llm"
    assert cfg.eval.flags == ["-O3", "-march=native"]
    assert cfg.search.adjacency == [[1], [0]]
    assert cfg.run_dir == "/tmp/x"


def test_later_override_wins():
    cfg = load_config(None, ["search.batch=3", "search.batch=5"])
    assert cfg.search.batch == 5


def test_parse_override():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("x=[1, 2]") == (["x"], [1, 2])
    assert parse_override("x=") == (["x"], "")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("search.islands")


def test_unknown_key_names_key_and_file(tmp_path):
    p = _yaml(tmp_path, "search:\n  islandz: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "search.islandz" in str(e.value) and str(p) in str(e.value)
    assert "islands" in str(e.value)               # lists the known keys


def test_unknown_top_level_key(tmp_path):
    p = _yaml(tmp_path, "searh:\n  islands: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'searh'"):
        load_config(p)


def test_unknown_key_in_override():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["eval.bakend=cuda"])
    assert "eval.bakend" in str(e.value) and "--set" in str(e.value)


@pytest.mark.parametrize("text,key", [
    ("search:\n  islands: two\n", "search.islands"),
    ("search:\n  islands: 2.5\n", "search.islands"),
    ("search:\n  min_gain: fast\n", "search.min_gain"),
    ("eval:\n  backend: 3\n", "eval.backend"),
    ("tasks: axpb\n", "tasks"),
    ("search: 4\n", "search"),
])
def test_wrong_type(tmp_path, text, key):
    p = _yaml(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert key in str(e.value) and str(p) in str(e.value)


def test_wrong_type_in_override():
    with pytest.raises(ConfigError, match="search.islands"):
        load_config(None, ["search.islands=many"])


def test_bad_choice_for_backend(tmp_path):
    p = _yaml(tmp_path, "eval:\n  backend: rocm\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "eval.backend" in msg and "rocm" in msg and "cuda" in msg and str(p) in msg
    with pytest.raises(ConfigError, match="eval.backend"):
        load_config(None, ["eval.backend=opencl"])


def test_out_of_range_values(tmp_path):
    with pytest.raises(ConfigError, match="search.islands"):
        load_config(_yaml(tmp_path, "search:\n  islands: 0\n"))
    with pytest.raises(ConfigError, match="search.adjacency"):
        load_config(None, ["search.topology=custom", "search.islands=2"])


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = _yaml(tmp_path, "search:\n  islands: 2\n  batch: [1, 2\neval:\n  backend: cpu\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg
    assert "line " in msg and "not valid YAML" in msg


def test_malformed_yaml_line_number(tmp_path):
    p = _yaml(tmp_path, "tasks: [axpb]\nsearch:\n  islands: 2\n\tbatch: 3\n")   # tab on line 4
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "line 4" in str(e.value)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value) and "does not exist" in str(e.value)


def test_uncommented_keeps_the_code_the_kf_lines_and_the_literals():
    """What a model is shown with comments off: every comment gone but the @kf lines, string and
    character literals untouched, a preprocessor line still ended where its comment spanned lines,
    and code that compiles to the same tokens."""
    from kfray.source import uncommented

    src = ('#include <cstdint>\n// a note\n// @kf.param BLOCK in [64, 128]\n/* @kf.require BLOCK <= 128 */\n\n\n'
           '#define W 8 /* spans\n lines */\nconst char* url = "http://x/*y*/";  // trailing\n'
           "char q = '\"';  /* one */ int k = 1;\n")
    out = uncommented(src)
    assert "a note" not in out and "trailing" not in out and "spans" not in out and "one */" not in out
    assert "// @kf.param BLOCK in [64, 128]" in out and "@kf.require BLOCK <= 128" in out
    assert '"http://x/*y*/"' in out and "char q = '\"';" in out and "int k = 1;" in out
    assert "#define W 8\nconst char" in out and "\n\n\n" not in out
    assert parse_params(out) == parse_params(src)
    raw = 'const char* s = R"(// not a comment)"; // one\n'
    assert uncommented(raw) == raw                   # a raw string: shown as written
