"""Task packages: a folder a user writes to bring an operator of their own.

    mytask/
      task.yaml          name, languages, args, shapes, tolerances, cost model, instructions
      reference.py       def reference(args) -> dict of outputs (numpy; torch tensors also accepted)
      seeds/             optional: <lang>_<strategy>.<ext>, e.g. cpp_naive.cpp, cuda_tiled.cu
      instructions.md    optional free text for the prompt (or `instructions:` in task.yaml)

task.yaml:

    name: rmsnorm
    description: RMSNorm over the last dimension
    languages: [cuda, cpp]
    args:                                  # kernel argument order
      - {name: x, dtype: float32, shape: [rows, cols]}          # role defaults to in
      - {name: w, dtype: float32, shape: [cols]}
      - {name: y, dtype: float32, shape: [rows, cols], role: out}
      - {name: rows, dtype: int64, value: rows}                 # no shape: a scalar
      - {name: eps, dtype: float32, value: 1.0e-5}
    shapes: {small: {rows: 64, cols: 512}, big: {rows: 4096, cols: 2048}}
    shape_sets: {gpu: {...}}               # optional, picked with `PATH@gpu`
    rtol: 1.0e-4
    atol: 1.0e-5
    bytes: 4 * (2 * rows * cols + cols)    # expressions over a shape config
    flops: 4 * rows * cols
    input_scale: 1.0
    seeds: [cpp_naive.cpp]                 # optional order; default: every file in seeds/, naive first

A seed may mark the part the search should rewrite with `KF-EVOLVE-BEGIN` / `KF-EVOLVE-END`
comment lines; the task then carries that region and tells the prompt to keep the rest verbatim.
Every error names the file and the field, e.g. `foo/task.yaml: args[1].dtype: unknown dtype 'f32'`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kfray.errors import TaskError
from kfray.source import safe_eval
from kfray.tasks.base import C_TYPES, Scalar, Seed, Task, Tensor

LANGUAGES = {"cpp": (".cpp", ".cc", ".cxx"), "cuda": (".cu",), "sycl": (".cpp",), "opencl": (".cl",)}
TOP_KEYS = {"name", "description", "languages", "args", "scalars", "shapes", "shape_sets", "rtol", "atol",
            "bytes", "flops", "input_scale", "instructions", "reference", "seeds", "tags"}
ARG_KEYS = {"name", "dtype", "shape", "role", "value"}
BEGIN, END = "KF-EVOLVE-BEGIN", "KF-EVOLVE-END"
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")
_C_WORDS = {"int", "float", "double", "char", "long", "short", "void", "const", "return", "if", "else", "for",
            "while", "do", "struct", "class", "auto", "new", "delete", "this", "stream", "queue"}


@dataclass
class PackageTask(Task):
    """A Task from a folder: also knows its declared languages, folder and seed evolve regions."""

    declared_languages: list[str] = field(default_factory=list)
    root: str = ""
    regions: dict[str, str] = field(default_factory=dict)   # "lang:strategy" -> text between the markers

    @property
    def languages(self) -> list[str]:
        return sorted(set(self.declared_languages) | {s.language for s in self.seeds})

    def evolve_region(self, language: str) -> str:
        """The rewritable region of the language's baseline seed ('' when the seed marks none)."""
        seed = self.baseline_seed(language)
        return self.regions.get(f"{language}:{seed.name}", "") if seed else ""


def split_region(source: str, where: str = "seed") -> tuple[str, str, str] | None:
    """(before, region, after) around the KF-EVOLVE markers, marker lines kept in before/after;
    None when the source has no markers. Unbalanced markers are a TaskError naming `where`."""
    lines = source.splitlines(keepends=True)
    b = [i for i, ln in enumerate(lines) if BEGIN in ln]
    e = [i for i, ln in enumerate(lines) if END in ln]
    if not b and not e:
        return None
    if len(b) != 1 or len(e) != 1 or e[0] < b[0]:
        raise TaskError(f"{where}: needs exactly one {BEGIN} line followed by one {END} line "
                        f"(found {len(b)} BEGIN, {len(e)} END)")
    return "".join(lines[:b[0] + 1]), "".join(lines[b[0] + 1:e[0]]), "".join(lines[e[0]:])


