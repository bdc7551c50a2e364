"""The project rule "bad input gets a clear error and a non-zero exit, never a traceback" on
many more mutated files than the suite can afford, for the input files other than instances.

tests/test_input_fuzz.py mutates the shipped instances (about 300 seeds per run of the suite).
This mutates, under seeds of your choice, the other files a user writes or passes:

- ``sweep``: the ``[sweep]``, ``[plot]`` and ``base`` of a small sweep (``plan sweep``);
- ``hf``: Hugging Face ``config.json`` files, the three in tests/data/hf and the four family
  configs of tests/test_hf_families.py and tests/test_hf_config.py (top-level keys and, for a
  multimodal wrapper, its ``text_config``), through ``plan solve --solver enumerate``;
- ``runs``: one run of the shipped published runs, its model, plan or training keys
  (``plan validate FILE --no-ranking``);
- ``alternatives``: one set of the shipped measured alternatives (``plan validate
  --alternatives``);
- ``flags``: random ``plan evaluate`` flags on the shipped instances;
- ``emit``: a shipped instance on another GPU type, cluster size, precision, batch or
  framework, or with the hf kind's model of another family, solved and exported (``plan
  solve --emit FMT``, or one of its best four plans by ``plan evaluate --emit FMT``): on
  exit 0 the export must be a file its framework reads (JSON, TOML, YAML, Megatron-LM
  argument lines) with the degrees of the plan it names.

Each case must end with exit 0, 2, 3 or 4, no exception but SystemExit, no traceback in the
output, and under ``--json`` a JSON document on stdout. A failure is printed with its seed and
mutations (the same seed draws the same case at the same commit). Found this way and fixed on
2026-12-07: a sweep case that was not a table, four Hugging Face configs (a ``model_type``
that was not a string, at the top and on a wrapper; a DeepSeek ``first_k_dense_replace`` and
a Llama 4 ``moe_layers`` of the wrong type), and messages that quoted values as Python does.

Usage: python tools/fuzz_files.py KIND [N] [--seed S] [--show]
(``--show`` prints every exit-2 message too, to read them.) Exit status 1 on any failure.
About 10-50 ms per case, more for the mutated files that stay valid and are solved.
"""

from __future__ import annotations

import argparse
import copy
import functools
import glob
import json
import random
import re
import sys
import tempfile
import tomllib
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from typer.testing import CliRunner  # noqa: E402

from planner.app.cli import app  # noqa: E402
from test_input_fuzz import dumps  # noqa: E402  (the suite's TOML writer: one owner)

#: values a mutation sets: wrong types, out-of-range numbers, names of other things
POOL = [0, -1, 3, 7, 0.5, 1e30, 2**63, float("nan"), True, "x", "fp8", "zip", "oom", [], {},
        [1, "a"], [[1]], {"a": 1}, [0], ["bf16"], [1, 1], [1, 2, 4]]
DATA = ROOT / "planner" / "data"


def _mutate(rng: random.Random, table: dict, where: str, extra: tuple = ()) -> str:
    """Delete, add or replace one key of ``table``; the mutation as text."""
    key = rng.choice(sorted(table) + list(extra) + ["zzz"])
    if rng.random() < 0.2 and key in table:
        del table[key]
        return f"del {where}{key}"
    table[key] = rng.choice(POOL)
    return f"{where}{key} = {table[key]!r}"


def _sweep(rng: random.Random, d: Path) -> tuple[list[str], list[str]]:
    doc = {"base": str(ROOT / "instances" / "gpt-1.3b-1node.toml"),
           "sweep": {"mode": "grid", "query": "solve", "solver": "enumerate",
                     "training.global_batch": [64, 128],
                     "cases": {"optimum": {}, "TP8": {"constraints.tp": 8}}},
           "plot": {"x": "training.global_batch", "lines": "case", "y": "time_per_sequence_s"}}
    muts = []
    for _ in range(rng.randint(1, 2)):
        r = rng.random()
        if r < 0.6:
            muts.append(_mutate(rng, doc["sweep"], "sweep.",
                                ("cluster.nodes", "model.layers", "deadline_days", "time_limit")))
        elif r < 0.8:
            muts.append(_mutate(rng, doc["plot"], "plot.", ("title", "kind")))
        elif r < 0.9 and isinstance(doc["sweep"].get("cases"), dict):
            muts.append(_mutate(rng, doc["sweep"]["cases"], "sweep.cases."))
        else:
            doc["base"] = rng.choice(["nope.toml", 3, str(ROOT / "README.md"),
                                      str(ROOT / "instances" / "sweeps" / "one-node-batch.toml")])
            muts.append(f"base = {doc['base']!r}")
    (d / "sweep.toml").write_text(dumps(doc))
    return muts, ["sweep", str(d / "sweep.toml"), "--workers", "1", "--json",
                  "--out", str(d / "out.csv")]


