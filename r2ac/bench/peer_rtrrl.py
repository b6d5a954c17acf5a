"""r2ac's streaming agent beside RTRRL (AAAI-25, JAX) on one CPU: steps/s wall and per CPU-second.

    r2ac bench peer-rtrrl [--pairs 3] [--long-steps 102000] [--short-steps 2000]
        [--peer-long-steps 1002000] [--length 32] [--cpu 0] [--peer-src DIR] [--json-out F]
        [-- more r2ac train flags]
    r2ac bench peer-rtrrl --setup-only    # create or check the peer's venv and source only

RTRRL is no dependency of r2ac. Its code comes from `--peer-src DIR` (a checkout of
github.com/le2333/RTRRL; its code in DIR/rtrrl/) or, without it, is cloned once at the
pinned commit RTRRL_COMMIT into `--peer-cache`. Its packages live in their own venv outside
the project's (`--peer-venv`, created on first use with the pins of PEER_PACKAGES: JAX on
CPU; a minute and ~1.4 GB), where r2ac/bench/peer_rtrrl_side.py runs it.

The two systems, on MemoryChain with memory length `--length`:
- r2ac: `r2ac train stream-ac --core lru-rtrl --hidden-size 32 --stream-mlp --prev-action
  --env builtin/memory-chain --env-options length=L --num-threads 1 --no-progress
  --no-eval-at-end --total-frames N --seed S` and the flags after `--`;
- RTRRL: its default agent (`RTRRLParams()`: an LRU of 32 units, exact RTRL, shared by a
  linear actor and critic, TD(lambda) with Adam, the env stepped in a compiled `lax.scan` of
  1,000 steps) on gymnax `MemoryChain-bsuite` (memory_length L), no evaluation, N / 1,000
  scans (peer_rtrrl_side.py says exactly what is set).
The networks are close, not equal: r2ac's actor and critic each have their own core (two
LRUs of 32 reading the observation, linear heads) and learn by ObGD with normalised inputs
and rewards; RTRRL's share one LRU and learn by Adam (lr 1e-4) on accumulating traces.

Each run is pinned to one CPU (`taskset -c CPU`) with one thread: OMP/MKL threads 1, for JAX
`XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`. After
`--warmup` discarded short runs of each, `--pairs` rounds alternate the systems (r2ac, RTRRL,
r2ac, RTRRL, ...), each system's round a short run then a long one. A round's figure is
the difference of the two runs, so that start-up and compilation cancel (RTRRL's long run is
longer, `--peer-long-steps`: its 100,000 steps take ~4 s beside a ~12 s start-up that varies
by a second, its 1,000,000 ~40 s):

    steps/s wall           = (N_long - N_short) / (wall_long - wall_short)
    steps per CPU-second   = (N_long - N_short) / (cpu_long - cpu_short)

CPU time is the runs' own (user + system, the process and its children, from
`getrusage(RUSAGE_CHILDREN)`). The table gives each system's median over the rounds and the
ratio r2ac / RTRRL; the load average is printed with it. Exit status 1 if a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).with_name("peer_rtrrl_side.py")
RTRRL_URL = "https://github.com/le2333/RTRRL"
RTRRL_COMMIT = "8940918f442525fed980bc1d61632e5ade89367a"  # 2026-08-21, the measured one
# Pins that install together on Python 3.11 (RTRRL's own lock pins jax 0.5.0 and these
# majors; its code breaks on jax >= 0.6). popjym, installed from its repository there, is
# left out: the side script stands in for it (MemoryChain is gymnax's).
PEER_PACKAGES = [
    "jax==0.5.0", "jaxlib==0.5.0", "flax==0.10.4", "optax==0.2.5", "chex==0.1.90",
    "distrax==0.1.5", "tensorflow-probability==0.25.0", "gymnax==0.0.8", "brax==0.10.5",
    "mujoco==4.0.1", "mujoco-mjx==3.17.0", "gym==0.26.2", "gymnasium==1.3.0",
    "numpy==2.4.6", "scipy==1.17.1", "ml_dtypes==0.7.0", "simple-parsing==0.1.8",
    "dacite==1.9.2", "plotly==5.24.1", "pillow==12.2.0", "orbax-checkpoint==0.11.24",
    "tqdm==4.68.3",
]  # fmt: skip
SCAN_STEPS = 1000  # RTRRL's env steps per compiled scan (its `steps` default)
R2AC_NET = ["--core", "lru-rtrl", "--hidden-size", "32", "--stream-mlp", "--prev-action"]
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "JAX_PLATFORMS": "cpu",
}
SYSTEMS = ("r2ac", "rtrrl")
MAX_LENGTH = 100_000  # MemoryChain's memory length


def check_args(args) -> None:
    """ConfigError for counts out of range, step counts that do not make whole RTRRL scans
    (or leave its two compilations in the long run only), a CPU not ours, no taskset, an
    unwritable output or r2ac options that `r2ac train` refuses."""
    from r2ac.bench.options import MAX_REPEATS, MAX_STEPS, check_count, check_output
    from r2ac.errors import ConfigError, check_writable

    check_count(args.pairs, "--pairs", 1, MAX_REPEATS)
    check_count(args.warmup, "--warmup", 0, MAX_REPEATS)
    check_count(args.long_steps, "--long-steps", 2 * SCAN_STEPS + 1, MAX_STEPS)
    check_count(args.short_steps, "--short-steps", 2 * SCAN_STEPS, args.long_steps - 1)
    check_count(args.peer_long_steps, "--peer-long-steps", args.short_steps + 1, MAX_STEPS)
    check_count(args.length, "--length", 1, MAX_LENGTH)
    check_count(args.seed, "--seed", 1, 2**31 - 1)  # RTRRL draws a random seed for 0
    long_short = (("--long-steps", args.long_steps), ("--short-steps", args.short_steps),
                  ("--peer-long-steps", args.peer_long_steps))  # fmt: skip
    for option, steps in long_short:
        if steps % SCAN_STEPS:
            raise ConfigError(f"{option} must be a multiple of {SCAN_STEPS:,} (RTRRL's scan "
                              f"length), got {steps:,}")  # fmt: skip
    if args.cpu not in os.sched_getaffinity(0):
        raise ConfigError(f"--cpu {args.cpu} is not one of this process's CPUs "
                          f"{sorted(os.sched_getaffinity(0))}")  # fmt: skip
    if shutil.which("taskset") is None:
        raise ConfigError("taskset not found (util-linux): it pins each run to --cpu")
    if args.peer_src is not None and not args.peer_src.is_dir():
        raise ConfigError(f"--peer-src {args.peer_src} is not a folder")
    check_output(args.json_out, "--json-out")
    for option in ("out_root", "peer_venv", "peer_cache"):
        if getattr(args, option) is not None:
            check_writable(getattr(args, option), "--" + option.replace("_", "-"))
    from r2ac.bench.options import check_train_options

    check_train_options(r2ac_train_args(args, args.short_steps, None), "the r2ac runs")


def r2ac_train_args(args, steps: int, out: Path | None) -> list[str]:
    """`r2ac train` arguments of one r2ac run (the matched network, one thread)."""
    argv = ["stream-ac", *R2AC_NET, "--env", "builtin/memory-chain",
            "--env-options", f"length={args.length}", "--num-threads", "1", "--no-progress",
            "--no-eval-at-end", "--total-frames", str(steps), "--seed", str(args.seed)]  # fmt: skip
    if out is not None:
        argv += ["--out-dir", str(out)]
    return argv + list(args.r2ac_args)


def pinned(cmd: list[str], cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu), *cmd]


def r2ac_command(args, steps: int, out: Path) -> list[str]:
    return pinned([sys.executable, "-m", "r2ac.cli", "train", *r2ac_train_args(args, steps, out)],
                  args.cpu)  # fmt: skip


def rtrrl_command(args, steps: int, result: Path) -> list[str]:
    # -P: the script's folder (r2ac/bench) stays off the peer's import path
    return pinned([str(args.peer_python), "-P", str(SIDE), "--src", str(args.source),
                   "--episodes", str(steps // SCAN_STEPS), "--steps", str(SCAN_STEPS),
                   "--length", str(args.length), "--seed", str(args.seed),
                   "--result", str(result)], args.cpu)  # fmt: skip


def run_env(base: dict[str, str]) -> dict[str, str]:
    """The runs' environment: one thread everywhere, and this r2ac first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
    return {**base, **ONE_THREAD, "PYTHONPATH": path}


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(cmd: list[str], log: Path, env: dict[str, str]) -> dict:
    """Run cmd (its output in log): exit status, wall and CPU seconds, load around it."""
    load = os.getloadavg()
    cpu0, start = child_cpu_seconds(), time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode
    wall, cpu = time.perf_counter() - start, child_cpu_seconds() - cpu0
    return {"cmd": shlex.join(cmd), "log": str(log), "rc": rc, "wall_s": wall, "cpu_s": cpu,
            "loadavg": [round(x, 2) for x in (*load, *os.getloadavg())]}  # fmt: skip