def splice_region(seed_source: str, new_region: str) -> str:
    """The seed with its evolve region replaced (for proposers that write only the region)."""
    parts = split_region(seed_source)
    if parts is None:
        return new_region
    before, _, after = parts
    return before + new_region.rstrip("\n") + "\n" + after


def import_file(path: str | Path, what: str = "module"):
    """Import a Python file by path under a unique module name; errors name the file."""
    path = Path(path)
    name = "kfray_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12] + "_" + \
        re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskError(f"{path}: cannot be imported as a Python {what}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod     # registered, as an import would: torch.compile looks its globals up there
    try:
        spec.loader.exec_module(mod)
    except TaskError:
        sys.modules.pop(name, None)
        raise
    except Exception as e:  # the user's file: any error is theirs to fix, say which and where
        sys.modules.pop(name, None)
        raise TaskError(f"{path}: importing it failed: {type(e).__name__}: {e}") from None
    return mod


def _to_numpy(v):
    if hasattr(v, "detach"):          # a torch tensor
        return v.detach().cpu().numpy()
    return np.asarray(v)


class _Checker:
    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, msg: str):
        raise TaskError(f"{self.where}: {key}: {msg}" if key else f"{self.where}: {msg}")

    def expr(self, key: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(key, f"must be a number or an expression string, got {type(value).__name__} {value!r}")
        return str(value)

    def number(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"must be a number, got {value!r}")
        return float(value)


def _shape_table(ck: _Checker, key: str, data: Any) -> dict[str, dict[str, int]]:
    if not isinstance(data, dict) or not data:
        ck.fail(key, "must be a non-empty mapping of shape config name -> {size name: integer}")
    out = {}
    for cname, sizes in data.items():
        if not isinstance(sizes, dict):
            ck.fail(f"{key}.{cname}", f"must be a mapping of size name -> number, got {sizes!r}")
        for k, v in sizes.items():
            if not isinstance(k, str) or not _IDENT.match(k):
                ck.fail(f"{key}.{cname}", f"size name {k!r} is not an identifier")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                ck.fail(f"{key}.{cname}.{k}", f"must be a number, got {v!r}")
        out[str(cname)] = dict(sizes)
    return out


def _parse_args(ck: _Checker, data: dict) -> list[Tensor | Scalar]:
    raw = data.get("args")
    if not isinstance(raw, list) or not raw:
        ck.fail("args", "must be a non-empty list of arguments in kernel order")
    extra = data.get("scalars") or []
    if not isinstance(extra, list):
        ck.fail("scalars", "must be a list")
    args: list[Tensor | Scalar] = []
    for idx, a in enumerate(list(raw) + list(extra)):
        key = f"args[{idx}]" if idx < len(raw) else f"scalars[{idx - len(raw)}]"
        if not isinstance(a, dict):
            ck.fail(key, f"must be a mapping like {{name: x, dtype: float32, shape: [n]}}, got {a!r}")
        unknown = set(a) - ARG_KEYS
        if unknown:
            ck.fail(key, f"unknown key(s) {', '.join(sorted(map(str, unknown)))} (known: {', '.join(sorted(ARG_KEYS))})")
        name = a.get("name")
        if not isinstance(name, str) or not _IDENT.match(name) or name in _C_WORDS:
            ck.fail(f"{key}.name", f"must be a C identifier that is not a keyword, got {name!r}")
        dtype = a.get("dtype")
        if not isinstance(dtype, str) or dtype not in C_TYPES:
            ck.fail(f"{key}.dtype", f"unknown dtype {dtype!r} (known: {', '.join(C_TYPES)})")
        if "shape" in a:
            shape = a["shape"]
            if not isinstance(shape, list):
                ck.fail(f"{key}.shape", f"must be a list of size expressions, got {shape!r}")
            role = a.get("role", "in")
            if role not in ("in", "out"):
                ck.fail(f"{key}.role", f"must be 'in' or 'out', got {role!r}")
            if "value" in a:
                ck.fail(f"{key}.value", "only scalars (arguments without a shape) take a value")
            args.append(Tensor(name, dtype, tuple(ck.expr(f"{key}.shape[{i}]", e) for i, e in enumerate(shape)),
                               role))
        else:
            if "role" in a and a["role"] != "in":
                ck.fail(f"{key}.role", "a scalar (no shape) can only be an input")
            v = a.get("value")
            args.append(Scalar(name, dtype, None if v is None else ck.expr(f"{key}.value", v)))
    names = [a.name for a in args]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        ck.fail("args", f"duplicate argument name(s) {', '.join(dup)}")
    if not any(isinstance(a, Tensor) and a.role == "out" for a in args):
        ck.fail("args", "needs at least one output tensor (role: out)")
    return args


def _check_exprs(ck: _Checker, args, shapes: dict, table_key: str, costs: dict[str, str]):
    for cname, cfg in shapes.items():
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                for j, e in enumerate(a.shape):
                    try:
                        d = safe_eval(e, cfg)
                    except ValueError as err:
                        ck.fail(f"args[{i}].shape[{j}]", f"{err} (shape config {table_key}.{cname})")
                    if not isinstance(d, (int, float)) or d < 0 or int(d) != d:
                        ck.fail(f"args[{i}].shape[{j}]", f"{e!r} is {d!r} on shape config {table_key}.{cname}; "
                                                          f"sizes must be non-negative integers")
            elif a.value is not None:
                try:
                    safe_eval(str(a.value), cfg)
                except ValueError as err:
                    ck.fail(f"args[{i}].value", f"{err} (shape config {table_key}.{cname})")
        for k, e in costs.items():
            try:
                safe_eval(e, cfg)
            except ValueError as err:
                ck.fail(k, f"{err} (shape config {table_key}.{cname})")


def _seed_lang(fname: str, languages: list[str]) -> tuple[str, str] | None:
    stem, dot, ext = fname.partition(".")
    lang, _, strategy = stem.partition("_")
    if lang in LANGUAGES and "." + ext in LANGUAGES[lang] and strategy:
        return lang, strategy
    return None


def _load_seeds(ck: _Checker, root: Path, data: dict, languages: list[str]) -> tuple[list[Seed], dict[str, str]]:
    sdir = root / "seeds"
    listed = data.get("seeds")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(s, str) for s in listed):
            ck.fail("seeds", f"must be a list of file names under seeds/, got {listed!r}")
        files = listed
    else:
        files = sorted(p.name for p in sdir.iterdir() if p.is_file()) if sdir.is_dir() else []
        files = sorted(files, key=lambda n: (0 if "_naive" in n else 1, n))   # the naive seed is the baseline
    seeds, regions = [], {}
    for i, fname in enumerate(files):
        path = sdir / fname
        ls = _seed_lang(fname, languages)
        if ls is None:
            if listed is None:
                continue   # not a seed: README, headers...
            ck.fail(f"seeds[{i}]", f"{fname!r} must be named <lang>_<strategy>.<ext> with lang one of "
                                   f"{', '.join(LANGUAGES)} (e.g. cpp_naive.cpp, cuda_tiled.cu)")
        if not path.is_file():
            ck.fail(f"seeds[{i}]", f"{path} does not exist")
        try:
            src = path.read_text()
        except (UnicodeDecodeError, OSError) as e:
            raise TaskError(f"{path}: cannot be read as a UTF-8 text file ({type(e).__name__})") from None
        if "kf_forward" not in src:
            raise TaskError(f"{path}: a seed must define extern \"C\" int kf_forward(...) (see the task's signature)")
        parts = split_region(src, str(path))
        lang, strategy = ls
        if parts is not None:
            regions[f"{lang}:{strategy}"] = parts[1]
        seeds.append(Seed(strategy, lang, src))
    return seeds, regions