@functools.cache
def _data(name: str) -> dict:
    """A shipped data file, read once per process (each case deep-copies what it mutates)."""
    return tomllib.loads((DATA / name).read_text())


@functools.cache
def _hf_configs() -> dict[str, dict]:
    """The configs the hf kind mutates: tests/data/hf's files and the families' configs the
    suite writes out (GLM-4.5-Air, GLM-4.7-Flash, Llama 4 Maverick, gpt-oss-120b), read once
    per process (each case deep-copies the one it mutates)."""
    import test_hf_config
    import test_hf_families
    configs = {Path(p).name: json.loads(Path(p).read_text())
               for p in sorted(glob.glob(str(ROOT / "tests" / "data" / "hf" / "*.json")))}
    configs.update({"GLM45_AIR": test_hf_families.GLM45_AIR,
                    "GLM_LITE": test_hf_families.GLM_LITE,
                    "MAVERICK": test_hf_families.MAVERICK,
                    "GPT_OSS_120B": test_hf_config.GPT_OSS_120B})
    return configs


def _hf(rng: random.Random, d: Path) -> tuple[list[str], list[str]]:
    configs = _hf_configs()
    name = rng.choice(sorted(configs))
    top = copy.deepcopy(configs[name])
    inner = top.get("text_config")
    cfg = inner if isinstance(inner, dict) and rng.random() < 0.7 else top
    muts = [name] + [
        _mutate(rng, cfg, "", ("model_type", "head_dim", "sliding_window", "layer_types",
                               "moe_layers", "first_k_dense_replace", "mlp_only_layers"))
        for _ in range(rng.randint(1, 3))]
    (d / "config.json").write_text(json.dumps(top))
    (d / "i.toml").write_text('[model]\nhf_config = "config.json"\nseq_len = 2048\n'
                              '[training]\nglobal_batch = 64\n[cluster]\ngpu = "h100-sxm"\n'
                              'gpus = 8\n[constraints]\nmax_pp = 2\n')
    return muts, ["solve", str(d / "i.toml"), "--solver", "enumerate", "--json"]


def _runs(rng: random.Random, d: Path) -> tuple[list[str], list[str]]:
    data = _data("published_runs.toml")
    run = copy.deepcopy(rng.choice(data["runs"]))
    name = run["model"]                           # (before a mutation may change the run's)
    model = copy.deepcopy(data["models"].get(name, {}))
    muts = []
    for _ in range(rng.randint(1, 2)):
        table, where = rng.choice([(run, ""), (run.get("plan"), "plan."), (model, "model."),
                                   (run.get("training"), "training.")])
        if isinstance(table, dict) and table:
            muts.append(_mutate(rng, table, where))
    (d / "runs.toml").write_text(dumps({"models": {name: model}, "runs": [run]}))
    return muts, ["validate", str(d / "runs.toml"), "--no-ranking", "--json"]


def _alternatives(rng: random.Random, d: Path) -> tuple[list[str], list[str]]:
    sets = _data("measured_alternatives.toml")["sets"]
    one = copy.deepcopy(rng.choice(sets))
    muts = []
    for _ in range(rng.randint(1, 2)):
        r = rng.random()
        plans = one.get("plans")
        if r < 0.4 and isinstance(plans, list) and plans and isinstance(plans[0], dict):
            muts.append(_mutate(rng, rng.choice(plans), "plans[].", ("outcome", "memory_GiB")))
        elif r < 0.7:
            muts.append(_mutate(rng, one, ""))
        elif isinstance(one.get("model"), dict):
            muts.append(_mutate(rng, one["model"], "model."))
    runs = _runs(random.Random(0), d)[1][1]        # a valid runs file beside it, one run
    (d / "alt.toml").write_text(dumps({"sets": [one]}))
    return muts, ["validate", runs, "--no-ranking", "--alternatives", str(d / "alt.toml"),
                  "--json"]


