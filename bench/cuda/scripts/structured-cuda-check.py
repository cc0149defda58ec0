# Validates hearth's --device cuda output under --json-schema (no jsonschema package there: checked by hand).
import json, subprocess, sys
schema = json.load(open(".gpu/schema.json"))
ok = 0
for seed in range(1, 21):
    p = subprocess.run([".gpu/hearth", "run", "-m", ".gpu/random.gguf", "--device", "cuda", "-p", "hi", "--temp", "0.9",
                        "--seed", str(seed), "-n", "1000", "--json-schema", ".gpu/schema.json", "--stats-json", "/tmp/st.json"],
                       capture_output=True, text=True)
    if p.returncode:
        print("FAIL rc", p.returncode, p.stderr[-2000:]); continue
    v = json.loads(p.stdout)
    assert set(v) == {"title", "todos"} and isinstance(v["title"], str) and len(v["title"]) <= 24
    assert isinstance(v["todos"], list) and len(v["todos"]) <= 3
    for t in v["todos"]:
        assert set(t) == {"task", "done", "priority", "estimate"}, t
        assert isinstance(t["task"], str) and len(t["task"]) <= 24 and isinstance(t["done"], bool)
        assert t["priority"] in ("low", "medium", "high") and isinstance(t["estimate"], int) and 1 <= t["estimate"] <= 99
    st = json.load(open("/tmp/st.json"))
    ok += 1
    print(f"seed {seed}: valid, {st['generated_tokens']} tokens, device {st['device']}, constraint {st['constraint_ms']:.1f} ms of {st['decode_ms']:.1f} ms decode: {p.stdout.strip()[:90]}")
print(f"{ok}/20 valid on cuda")
