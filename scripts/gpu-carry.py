#!/usr/bin/env python3
"""The GPU check's carry: what a lent GPU machine needs that the working tree
does not hold, cut into device calls that fit, and put back together there.

A lent machine (the `device` tool) has no Rust and no network. Every call sends
the working tree (tracked and untracked-not-ignored files) plus the ignored
paths it names in `carry`, at most 64 MiB in all, and the machine keeps what a
call leaves only while it stays warm (30 s after a call). The check needs the
release binary (stripped and xz-compressed: ~23 MB), Debian's Vulkan loader
and, for its sweep stage, the default model's GGUF (98 MB): more than one call
holds beside the tree. So:

  scripts/gpu-carry.py pack        # here: .gpu/call-1 … call-N, .gpu/PLAN.md (the calls to make)
  scripts/gpu-carry.py stage       # there, every call: move its parts into the stage folder
  scripts/gpu-carry.py unpack      # there: check the parts and put the files together
  scripts/gpu-carry.py collect N   # there: the stage's results as $OUT/N.tgz (one file comes back)
  scripts/gpu-carry.py rehearse    # here: PLAN.md's calls played in a copy of the tree,
                                   # on lavapipe, with gpu-check.sh --small (--scale 10 lets
                                   # its sweep finish there)

`pack` cuts the files into parts that fill each call up to its room (64 MiB
less the tree, less a margin), binary and loader first, so that the call
completing them runs the check's bench and anchor stages (the numbers that need
no model), and the last call, completing the GGUF, runs the sweep stage. Calls
must follow each other within the machine's warm time: a gap loses the stage,
and `unpack` then names the parts missing.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = Path(".gpu")
# What one call may send (the device tool's limit), and what is kept free of it
# for the tree's growth between `pack` and the calls and for the tool's own files.
CALL_BYTES = 64 << 20
MARGIN = 1 << 20
# Inside the tree's copy there, ignored: a warm machine keeps ignored outputs between calls.
STAGE = Path(os.environ.get("GPU_STAGE", ".gpu/stage"))
GGUF = Path("models/SmolLM2-135M-Instruct.Q4_1.gguf")
# Debian package → the library it brings that the check needs.
LOADER = {"libvulkan1": "libvulkan.so.1", "libglvnd0": "libGLdispatch.so.0"}


def die(msg):
    print(f"gpu-carry: {msg}", file=sys.stderr)
    sys.exit(1)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes():
    """Bytes of what every call sends: tracked and untracked-not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout
    total = 0
    for name in out.split(b"\0"):
        p = ROOT / os.fsdecode(name)
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def binary(work, src):
    """The release binary, stripped and xz-compressed (reused while newer than `src`)."""
    out = work / "bastion.xz"
    if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    stripped = work / "bastion"
    subprocess.run(["strip", "-o", stripped, src], check=True)
    print(f"compressing {src} (stripped: {stripped.stat().st_size / 1e6:.1f} MB) with xz -9e …", file=sys.stderr)
    tmp = out.with_suffix(".xz.tmp")
    with open(tmp, "wb") as f:
        subprocess.run(["xz", "-T2", "-9e", "-c", stripped], check=True, stdout=f)
    tmp.rename(out)  # only a whole file is ever reused
    stripped.unlink()
    return out


def loader(work):
    """Debian's Vulkan loader and libglvnd (the NVIDIA ICD needs libGLdispatch), amd64."""
    debs = work / "debs"
    found = sorted(debs.glob("*.deb")) if debs.is_dir() else []
    if len(found) >= len(LOADER):
        return found
    debs.mkdir(parents=True, exist_ok=True)
    lists = Path(tempfile.mkdtemp(prefix="gpu-carry-apt-"))
    (lists / "partial").mkdir()
    opts = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", f"-oDir::State::Lists={lists}"]
    subprocess.run(["apt-get", *opts, "-qq", "update"], check=True)
    subprocess.run(["apt-get", *opts, "-qq", "download", *LOADER], check=True, cwd=debs)
    for d in debs.glob("*.deb"):
        d.chmod(0o644)
    shutil.rmtree(lists)
    return sorted(debs.glob("*.deb"))