def _flags(rng: random.Random, d: Path) -> tuple[list[str], list[str]]:
    ints = ["--tp", "--pp", "--dp", "--cp", "--ep", "--vp", "--micro-batch", "--global-batch",
            "--dp-shard-size", "--offload-layers", "--first-stage-layers", "--last-stage-layers",
            "--recompute-layers", "--nodes"]
    switches = ["sp", "distributed-optimizer", "reshard-after-forward", "overlap-grad-reduce",
                "tp-comm-overlap", "overlap-p2p-comm", "optimizer-offload",
                "account-for-embedding", "account-for-loss"]
    words = {"--recompute": ["none", "selective", "full", "partial"],
             "--dp-sharding": ["none", "optim", "optim_grads_params", "zero3"],
             "--pipeline-layout": ["E|t*3|L", "(t|)*8", "x|y"],
             "--emit": ["megatron", "nemo", "torchtitan", "deepspeed"]}
    args = ["evaluate", rng.choice(sorted(glob.glob(str(ROOT / "instances" / "*.toml"))))]
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.5:
            args += [rng.choice(ints), str(rng.choice([0, 1, 2, 3, 5, 8, 16, 64, 1000, 2**31]))]
        elif r < 0.8:
            args.append(rng.choice(["--", "--no-"]) + rng.choice(switches))
        else:
            key = rng.choice(sorted(words))
            args += [key, rng.choice(words[key])]
    if "--emit" not in args:
        args.append("--json")
    return args[2:], args


def _emit(rng: random.Random, d: Path) -> tuple[list[str], list[str]]:
    """A shipped fixed-size instance, or its cluster with a model of another family (the hf
    kind's configs), moved to another GPU type, cluster size, precision, sequence length,
    batch or framework, and exported in one format: its optimum (``plan solve --emit FMT``)
    or one of its best four plans as ``[plan]`` (``plan evaluate --emit FMT``). What it
    prints is checked by :func:`emitted`."""
    fixed = [p for p in sorted(glob.glob(str(ROOT / "instances" / "*.toml")))
             if "capacity" not in p and "pareto" not in p]
    base = Path(rng.choice(fixed))
    doc = tomllib.loads(base.read_text())
    doc.pop("plan", None)
    fmt = rng.choice(["megatron", "nemo", "torchtitan", "deepspeed"])
    muts = [base.name, f"--emit {fmt}"]
    cluster, training = doc.setdefault("cluster", {}), doc.setdefault("training", {})
    constraints = doc.setdefault("constraints", {})
    if rng.random() < 0.3:          # a model of another family, from its config.json
        configs = _hf_configs()
        name = rng.choice(sorted(configs))
        (d / "config.json").write_text(json.dumps(configs[name]))
        doc["model"] = {"hf_config": "config.json", "seq_len": 4096}
        for key in ("selective_recompute", "tokens"):       # (the base model's)
            training.pop(key, None)
        muts.append(f"model from {name}")
    if rng.random() < 0.6:
        cluster["gpu"] = rng.choice(["a100-80gb", "h100-sxm", "h200", "b200", "gb200",
                                     "gb300", "mi300x"])
        muts.append(f"cluster.gpu = {cluster['gpu']}")
    if rng.random() < 0.6:
        cluster.pop("nodes", None)
        cluster["gpus"] = rng.choice([8, 16, 32, 64, 72, 128, 144, 256, 512])
        muts.append(f"cluster.gpus = {cluster['gpus']}")
    if rng.random() < 0.4:
        training["precision"] = rng.choice(["bf16", "fp8", "nvfp4"])
        muts.append(f"training.precision = {training['precision']}")
        if training["precision"] == "fp8" and rng.random() < 0.5:
            training["fp8_recipe"] = rng.choice(["tensorwise", "delayed", "mxfp8"])
            muts.append(f"training.fp8_recipe = {training['fp8_recipe']}")
    if rng.random() < 0.3:
        doc.setdefault("model", {})["seq_len"] = rng.choice([2048, 8192, 32768])
        muts.append(f"model.seq_len = {doc['model']['seq_len']}")
    if rng.random() < 0.4:
        training["global_batch"] = rng.choice([64, 128, 256, 512, 1024, 2048])
        muts.append(f"training.global_batch = {training['global_batch']}")
    if rng.random() < 0.5:
        constraints["framework"] = fmt
        muts.append(f"constraints.framework = {fmt}")
    (d / "i.toml").write_text(dumps(doc))
    solve = ["solve", str(d / "i.toml"), "--solver", "enumerate"]
    if rng.random() < 0.4:          # one of the best few plans, as a [plan] plan evaluate exports
        ran = CliRunner().invoke(app, [*solve, "--top", "4", "--json"])
        if ran.exit_code == 0:
            ranked = json.loads(ran.stdout).get("top") or []
            if ranked:
                k = rng.randrange(len(ranked))
                doc["plan"] = ranked[k]["plan_spec"]
                (d / "i.toml").write_text(dumps(doc))
                muts.append(f"[plan] = plan {k + 1} of the best {len(ranked)}")
                return muts, ["evaluate", str(d / "i.toml"), "--emit", fmt]
    return muts, [*solve, "--emit", fmt]


