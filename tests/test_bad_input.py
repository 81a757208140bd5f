"""Bad input: each mistake a user can make gives one clear line (what, where, how to fix), exit 2,
and no traceback. The config and task-package loaders are fuzzed: only KfrayError may escape."""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kfray.cli import main
from kfray.config import (EvalConfig, PromptConfig, ProposerConfig, RunConfig, SearchConfig, load_config,
                          parse_override)
from kfray.errors import ConfigError, KfrayError, TaskError
from kfray.tasks import load_task
from kfray.tasks.package import load_package

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """`kfray ...` in its own process, as a user runs it."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    e.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "kfray.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=str(ROOT))


def _one_clear_line(stderr: str, *needles: str) -> str:
    assert "Traceback" not in stderr and "Unhandled error" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("kfray: error:")]
    assert len(lines) == 1, stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()            # nothing listens there now
    return port


# --- configuration ----------------------------------------------------------------------------------
def test_malformed_yaml(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search:\n  islands: [2, 3\n  budget: 4\n")
    assert main(["run", str(bad)]) == 2
    _one_clear_line(capsys.readouterr().err, str(bad), "line", "is not valid YAML")


def test_unknown_key_names_the_key_the_file_and_the_known_keys(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval:\n  evaluatorz: 2\n")
    assert main(["run", str(bad)]) == 2
    _one_clear_line(capsys.readouterr().err, str(bad), "unknown key 'eval.evaluatorz'", "evaluators")


def test_wrong_type(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search:\n  islands: four\n")
    assert main(["run", str(bad)]) == 2
    _one_clear_line(capsys.readouterr().err, str(bad), "'search.islands' must be int", "'four'")


def test_wrong_type_in_a_set_override(capsys):
    assert main(["run", "--set", "eval.timeout_s=soon"]) == 2
    _one_clear_line(capsys.readouterr().err, "--set eval.timeout_s=soon", "must be float")


def test_binary_config_file(tmp_path, capsys):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"\xff\xfe\x00\x01 not yaml")
    assert main(["run", str(bad)]) == 2
    _one_clear_line(capsys.readouterr().err, str(bad), "cannot be read as a UTF-8 text file")


def test_missing_config_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    _one_clear_line(capsys.readouterr().err, "nope.yaml does not exist")


# --- tasks ------------------------------------------------------------------------------------------
def test_task_that_does_not_exist(capsys):
    assert main(["run", "--task", "softmaxx"]) == 2
    _one_clear_line(capsys.readouterr().err, "no built-in task named 'softmaxx'", "axpb, matmul, softmax")


VALID_TASK = {
    "name": "vadd",
    "description": "y = x + 1",
    "languages": ["cpp"],
    "args": [{"name": "x", "dtype": "float32", "shape": ["n"]},
             {"name": "y", "dtype": "float32", "shape": ["n"], "role": "out"},
             {"name": "n", "dtype": "int64", "value": "n"}],
    "shapes": {"small": {"n": 1024}, "big": {"n": 65536}},
    "rtol": 1e-5, "atol": 1e-6, "bytes": "8 * n", "flops": "n",
}
VALID_REF = "def reference(a):\n    return {'y': a['x'] + 1}\n"


def _package(root: Path, data, ref: str | None = VALID_REF) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.yaml").write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    if ref is not None:
        (root / "reference.py").write_text(ref)
    return root


@pytest.mark.parametrize("mutate,ref,expect", [
    (lambda d: d.update(args="x"), VALID_REF, "args: must be a non-empty list"),
    (lambda d: d["args"][0].update(dtype="f32"), VALID_REF, "args[0].dtype: unknown dtype 'f32'"),
    (lambda d: d["args"][1].pop("role"), VALID_REF, "needs at least one output tensor"),
    (lambda d: d["shapes"].update(small={"n": "many"}), VALID_REF, "shapes.small.n: must be a number"),
    (lambda d: d.update(flops="n *"), VALID_REF, "flops"),
    (lambda d: d.update(colour="red"), VALID_REF, "colour: unknown key"),
    (lambda d: None, None, "reference.py does not exist"),
    (lambda d: None, "def reference(a)\n    return a\n", "importing it failed: SyntaxError"),
    (lambda d: None, "import no_such_module_kfray\n", "importing it failed: ModuleNotFoundError"),
    (lambda d: None, "def something_else(a):\n    return a\n", "defines no function reference"),
])
def test_broken_task_package(tmp_path, capsys, mutate, ref, expect):
    data = yaml.safe_load(yaml.safe_dump(VALID_TASK))
    mutate(data)
    pkg = _package(tmp_path / "pkg", data, ref)
    with pytest.raises(TaskError) as e:
        load_package(pkg)
    assert expect in str(e.value) and str(pkg) in str(e.value)
    assert main(["run", "--task", str(pkg)]) == 2
    _one_clear_line(capsys.readouterr().err, expect)


def test_task_package_with_a_binary_task_yaml(tmp_path, capsys):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "task.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    assert main(["run", "--task", str(pkg)]) == 2
    _one_clear_line(capsys.readouterr().err, "task.yaml", "cannot be read as a UTF-8 text file")


def test_task_package_that_is_not_yaml(tmp_path, capsys):
    pkg = _package(tmp_path / "pkg", "name: [unclosed\nargs: {\n")
    assert main(["run", "--task", str(pkg)]) == 2
    _one_clear_line(capsys.readouterr().err, "task.yaml", "is not valid YAML")


# --- the compiler -----------------------------------------------------------------------------------
RUN_SMALL = ("run", "--task", "axpb", "--quiet", "--set", "search.budget=3", "--set", "search.islands=1",
             "--set", "eval.evaluators=1")


def test_missing_compiler_named_by_cxx(tmp_path):
    t0 = time.time()
    out = _cli(*RUN_SMALL, "--run-dir", str(tmp_path / "r"),
               "--set", f"eval.cache_dir={tmp_path / 'cache'}", env={"CXX": "/nonexistent/g++"})
    assert out.returncode == 2, out.stderr
    _one_clear_line(out.stderr, "CXX is set to '/nonexistent/g++'", "set CXX to a C++ compiler")
    assert time.time() - t0 < 120
    assert not (tmp_path / "r").exists(), "a run on this machine alone stops before anything starts"


def test_no_compiler_on_path(tmp_path):
    bindir = tmp_path / "bin"          # a PATH with python but no g++
    bindir.mkdir()
    os.symlink(sys.executable, bindir / "python3")
    env = {"PATH": str(bindir), "CXX": ""}
    out = _cli(*RUN_SMALL, "--run-dir", str(tmp_path / "r"), "--set", f"eval.cache_dir={tmp_path / 'cache'}",
               env=env)
    assert out.returncode == 2, out.stderr
    _one_clear_line(out.stderr, "needs g++ and none is on PATH", "apt-get install g++")
    assert not (tmp_path / "r").exists(), "a run on this machine alone stops before anything starts"


# --- the LLM endpoint -------------------------------------------------------------------------------
def test_unreachable_llm_endpoint_fails_fast_before_anything_starts(tmp_path, capsys):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    t0 = time.time()
    assert main(["run", "--task", "axpb", "--run-dir", str(tmp_path / "r"), "--set", "proposer.kind=llm",
                 "--set", f"proposer.base_url={url}", "--set", "proposer.model=m"]) == 2
    _one_clear_line(capsys.readouterr().err, f"the LLM endpoint {url} does not answer", "proposer.base_url",
                    "proposer.kind=offline")
    assert time.time() - t0 < 20
    assert not (tmp_path / "r").exists(), "nothing was started"


def test_unreachable_llm_endpoint_through_the_cli(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    out = _cli("run", "--task", "axpb", "--set", "proposer.kind=llm", "--set", f"proposer.base_url={url}",
               "--set", "proposer.model=m", "--run-dir", str(tmp_path / "r"), timeout=60)
    assert out.returncode == 2
    _one_clear_line(out.stderr, "does not answer")


def test_llm_without_a_model(monkeypatch, capsys):
    monkeypatch.delenv("KFRAY_MODEL", raising=False)
    assert main(["run", "--set", "proposer.kind=llm", "--set", "proposer.base_url=http://127.0.0.1:1/v1"]) == 2
    _one_clear_line(capsys.readouterr().err, "no model", "proposer.model")


# --- the Ray cluster --------------------------------------------------------------------------------
def test_no_ray_cluster_at_the_address(tmp_path):
    t0 = time.time()
    out = _cli("run", "--task", "axpb", "--address", "127.0.0.1:1", "--run-dir", str(tmp_path / "r"), timeout=60)
    assert out.returncode == 2
    _one_clear_line(out.stderr, "no Ray cluster at 127.0.0.1:1", "ray start --head", "RAY_AUTH_MODE=token")
    assert time.time() - t0 < 30


def test_address_that_is_not_an_address(tmp_path):
    out = _cli("run", "--address", "my-cluster", "--task", "axpb", "--run-dir", str(tmp_path / "r"), timeout=60)
    assert out.returncode == 2
    _one_clear_line(out.stderr, "'my-cluster' is not host:port")


# --- fuzzing ----------------------------------------------------------------------------------------
SECTIONS = {"search": SearchConfig, "eval": EvalConfig, "proposer": ProposerConfig, "prompts": PromptConfig}
_FIELDS = {s: [f for f in c.__dataclass_fields__] for s, c in SECTIONS.items()}

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 12, 10 ** 12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
_value = st.recursive(_scalar, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                     st.dictionaries(st.text(max_size=6), kids, max_size=3)),
                      max_leaves=8)


@st.composite
def _config_docs(draw):
    doc = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "tasks", "run_dir", "address", "bogus"]),
                                 max_size=4, unique=True)):
        if section in SECTIONS and draw(st.booleans()):
            keys = draw(st.lists(st.sampled_from(_FIELDS[section]) | st.text(max_size=6), max_size=4, unique=True))
            doc[section] = {k: draw(_value) for k in keys}
        else:
            doc[section] = draw(_value)
    return doc


def _same(have, want) -> bool:
    """Equal, NaN included (a NaN read back from YAML is a new float, and NaN != NaN)."""
    return have == want or repr(have) == repr(want)


def _assert_applied(obj, data: dict, where: str = "") -> None:
    """Every key of a mapping the loader accepted is in effect, with the value given: none was
    dropped, altered or silently accepted without a field to hold it."""
    for key, want in data.items():
        assert isinstance(key, str) and hasattr(obj, key), f"unknown key {where}{key!r} was accepted"
        have = getattr(obj, key)
        if dataclasses.is_dataclass(have):
            assert isinstance(want, dict), f"{where}{key}: a section was accepted from {want!r}"
            _assert_applied(have, want, f"{where}{key}.")
        else:
            assert _same(have, want), f"{where}{key}: loaded {have!r}, but it was given {want!r}"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_config_docs(), form=st.sampled_from(["yaml", "text", "bytes"]), junk=st.text(max_size=40),
       raw=st.binary(max_size=40))
@example(doc={"search": {"islands": 3, "explore": 0.5, "min_gain": 1}, "eval": {"timeout_s": 5, "flags": ["-O2"]},
              "tasks": ["axpb"], "run_dir": "r"}, form="yaml", junk="", raw=b"")   # loads: each key is checked
@example(doc={"search": {"islands": 2, "islandz": 3}}, form="yaml", junk="", raw=b"")    # refused, naming the file
@example(doc={}, form="text", junk="bogus: 1\n", raw=b"")
def test_fuzz_config_loader(doc, form, junk, raw):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.yaml"
        if form == "bytes":
            p.write_bytes(raw)
        else:
            p.write_text(junk if form == "text" else yaml.safe_dump(doc))
        try:
            cfg = load_config(p)
        except ConfigError as e:
            assert str(e).startswith(str(p)), f"the error does not name the file first: {e}"
            return
        data = doc if form == "yaml" else yaml.safe_load(p.read_text())
    # It loaded: the file was a mapping (or empty), and every key in it took effect.
    assert isinstance(cfg, RunConfig)
    assert isinstance(data, dict) or not data, f"a non-mapping file was accepted: {data!r}"
    _assert_applied(cfg, data or {})


@settings(max_examples=100, deadline=None)
@given(overrides=st.lists(st.text(max_size=30) | st.builds(lambda s, k, v: f"{s}.{k}={v}",
                                                           st.sampled_from(list(SECTIONS)),
                                                           st.sampled_from(sum(_FIELDS.values(), [])),
                                                           st.text(max_size=12)), max_size=3))
@example(overrides=["proposer.model=m", "search.islands=2", "eval.timeout_s=5"])    # loads: the last is checked
@example(overrides=["search={islands: 3, topology: full}"])
@example(overrides=["search.islands=2", "search.backend=cpu"])           # refused: backend is an eval key
def test_fuzz_set_overrides(overrides):
    try:
        cfg = load_config(None, overrides)
    except ConfigError as e:
        # the error names the --set at fault, or the configuration when only the whole is wrong
        culprits = tuple(f"--set {ov}" for ov in overrides) + tuple(f"--set {ov!r}" for ov in overrides)
        assert str(e).startswith(culprits + ("configuration:",)), f"the error names no culprit: {e}"
        return
    if not overrides:
        assert cfg == RunConfig()
        return
    # It loaded: the last --set is in effect as given (an earlier one of the same key is overridden).
    keys, value = parse_override(overrides[-1])
    for k in reversed(keys):
        value = {k: value}
    _assert_applied(cfg, value)


_REFS = [VALID_REF, None, "def reference(a)\n", "raise RuntimeError('boom')\n", "reference = 3\n",
         "def reference(a):\n    return 1 / 0\n"]


@st.composite
def _corrupted_packages(draw):
    data = yaml.safe_load(yaml.safe_dump(VALID_TASK))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["drop", "set", "arg", "shape", "extra"]))
        if kind == "drop" and data:
            data.pop(draw(st.sampled_from(sorted(data))))
        elif kind == "set":
            data[draw(st.sampled_from(sorted(VALID_TASK)))] = draw(_value)
        elif kind == "arg" and isinstance(data.get("args"), list) and data["args"]:
            i = draw(st.integers(0, len(data["args"]) - 1))
            if isinstance(data["args"][i], dict):
                data["args"][i][draw(st.sampled_from(["name", "dtype", "shape", "role", "value", "x"]))] = draw(_value)
            else:
                data["args"][i] = draw(_value)
        elif kind == "shape" and isinstance(data.get("shapes"), dict):
            data["shapes"][draw(st.text(max_size=5))] = draw(_value)
        else:
            data[draw(st.text(max_size=6))] = draw(_value)
    return data


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_corrupted_packages(), ref=st.sampled_from(_REFS))
@example(data=VALID_TASK, ref=VALID_REF)                        # loads: the task is checked against it
@example(data={**VALID_TASK, "name": None}, ref=VALID_REF)     # refused: the error names the file
@example(data={**VALID_TASK, "colour": "red"}, ref=VALID_REF)
def test_fuzz_task_package_loader(data, ref):
    with tempfile.TemporaryDirectory() as d:
        pkg = _package(Path(d) / "pkg", data, ref)
        try:
            task = load_package(pkg)
        except TaskError as e:
            assert str(pkg) in str(e), f"the error does not name the package's file: {e}"
            return
    # It loaded: it is the task the task.yaml describes...
    assert isinstance(data, dict)
    assert task.name == data.get("name", "pkg")
    args = data["args"] + (data.get("scalars") or [])
    assert [a.name for a in task.args] == [a["name"] for a in args]
    assert task.outputs, "a task without an output tensor loaded"
    assert set(task.shapes) == {str(k) for k in data["shapes"]} and task.shapes   # (safe_dump sorts keys)
    for key, default in (("rtol", 1e-4), ("atol", 1e-5), ("input_scale", 1.0)):
        have = task.input_scale if key == "input_scale" else getattr(task, key)
        assert _same(have, float(data.get(key, default))), f"{key}: loaded {have!r}, task.yaml says {data.get(key)!r}"
    # ...and its shapes and cost model are usable too: the loader checked every cost expression.
    for shape in task.shapes:
        b, f = task.cost(shape)
        assert isinstance(b, float) and isinstance(f, float)


@pytest.mark.parametrize("override,words", [
    ("eval.timeout_s=.nan", ["eval.timeout_s", "finite"]),
    ("search.explore=.inf", ["search.explore", "finite"]),
    ("sea\nrch.islands=2", ["unknown key", "'sea\\nrch'"]),
])
def test_a_bad_override_is_refused_in_one_line(override, words):
    from kfray.config import load_config
    from kfray.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
