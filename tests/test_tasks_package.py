"""Task packages: loading, clear errors naming the file and field, evolve regions, the sandbox reload."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.errors import TaskError
from kfray.source import parse_params
from kfray.tasks import discover, load_task
from kfray.tasks.package import load_package, splice_region, split_region

DATA = Path(__file__).parent / "data" / "packages"


def _copy(tmp_path, name="vscale") -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst


def _edit_yaml(pkg: Path, old: str, new: str):
    y = pkg / "task.yaml"
    text = y.read_text()
    assert old in text
    y.write_text(text.replace(old, new))


def test_package_loads_with_seeds_languages_and_evolve_region():
    t = load_task(str(DATA / "vscale"))
    assert t.name == "vscale" and t.ref == str(DATA / "vscale")
    assert [a.name for a in t.args] == ["x", "y", "alpha", "n"]
    assert t.signature("cpp") == 'extern "C" int kf_forward(const float* x, float* y, float alpha, int64_t n)'
    assert t.languages == ["cpp", "cuda"]
    assert [s.name for s in t.seeds_for("cpp")] == ["naive", "simd"]       # naive first: the baseline
    assert "alpha * x[i + u]" in t.evolve_region("cpp") and "KF-EVOLVE" not in t.evolve_region("cpp")
    assert "KF-EVOLVE-BEGIN" in t.instructions and "tail loop" in t.instructions
    for shape in t.shapes:          # the bytes moved are the arrays' own (x read, y written), a flop per element
        arrays = [v for v in t.make_args(shape, np.random.default_rng(0)).values() if isinstance(v, np.ndarray)]
        assert t.cost(shape) == (sum(v.nbytes for v in arrays), arrays[0].size), shape
    a = t.make_args("n100k", np.random.default_rng(1))
    assert np.allclose(t.run_reference(a)["y"], np.float32(a["alpha"]) * a["x"])


def test_every_ref_form_reaches_the_same_package():
    p = DATA / "rowmax"
    for ref in (str(p), f"package:{p}", str(p / "task.yaml")):
        t = load_task(ref)
        assert t.name == "rowmax" and t.ref == ref and list(t.shapes) == ["r256c512", "r1000c77"]


def test_discover_lists_the_packages_folder():
    found = dict(discover(str(DATA)))
    assert sorted(Path(r.split(":", 1)[1]).name for r in found) == ["rowmax", "square_wrong", "vscale"]
    assert all(e is None for e in found.values())


@pytest.mark.parametrize("old,new,expect", [
    ("dtype: float32, shape: [n], role: out", "dtype: f32, shape: [n], role: out",
     "task.yaml: args[1].dtype: unknown dtype 'f32' (known: float32, float64, int32, int64, bool)"),
    ("shape: [n]}", "shape: [m]}", "task.yaml: args[0].shape[0]: unknown name 'm'"),
    ("rtol: 1.0e-5", "rtol: tight", "task.yaml: rtol: must be a number"),
    ("flops: n", "flops: n\nflopz: 3", "task.yaml: flopz: unknown key"),
    ("role: out}", "role: inout}", "task.yaml: args[1].role: must be 'in' or 'out'"),
    ("bytes: 8 * n", "bytes: 8 * nn", "task.yaml: bytes: unknown name 'nn'"),
    ("  n64k: {n: 65536}", "  n64k: {n: -4}", "args[0].shape[0]: 'n' is -4"),
    ("languages: [cpp, cuda]", "languages: [cpp, fortran]", "task.yaml: languages[1]: unknown language 'fortran'"),
    ("{name: alpha, dtype: float32}", "{name: x, dtype: float32}", "task.yaml: args: duplicate argument name(s) x"),
])
def test_bad_task_yaml_names_file_and_field(tmp_path, old, new, expect):
    pkg = _copy(tmp_path)
    _edit_yaml(pkg, old, new)
    with pytest.raises(TaskError) as e:
        load_package(pkg)
    assert expect in str(e.value) and str(pkg / "task.yaml") in str(e.value)


def test_bad_yaml_syntax_missing_reference_and_broken_seed(tmp_path):
    pkg = _copy(tmp_path)
    (pkg / "task.yaml").write_text("name: [unclosed\n")
    with pytest.raises(TaskError, match=r"task.yaml: line \d+, column \d+ is not valid YAML"):
        load_package(pkg)

    pkg = _copy(tmp_path, "rowmax")
    (pkg / "reference.py").unlink()
    with pytest.raises(TaskError, match="reference: .*reference.py does not exist"):
        load_package(pkg)
    (pkg / "reference.py").write_text("def other(args):\n    return {}\n")
    with pytest.raises(TaskError, match="reference.py: defines no function reference"):
        load_package(pkg)
    (pkg / "reference.py").write_text("import nosuchmodule_kf\n")
    with pytest.raises(TaskError, match="reference.py: importing it failed: ModuleNotFoundError"):
        load_package(pkg)

    pkg = tmp_path / "v2"
    shutil.copytree(DATA / "vscale", pkg)
    seed = pkg / "seeds" / "cpp_naive.cpp"
    seed.write_text(seed.read_text().replace("// KF-EVOLVE-END\n", ""))
    with pytest.raises(TaskError, match=r"cpp_naive.cpp: needs exactly one KF-EVOLVE-BEGIN line"):
        load_package(pkg)


def test_not_a_package_and_unknown_paths_say_so(tmp_path):
    with pytest.raises(TaskError, match="a folder, but not a task"):
        load_task(str(tmp_path))
    with pytest.raises(TaskError, match="no built-in task named"):
        load_task(str(tmp_path / "nothing" / "here"))
    with pytest.raises(TaskError, match="has no shape set 'gpu'"):
        load_task(str(DATA / "rowmax") + "@gpu")


def test_split_and_splice_region():
    src = "a\n// KF-EVOLVE-BEGIN\nold();\n// KF-EVOLVE-END\nb\n"
    before, region, after = split_region(src)
    assert region == "old();\n" and before.endswith("BEGIN\n") and after.startswith("// KF-EVOLVE-END")
    assert splice_region(src, "new();") == "a\n// KF-EVOLVE-BEGIN\nnew();\n// KF-EVOLVE-END\nb\n"
    assert split_region("no markers") is None


def test_package_seed_is_correct_through_the_sandbox(tmp_path):
    """The sandbox worker reloads the task from its ref (the path): the whole route works."""
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path / "cache"), timeout_s=30))
    try:
        for name, strategies in (("vscale", ["naive", "simd"]), ("rowmax", ["naive"])):
            ref = f"package:{DATA / name}"
            seeds = load_task(ref).seeds_for("cpp")
            assert [s.name for s in seeds] == strategies, f"{name}: the seeds in its seeds/ folder"
            for seed in seeds:
                c = Candidate(task=ref, language="cpp", source=seed.source,
                              params=parse_params(seed.source).default())
                r = EvalResult.from_dict(ev.evaluate(c))
                assert r.tier == 5, f"{name}/{seed.name}: {r.reason}"
                assert set(r.times) == set(load_task(ref).shapes)
        ref = f"package:{DATA / 'square_wrong'}"
        seed = load_task(ref).seeds[0]
        r = EvalResult.from_dict(ev.evaluate(Candidate(task=ref, language="cpp", source=seed.source,
                                                       params={"UNROLL": 1})))
        assert r.tier == 4 and "output y" in r.reason
    finally:
        ev.shutdown()


def test_kfray_run_takes_a_package_path(ray_local, tmp_path, tmp_cache, capsys):
    import json

    from kfray.cli import main

    pkg = _copy(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["run", "--task", str(pkg), "--run-dir", str(run_dir), "--quiet",
                 "--set", "search.islands=1", "--set", "search.budget=4", "--set", "search.retime_top=0", "--set", "eval.evaluators=1",
                 "--set", "eval.tune_budget=0", "--set", f"eval.cache_dir={tmp_cache}"]) == 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["tasks"][str(pkg)]["correct"] and s["tasks"][str(pkg)]["evaluated"] >= 2