def emitted(result, args: list[str]) -> str | None:
    """Why an export printed on exit 0 is not a file its framework reads, or None: JSON for
    DeepSpeed, TOML for torchtitan, YAML for NeMo; for Megatron-LM comments, ``export``
    lines and ``--flag [value]`` lines continued by a backslash, but for the last."""
    if result.exit_code or "--emit" not in args:
        return None
    # (the last --emit given is the one that counts, as for any repeated option)
    last = max(i for i, a in enumerate(args) if a == "--emit")
    fmt, text = args[last + 1], result.stdout
    try:
        if fmt == "deepspeed":
            json.loads(text)
        elif fmt == "torchtitan":
            tomllib.loads(text)
        elif fmt == "nemo":
            try:
                import yaml                     # (PyYAML, there with ray: an independent parser)
                yaml.safe_load(text)
            except ImportError:
                from test_emit import parse_yaml   # the suite's reader of these files
                parse_yaml(text)
    except Exception as exc:                    # (each parser's own error types)
        return f"{fmt} export does not parse: {exc}"
    if fmt == "megatron":
        lines = [x for x in text.splitlines() if x and not x.startswith(("#", "export "))]
        bad = [x for x in lines[:-1] if not (x.startswith("--") and x.endswith(" \\"))]
        if bad or not lines or not lines[-1].startswith("--") or lines[-1].endswith("\\"):
            return f"megatron export: a line that is not an argument: {(bad or lines[-1:])[:1]}"
    return degrees_differ(fmt, text)


#: where each export writes a degree or the micro-batch: the line's pattern and the value
#: where the export leaves the line out (None: it must be there)
DEGREE_LINES = {
    "megatron": {"TP": (r"^--tensor-model-parallel-size (\d+)", None),
                 "PP": (r"^--pipeline-model-parallel-size (\d+)", None),
                 "CP": (r"^--context-parallel-size (\d+)", 1),
                 "EP": (r"^--expert-model-parallel-size (\d+)", 1),
                 "mb": (r"^--micro-batch-size (\d+)", None)},
    "nemo": {"TP": (r"^ +tensor_model_parallel_size: (\d+)", None),
             "PP": (r"^ +pipeline_model_parallel_size: (\d+)", None),
             "CP": (r"^ +context_parallel_size: (\d+)", 1),
             "EP": (r"^ +expert_model_parallel_size: (\d+)", 1),
             "VP": (r"^ +virtual_pipeline_model_parallel_size: (\d+)", 1),
             "mb": (r"^ +micro_batch_size: (\d+)", None)},
    "torchtitan": {"TP": (r"^tensor_parallel_degree = (\d+)", None),
                   "PP": (r"^pipeline_parallel_degree = (\d+)", None),
                   "CP": (r"^context_parallel_degree = (\d+)", 1),
                   "EP": (r"^expert_parallel_degree = (\d+)", 1),
                   "DP": (r"^data_parallel_replicate_degree = (\d+)", 1)},
}