def load_package(path: str | Path) -> PackageTask:
    """A Task from a package folder (or its task.yaml); every error names the file and the field."""
    root = Path(path)
    if root.is_file() and root.name in ("task.yaml", "task.yml"):
        root = root.parent
    yml = root / "task.yaml"
    if not yml.is_file():
        yml = root / "task.yml"
    if not yml.is_file():
        raise TaskError(f"{root}: not a task package (no task.yaml in it)")
    where = str(yml)
    ck = _Checker(where)
    try:
        data = yaml.safe_load(yml.read_text())
    except (UnicodeDecodeError, OSError) as e:
        raise TaskError(f"{where}: cannot be read as a UTF-8 text file ({type(e).__name__}: {e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        loc = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TaskError(f"{where}:{loc} is not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        ck.fail("", "must be a mapping with at least name, args, shapes")
    unknown = set(data) - TOP_KEYS
    if unknown:
        ck.fail(", ".join(sorted(map(str, unknown))), f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    name = data.get("name", root.name)
    if not isinstance(name, str) or not name:
        ck.fail("name", f"must be a non-empty string, got {name!r}")
    languages = data.get("languages", [])
    if isinstance(languages, str):
        languages = [languages]
    if not isinstance(languages, list):
        ck.fail("languages", f"must be a list, got {languages!r}")
    for i, lang in enumerate(languages):
        if not isinstance(lang, str) or lang not in LANGUAGES:
            ck.fail(f"languages[{i}]", f"unknown language {lang!r} (known: {', '.join(LANGUAGES)})")
    args = _parse_args(ck, data)
    if "shapes" not in data:
        ck.fail("shapes", "missing: give at least one shape config, e.g. shapes: {small: {n: 1024}}")
    shapes = _shape_table(ck, "shapes", data["shapes"])
    sets_raw = data.get("shape_sets") or {}
    if not isinstance(sets_raw, dict):
        ck.fail("shape_sets", "must be a mapping of set name -> shape configs")
    shape_sets = {str(k): _shape_table(ck, f"shape_sets.{k}", v) for k, v in sets_raw.items()}
    costs = {"bytes": ck.expr("bytes", data.get("bytes", 0)), "flops": ck.expr("flops", data.get("flops", 0))}
    _check_exprs(ck, args, shapes, "shapes", costs)
    for sname, table in shape_sets.items():
        _check_exprs(ck, args, table, f"shape_sets.{sname}", costs)
    rtol = ck.number("rtol", data.get("rtol", 1e-4))
    atol = ck.number("atol", data.get("atol", 1e-5))
    scale = ck.number("input_scale", data.get("input_scale", 1.0))
    if rtol < 0 or atol < 0:
        ck.fail("rtol/atol", "must be >= 0")

    instructions = data.get("instructions", "")
    if not isinstance(instructions, str):
        ck.fail("instructions", "must be a string")
    md = root / "instructions.md"
    if md.is_file():
        instructions = (instructions + "\n\n" + md.read_text()).strip()

    ref_spec = data.get("reference", "reference.py")
    if not isinstance(ref_spec, str):
        ck.fail("reference", f"must be 'file.py' or 'file.py:function', got {ref_spec!r}")
    ref_file, _, fn_name = ref_spec.partition(":")
    fn_name = fn_name or "reference"
    ref_path = root / ref_file
    if not ref_path.is_file():
        ck.fail("reference", f"{ref_path} does not exist (write a reference.py with def {fn_name}(args) -> dict)")
    mod = import_file(ref_path, "reference")
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise TaskError(f"{ref_path}: defines no function {fn_name}(args) -> dict of outputs")
    out_names = [a.name for a in args if isinstance(a, Tensor) and a.role == "out"]

    def reference(a: dict[str, Any], _fn=fn, _path=str(ref_path)) -> dict[str, np.ndarray]:
        res = _fn(a)
        if not isinstance(res, dict):
            if len(out_names) == 1:
                res = {out_names[0]: res}
            else:
                raise TaskError(f"{_path}: {fn_name} must return a dict with keys {out_names}, got {type(res).__name__}")
        missing = [n for n in out_names if n not in res]
        if missing:
            raise TaskError(f"{_path}: {fn_name} returned no {', '.join(missing)} (it returned {sorted(res)})")
        return {k: _to_numpy(v) for k, v in res.items()}

    seeds, regions = _load_seeds(ck, root, data, languages)
    for s in seeds:
        if languages and s.language not in languages:
            raise TaskError(f"{root / 'seeds'}: seed {s.language}_{s.name} is in language {s.language!r}, "
                            f"which {where} does not list in languages ({', '.join(languages)})")
    if regions:
        instructions = (instructions + "\n\n" if instructions else "") + (
            f"The seed kernel marks the part to rewrite between the comment lines `{BEGIN}` and `{END}`; "
            f"rewrite that part and keep the code outside it as it is.")
    task = PackageTask(
        name=name, description=str(data.get("description", name)).strip(), args=args, shapes=shapes,
        reference=reference, rtol=rtol, atol=atol, bytes_moved=costs["bytes"], flops=costs["flops"],
        seeds=seeds, ref="", input_scale=scale, instructions=instructions, shape_sets=shape_sets,
        declared_languages=list(languages), root=str(root.resolve()), regions=regions)
    return task


def is_package(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / "task.yaml").is_file() or (p / "task.yml").is_file())