def run_system(args, system: str, steps: int, tag: str, root: Path) -> dict:
    """One run of one system; its record."""
    out = root / f"{tag}-{system}-{steps}"
    if system == "r2ac":
        cmd = r2ac_command(args, steps, out)
    else:
        out.mkdir(parents=True, exist_ok=True)
        cmd = rtrrl_command(args, steps, out / "result.json")
    rec = measure(cmd, out.with_suffix(".log"), run_env(dict(os.environ)))
    return {"system": system, "steps": steps, "tag": tag, "out": str(out), **rec}


def difference(long: dict, short: dict) -> dict:
    """Steps/s wall and per CPU-second from a long and a short run: start-up cancels."""
    steps = long["steps"] - short["steps"]
    wall, cpu = long["wall_s"] - short["wall_s"], long["cpu_s"] - short["cpu_s"]
    return {"steps": steps, "wall_s": wall, "cpu_s": cpu,
            "steps_per_s": steps / wall if wall > 0 else None,
            "steps_per_cpu_s": steps / cpu if cpu > 0 else None}  # fmt: skip


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summary(rounds: list[dict], system: str) -> dict:
    """A system's medians over the rounds (a round whose runs failed counts as none)."""
    diffs = [r[system] for r in rounds if r.get(system)]
    per_cpu = median(d["steps_per_cpu_s"] for d in diffs)
    return {"system": system, "rounds": len(diffs),
            "steps_per_s": median(d["steps_per_s"] for d in diffs),
            "steps_per_cpu_s": per_cpu,
            "us_per_step_cpu": 1e6 / per_cpu if per_cpu else None}  # fmt: skip


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: dict[str, dict], labels: dict[str, str]) -> str:
    """Markdown: one line per system, then the ratio r2ac / RTRRL."""
    lines = ["| system | steps/s wall | steps per CPU-second | CPU per step | rounds |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for system in SYSTEMS:
        r = rows[system]
        lines.append(f"| {labels[system]} | {fmt(r['steps_per_s'])} | {fmt(r['steps_per_cpu_s'])} "
                     f"| {fmt(r['us_per_step_cpu'], '.0f')} us | {r['rounds']} |")  # fmt: skip
    a, b = rows["r2ac"], rows["rtrrl"]
    wall, cpu = (ratio(a[k], b[k]) for k in ("steps_per_s", "steps_per_cpu_s"))
    lines.append(f"| ratio r2ac / RTRRL | {fmt(wall, '.3f')} | {fmt(cpu, '.3f')} | | |")
    return "\n".join(lines)


def setup_peer(venv: Path) -> Path:
    """The peer venv's python, the venv created (or its pins installed) first if need be."""
    py = venv / "bin" / "python"
    stamp = venv / ".peer-rtrrl-pins"
    if stamp.exists() and stamp.read_text() == "\n".join(PEER_PACKAGES):
        return py
    print(f"[peer-rtrrl] setting up {venv} (jax 0.5.0 on CPU, gymnax, brax, flax, ...)",
          file=sys.stderr)  # fmt: skip
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    check = "import jax, gymnax, brax, flax, distrax, optax; print(jax.devices())"
    subprocess.run([str(py), "-c", check], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    stamp.write_text("\n".join(PEER_PACKAGES))
    return py


def clone_commands(dest: Path) -> list[list[str]]:
    """The commands that put RTRRL at the pinned commit into dest."""
    return [["git", "clone", "--quiet", "--no-checkout", RTRRL_URL, str(dest)],
            ["git", "-C", str(dest), "checkout", "--quiet", "--detach", RTRRL_COMMIT]]  # fmt: skip


def source_commit(src: Path) -> str | None:
    """The commit checked out in src (None where it is no git checkout)."""
    if not (src / ".git").exists():
        return None
    got = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                         text=True)  # fmt: skip
    return got.stdout.strip() if got.returncode == 0 else None


def fetch_source(cache: Path) -> Path:
    """RTRRL at the pinned commit under cache, cloned on first use."""
    dest = cache / f"RTRRL-{RTRRL_COMMIT[:12]}"
    if source_commit(dest) == RTRRL_COMMIT:
        return dest
    from r2ac.errors import ConfigError

    if dest.exists():
        raise ConfigError(f"{dest} exists but is not RTRRL at {RTRRL_COMMIT[:12]}: remove it")
    print(f"[peer-rtrrl] cloning {RTRRL_URL} at {RTRRL_COMMIT[:12]} into {dest}", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    for cmd in clone_commands(dest):
        if subprocess.run(cmd).returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            raise ConfigError(f"could not get RTRRL ({shlex.join(cmd)}); give a checkout "
                              "with --peer-src DIR")  # fmt: skip
    return dest


def peer_versions(py: Path) -> dict[str, str]:
    """The peer venv's packages and versions (pip's list)."""
    got = subprocess.run([str(py), "-m", "pip", "list", "--format", "json"], capture_output=True,
                         text=True)  # fmt: skip
    if got.returncode != 0:
        return {}
    return {p["name"]: p["version"] for p in json.loads(got.stdout)}


def machine() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")),
                 platform.processor())  # fmt: skip
    return {"cpu": model, "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}  # fmt: skip


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def r2ac_commit() -> str | None:
    return source_commit(ROOT)


def schedule(pairs: int, warmup: int) -> list[tuple[str, str, str]]:
    """(tag, system, 'short' | 'long') in run order: warm-up short runs, then rounds that
    alternate the systems, each a short run then a long one."""
    runs = [(f"warmup{i}", s, "short") for i in range(warmup) for s in SYSTEMS]
    return runs + [(f"round{i}", s, kind) for i in range(pairs) for s in SYSTEMS
                   for kind in ("short", "long")]  # fmt: skip


def run_steps(args, system: str, kind: str) -> int:
    """Env steps of a short or long run of a system."""
    if kind == "short":
        return args.short_steps
    return args.peer_long_steps if system == "rtrrl" else args.long_steps


def run_all(args, root: Path) -> tuple[list[dict], list[dict]]:
    """Every run in schedule order; the records and each round's differences."""
    records, rounds = [], {}
    for tag, system, kind in schedule(args.pairs, args.warmup):
        steps = run_steps(args, system, kind)
        print(f"[peer-rtrrl] {tag} {system} {steps:,} steps", file=sys.stderr, flush=True)
        rec = run_system(args, system, steps, tag, root)
        records.append(rec)
        print(f"[peer-rtrrl]   rc {rec['rc']} wall {rec['wall_s']:.1f} s cpu {rec['cpu_s']:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        if kind == "long" and tag.startswith("round"):
            short = records[-2]
            ok = rec["rc"] == 0 and short["rc"] == 0
            rounds.setdefault(tag, {"round": tag})[system] = difference(rec, short) if ok else None
    return records, list(rounds.values())


def steps_text(args) -> str:
    text = f"{args.long_steps:,} - {args.short_steps:,} steps"
    if args.peer_long_steps != args.long_steps:
        text += f" (RTRRL: {args.peer_long_steps:,} - {args.short_steps:,})"
    return text


def labels(args) -> dict[str, str]:
    return {"r2ac": f"r2ac lru-rtrl 32, --stream-mlp --prev-action, builtin/memory-chain "
                    f"{args.length}",
            "rtrrl": f"RTRRL default agent (LRU 32, RTRL), gymnax MemoryChain {args.length}"}  # fmt: skip


def parse(argv: list[str]) -> argparse.Namespace:
    argv, r2ac_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv \
        else (argv, [])  # fmt: skip
    p = argparse.ArgumentParser(
        prog="r2ac bench peer-rtrrl", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--pairs", type=int, default=3, help="alternated rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="discarded short runs of each first")
    p.add_argument("--long-steps", type=int, default=102_000, help="env steps of a long run")
    p.add_argument("--short-steps", type=int, default=2_000,
                   help="env steps of a short run (>= 2 RTRRL scans: it compiles twice)")  # fmt: skip
    p.add_argument("--peer-long-steps", type=int, default=1_002_000,
                   help="env steps of RTRRL's long run (default 1,002,000)")  # fmt: skip
    p.add_argument("--length", type=int, default=32, help="MemoryChain's memory length")
    p.add_argument("--seed", type=int, default=1, help="both systems' seed (>= 1)")
    p.add_argument("--cpu", type=int, default=0, help="the CPU every run is pinned to")
    p.add_argument("--peer-src", type=Path, help="an RTRRL checkout (default: clone it)")
    p.add_argument("--peer-cache", type=Path, default=ROOT.parent / "peer-rtrrl-src",
                   help="where RTRRL is cloned without --peer-src (default ../peer-rtrrl-src)")  # fmt: skip
    p.add_argument("--peer-venv", type=Path, default=ROOT.parent / "peer-rtrrl-venv",
                   help="the peer's venv, created if missing (default ../peer-rtrrl-venv)")  # fmt: skip
    p.add_argument("--out-root", type=Path, help="where runs go (default runs/peer-rtrrl/<time>)")
    p.add_argument("--json-out", type=Path, help="every run, the rounds and the table, as JSON")
    p.add_argument("--setup-only", action="store_true", help="set up venv and source, then stop")
    args = p.parse_args(argv)
    args.r2ac_args = r2ac_args
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    check_args(args)  # before the venv is made or any run starts (ConfigError: one line)
    args.peer_python = setup_peer(args.peer_venv.absolute())
    args.source = (args.peer_src or fetch_source(args.peer_cache)).resolve()
    commit = source_commit(args.source)
    if commit != RTRRL_COMMIT:
        print(f"[peer-rtrrl] note: RTRRL at {commit or 'an unknown commit'}, not the pinned "
              f"{RTRRL_COMMIT[:12]}", file=sys.stderr)  # fmt: skip
    if args.setup_only:
        print(f"peer ready: venv {args.peer_venv}, RTRRL {args.source}")
        return 0
    root = args.out_root or ROOT / "runs" / "peer-rtrrl" / datetime.now().strftime("%Y%m%d-%H%M%S")
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    records, rounds = run_all(args, root)
    rows = {s: summary(rounds, s) for s in SYSTEMS}
    text = table(rows, labels(args))
    load_text = " -> ".join(" ".join(f"{x:.2f}" for x in la) for la in (load, os.getloadavg()))
    print(text)
    print(
        f"one thread each on CPU {args.cpu}; medians of {args.pairs} alternated rounds of "
        f"{steps_text(args)}; load average {load_text}"
    )
    if args.json_out:
        doc = {"created": datetime.now().isoformat(timespec="seconds"), "argv": argv,
               "r2ac_commit": r2ac_commit(), "rtrrl_commit": commit, "rtrrl_src": str(args.source),
               "peer_packages": peer_versions(args.peer_python), "machine": machine(),
               "loadavg": [list(load), list(os.getloadavg())], "labels": labels(args),
               "summary": rows, "ratio": {k: ratio(rows["r2ac"][k], rows["rtrrl"][k])
                                          for k in ("steps_per_s", "steps_per_cpu_s")},
               "table": text, "rounds": rounds, "runs": records}  # fmt: skip
        args.json_out.write_text(json.dumps(doc, indent=2))
        print(f"json: {args.json_out}")
    return 1 if any(r["rc"] != 0 for r in records) else 0