def degrees_differ(fmt: str, text: str) -> str | None:
    """Where an export's degrees, micro-batch and GPU count differ from the plan it names
    (``for plan TP4 PP8 DP16 EP8 mb1`` in its header, DeepSpeed's ``plan_parallelism.plan``),
    or None."""
    head = re.search(r'(TP\d+ PP\d+ DP\d+[^(\n"]*?) ?[("]', text)
    if not head:
        return f"{fmt} export names no plan"
    want = {k: int(v) for k, v in re.findall(r"([A-Z]+|mb)(\d+)", head.group(1))}
    want = {"CP": 1, "EP": 1, "VP": 1, **want}

    def num(pattern: str, default: int | None = None) -> int | None:
        m = re.search(pattern, text, re.M)
        return int(m.group(1)) if m else default
    if fmt in DEGREE_LINES:
        got = {k: num(p, dflt) for k, (p, dflt) in DEGREE_LINES[fmt].items()}
        if fmt == "torchtitan":         # (replicas x shards, both written out)
            got["DP"] = got["DP"] * num(r"^data_parallel_shard_degree = (\d+)", 1)
        if fmt == "megatron" and "--pipeline-model-parallel-layout" not in text:
            # (a layout string derives vp; otherwise chunks per rank, or layers per chunk)
            per = num(r"^--num-layers-per-virtual-pipeline-stage (\d+)")
            got["VP"] = num(r"^--num-virtual-stages-per-pipeline-rank (\d+)") or (
                num(r"^--num-layers (\d+)") // (got["PP"] * per) if per else 1)
        world = (num(r"^ +num_nodes: (\d+)", 0) * num(r"^ +devices: (\d+)", 0)
                 if fmt == "nemo" else
                 num(r"--nnodes (\d+)", 0) * num(r"--nproc-per-node (\d+)", 0))
    else:
        par = json.loads(text).get("plan_parallelism", {})
        got = {"TP": par.get("tensor"), "PP": par.get("pipeline"), "DP": par.get("data"),
               "CP": par.get("context", 1), "EP": par.get("expert", 1)}
        world = None
    off = {k: (want.get(k), v) for k, v in got.items() if v != want.get(k)}
    gpus = want["TP"] * want["PP"] * want["DP"] * want["CP"]
    if world is not None and world != gpus:
        off["GPUs"] = (gpus, world)
    return f"{fmt} export differs from its plan (plan, export): {off}" if off else None


KINDS = {"sweep": _sweep, "hf": _hf, "runs": _runs, "alternatives": _alternatives,
         "flags": _flags, "emit": _emit}


def failure(result, args: list[str]) -> str | None:
    """Why a case breaks the rule, or None."""
    text = (result.stdout or "") + (result.stderr or "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return "uncaught " + "".join(traceback.format_exception(*result.exc_info))[-1500:]
    if "Traceback (most recent call last)" in text:
        return "a traceback in the output"
    if result.exit_code not in (0, 2, 3, 4):
        return f"exit {result.exit_code}"
    if "--emit" in args and (why := emitted(result, args)):
        return why
    if "--json" in args:
        try:
            doc = json.loads(result.stdout)
        except json.JSONDecodeError:
            return "--json: stdout is not JSON"
        if result.exit_code and isinstance(doc, dict) and doc.get("exit_code") not in (
                None, result.exit_code):
            return f"--json: exit_code {doc.get('exit_code')}, exit {result.exit_code}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("n", nargs="?", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0, help="the first seed (then seed + 1, ...)")
    ap.add_argument("--show", action="store_true", help="print every exit-2 message too")
    a = ap.parse_args()
    runner, failed = CliRunner(), 0
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(a.seed, a.seed + a.n):
            d = Path(tmp) / str(s)
            d.mkdir()
            muts, args = KINDS[a.kind](random.Random(s), d)
            result = runner.invoke(app, args)
            why = failure(result, args)
            if why:
                failed += 1
                print(f"FAIL seed {s}: {'; '.join(map(str, muts))}\n  {why}", flush=True)
            elif a.show and result.exit_code == 2:
                print(f"seed {s}: {'; '.join(map(str, muts))}\n  "
                      + " ".join((result.stderr or "").split())[:400])
    print(f"{a.kind}: {a.n} cases from seed {a.seed}, {failed} failing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