def pack(args):
    src = ROOT / args.binary
    if not src.is_file():
        die(f"{args.binary} missing: build it with cargo build --release --locked -p bastion-cli")
    carry = ROOT / CARRY
    work = carry / "work"
    work.mkdir(parents=True, exist_ok=True)
    for old in carry.glob("call-*"):
        shutil.rmtree(old)
    # (name in the stage, local file, what needs it): binary and loader first.
    files = [("bastion.xz", binary(work, src), "bench")]
    files += [(f"debs/{d.name}", d, "bench") for d in loader(work)]
    model = ROOT / GGUF
    if args.no_model:
        pass
    elif model.is_file():
        files.append((str(GGUF), model, "sweep"))
    else:
        die(f"{GGUF} missing (scripts/fetch-model.sh), or pass --no-model to carry no sweep")
    tree = tree_bytes()
    room = CALL_BYTES - tree - int(args.margin * 2**20)
    if room < 4 << 20:
        die(f"the working tree sends {tree / 2**20:.1f} MiB with every call: {room / 2**20:.1f} MiB left of 64")
    calls = [[]]  # per call: (stage name, part index, offset, length)
    used = 0
    manifest = {"files": [], "bench_call": None, "tree_bytes": tree, "room": room}
    for name, path, need in files:
        size = path.stat().st_size
        parts, offset = 0, 0
        while offset < size or (size == 0 and parts == 0):
            if used == room:
                calls.append([])
                used = 0
            n = min(room - used, size - offset)
            calls[-1].append((name, parts, offset, n, path))
            used += n
            offset += n
            parts += 1
        manifest["files"].append({"name": name, "bytes": size, "sha256": sha256(path), "parts": parts, "for": need})
        if need == "bench":
            manifest["bench_call"] = len(calls)
    for k, parts in enumerate(calls, 1):
        dest = carry / f"call-{k}"
        dest.mkdir()
        for name, i, offset, n, path in parts:
            part = dest / f"{name.replace('/', '__')}.part-{i:03d}"
            with open(path, "rb") as f, open(part, "wb") as out:
                f.seek(offset)
                out.write(f.read(n))
    manifest["calls"] = [[f"{name.replace('/', '__')}.part-{i:03d}" for name, i, *_ in parts] for parts in calls]
    manifest["sweep"] = any(f["for"] == "sweep" for f in manifest["files"])
    (carry / f"call-{len(calls)}" / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    # The manifest rides along with every call, so any call can tell what it completes.
    for k in range(1, len(calls)):
        shutil.copy(carry / f"call-{len(calls)}" / "MANIFEST.json", carry / f"call-{k}" / "MANIFEST.json")
    write_plan(carry, len(calls), manifest)
    print(f"packed {tree / 2**20:.1f} MiB of tree + {room / 2**20:.1f} MiB of parts a call; rerun `pack` right "
          "before the calls if the tree changed since", file=sys.stderr)


# Seconds each stage may take inside its call (of the session's 15 device minutes:
# a start or two, the staging calls, and these), and the sweep's own cap.
BENCH_SECONDS = 360
SWEEP_SECONDS = 200


def commands(n, bench_call, sweep):
    """The command and time limit (s) of each call (1-based), as PLAN.md gives them. A
    check runs under `timeout` inside the call, so that `collect` still brings back what
    it wrote when it runs long; a stage call first checks that the earlier calls' parts
    are still there (a machine that went back between calls lost them)."""
    check = ("BASTION={s}/bastion OUT={s}/results STAGES={st} SWEEP_SECONDS={sw} timeout -k 15 -s INT {t} "
             "scripts/gpu-check.sh ${{GPU_CHECK_ARGS:-}}")
    out = []
    for k in range(1, n + 1):
        stage = f"python3 scripts/gpu-carry.py stage --call {k}"
        cmd, limit = stage, 120
        run, seconds = [], 0
        if k == bench_call:
            run.append("bench,anchor")
            seconds += BENCH_SECONDS
        if k == n and sweep:
            run.append("sweep")
            seconds += SWEEP_SECONDS + 45
        if run:
            st = ",".join(run)
            need = "bench" if st == "bench,anchor" else "all"
            seconds = min(seconds, 520)
            cmd = (f"{stage} && python3 scripts/gpu-carry.py unpack --need {need} && "
                   + check.format(s=STAGE, st=st, sw=SWEEP_SECONDS, t=seconds)
                   + f"; python3 scripts/gpu-carry.py collect gpu-call-{k}")
            limit = seconds + 60
        out.append((cmd, limit))
    return out


def expected_minutes(cmds):
    """Device minutes the calls take when each check runs to its cap."""
    return 1.5 + sum((t - 60 if "gpu-check" in c else 25) for c, t in cmds) / 60


def write_plan(carry, n, manifest):
    cmds = commands(n, manifest["bench_call"], manifest["sweep"])
    lines = [
        "# GPU check: the calls to make",
        "",
        f"Written by `scripts/gpu-carry.py pack`. The tree sends {manifest['tree_bytes'] / 2**20:.1f} MiB with every call,",
        f"leaving {manifest['room'] / 2**20:.1f} MiB a call for the parts; {n} calls, one right after the other",
        "(the machine keeps the stage only while warm: 30 s after a call). If a reply after the first",
        "says the machine was not warm, or a `stage` names missing parts, the stage is gone: stop there",
        "(`give_back`); what earlier calls collected is already back. If the tool refuses a call as",
        "larger than 64 MiB, `pack --margin 3` and start over. Before the last call, lower its",
        f"SWEEP_SECONDS (now {SWEEP_SECONDS}) and `timeout` to fit `budget_left_s` less ~90 s.",
        "",
        f"Device time: about {expected_minutes(cmds):.0f} minutes if every check runs to its cap (a start of ~1.5",
        "min, ~25 s a staging call); the session has 15 in all. With less left, `pack --no-model`",
        "carries no GGUF: the bench and anchor stages only, in two calls.",
        "",
    ]
    for k, (cmd, timeout) in enumerate(cmds, 1):
        lines += [f"{k}. `run` with carry `[\".gpu/call-{k}\"]`, timeout_s {timeout}:", "", "   " + cmd, ""]
    lines += ["Then `give_back`, unpack the last `gpu-call-*.tgz` (it holds the earlier calls' files too)",
              "into the repository root and commit `results/gpu/<device>/`."]
    (carry / "PLAN.md").write_text("\n".join(lines) + "\n")
    json.dump({"calls": [c for c, _ in cmds]}, open(carry / "plan.json", "w"), indent=1)
    print((carry / "PLAN.md").read_text())


def stage(args):
    """Moves every carried part (.gpu/call-*/) into the stage folder; with `--call K`, then
    checks that the parts of calls 1 … K are all there (exit 1 naming the missing ones)."""
    STAGE.mkdir(parents=True, exist_ok=True)
    moved = 0
    for part in sorted((ROOT / CARRY).glob("call-*/*")):
        shutil.move(str(part), STAGE / part.name)
        moved += 1
    print(f"staged {moved} files in {STAGE}: {len(list(STAGE.glob('*.part-*')))} parts so far")
    if args.call:
        manifest = json.loads((STAGE / "MANIFEST.json").read_text())
        missing = [p for parts in manifest["calls"][: args.call] for p in parts if not (STAGE / p).is_file()]
        if missing:
            die(f"parts missing in {STAGE}: {', '.join(missing)}: the machine went back between calls and "
                "the stage is gone; stop here (give_back)")


def unpack(args):
    """Checks that the parts of the files `--need` names are all staged, puts them together
    (binary into the stage, made executable; loader unpacked into / where none is found;
    the GGUF at its path in the tree) and checks each file's sha256."""
    manifest = json.loads((STAGE / "MANIFEST.json").read_text())
    wanted = [f for f in manifest["files"] if args.need == "all" or f["for"] == args.need]
    missing = [f"{f['name']} part {i}" for f in wanted for i in range(f["parts"])
               if not (STAGE / f"{f['name'].replace('/', '__')}.part-{i:03d}").is_file()]
    if missing:
        die(f"parts missing in {STAGE}: {', '.join(missing)} (the machine went back between calls: "
            "make all the calls again)")
    for f in wanted:
        key = f["name"].replace("/", "__")
        dest = STAGE / f["name"] if not f["name"].endswith(".gguf") else ROOT / f["name"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not (dest.is_file() and dest.stat().st_size == f["bytes"] and sha256(dest) == f["sha256"]):
            with open(dest, "wb") as out:
                for i in range(f["parts"]):
                    out.write((STAGE / f"{key}.part-{i:03d}").read_bytes())
            if sha256(dest) != f["sha256"]:
                dest.unlink()
                die(f"{dest}: sha256 differs from the packed file's (a part damaged, or parts of two packs "
                    "mixed: the calls must all come from one `pack`)")
        if f["name"] == "bastion.xz":
            exe = STAGE / "bastion"
            if shutil.which("xz"):
                subprocess.run(["xz", "-dkfc", dest], check=True, stdout=open(exe, "wb"))
            else:
                import lzma
                exe.write_bytes(lzma.decompress(dest.read_bytes()))
            exe.chmod(0o755)
    # Each package whose library the machine lacks (the NVIDIA ICD needs libGLdispatch too).
    libs = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    debs = [d for d in sorted(STAGE.glob("debs/*.deb")) if LOADER.get(d.name.split("_")[0], "") not in libs]
    if debs and not args.no_loader:
        for d in debs:
            subprocess.run(["dpkg", "-x", d, "/"], check=True)
        subprocess.run(["ldconfig"], check=True)
        print(f"installed {', '.join(d.name for d in debs)}", file=sys.stderr)
    print(f"unpacked {', '.join(f['name'] for f in wanted)}", file=sys.stderr)


def collect(args):
    """The stage's results (gpu-check.sh's OUT) as one file in the device tool's $OUT."""
    out = os.environ.get("OUT")
    if not out:
        die("$OUT is not set (collect runs on the device machine)")
    results = STAGE / "results"
    with tarfile.open(Path(out) / f"{args.name}.tgz", "w:gz") as tar:
        if results.is_dir():
            tar.add(results, arcname="results/gpu")
    print(f"collected {results} into {out}/{args.name}.tgz", file=sys.stderr)


def rehearse(args):
    """PLAN.md's calls, played here: each in a copy of the working tree holding that
    call's carry (and what earlier calls left, as a warm machine keeps it), on lavapipe,
    with gpu-check.sh --small; the collected files land in REHEARSAL/out."""
    plan = json.loads((ROOT / CARRY / "plan.json").read_text())
    base = Path(args.dir).resolve()
    if base.exists():
        shutil.rmtree(base)
    device, out = base / "device", base / "out"
    out.mkdir(parents=True)
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, names):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            dst = device / os.fsdecode(name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    env = dict(os.environ, OUT=str(out), GPU_CHECK_ARGS="--small",
               VK_ICD_FILENAMES=os.environ.get("VK_ICD_FILENAMES", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"),
               XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    scale = lambda m: f"{m.group(1)}{int(int(m.group(2)) * args.scale)}"
    for k, cmd in enumerate(plan["calls"], 1):
        shutil.copytree(ROOT / CARRY / f"call-{k}", device / CARRY / f"call-{k}")
        # lavapipe is slower than the GPU the limits were set for: --scale stretches them.
        cmd = re.sub(r"(SWEEP_SECONDS=|timeout -s INT )(\d+)", scale, cmd)
        print(f"== call {k}: {cmd}", file=sys.stderr)
        rc = subprocess.run(["bash", "-c", cmd], cwd=device, env=env).returncode
        if rc != 0:
            die(f"call {k} exited {rc}")
    print(f"rehearsal done: {sorted(p.name for p in out.iterdir())} in {out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--binary", default=os.environ.get("BASTION", "target/release/bastion"))
    p.add_argument("--no-model", action="store_true", help="carry no GGUF (bench and anchor stages only)")
    p.add_argument("--margin", type=float, default=MARGIN / 2**20,
                   help="MiB of each call kept free (default 1; more if the tool refuses a call as too large)")
    p = sub.add_parser("stage")
    p.add_argument("--call", type=int, help="this call's number: check that calls 1 … N left their parts")
    p = sub.add_parser("unpack")
    p.add_argument("--need", choices=["bench", "all"], default="all")
    p.add_argument("--no-loader", action="store_true")
    p = sub.add_parser("collect")
    p.add_argument("name")
    p = sub.add_parser("rehearse")
    p.add_argument("--dir", default="/tmp/gpu-carry-rehearsal")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the calls' time limits (lavapipe is slow)")
    a = ap.parse_args()
    os.chdir(ROOT)
    {"pack": pack, "stage": stage, "unpack": unpack, "collect": collect, "rehearse": rehearse}[a.cmd](a)


if __name__ == "__main__":
    main()
