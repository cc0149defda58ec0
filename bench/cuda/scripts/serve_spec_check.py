# hearth serve --device cuda with and without --spec auto: one chat completion
# each (greedy), the replies compared, /metrics' speculation counters shown.
import json, subprocess, sys, time, urllib.request
H = sys.argv[1]
def run(spec, port):
    p = subprocess.Popen([H, "serve", "-m", "qwen2.5-coder-0.5b", "--device", "cuda", "--spec", spec,
                          "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(base + "/health", timeout=1); break
        except Exception:
            time.sleep(0.5)
    body = {"model": "qwen2.5-coder-0.5b", "max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a Python function that returns the n-th prime number, with a docstring."}]}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    r = json.load(urllib.request.urlopen(req, timeout=300))
    dt = time.time() - t0
    m = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    p.terminate(); out = p.communicate(timeout=30)[0]
    text = r["choices"][0]["message"]["content"]
    print(f"--spec {spec}: {r['usage']} in {dt:.2f} s")
    for line in m.splitlines():
        if line.startswith("hearth_spec") and not line.startswith("#"):
            print("  " + line)
    return text, out
a, _ = run("none", 8091)
b, log = run("auto", 8092)
print("replies identical:", a == b, f"({len(a)} chars)")
print("\n".join(l for l in log.splitlines() if "spec" in l)[:2000])
