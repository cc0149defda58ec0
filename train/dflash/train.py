#!/usr/bin/env python3
"""Train a DFlash drafter for a GGUF target on one GPU (see README.md).

    python3 train.py gen   --target T.gguf --prompts prompts.jsonl --work DIR [--budget-s 270]
    python3 train.py train --target T.gguf --work DIR --out DIR [--budget-s 420] [--resume ckpt.pt]
    python3 train.py export --target T.gguf --ckpt DIR/drafter.pt --out DIR

`gen` writes DIR/seqs.pt: the target's own continuations of the prompts
(greedy or sampled, per prompt). `train` trains the drafter on them (target
hidden states computed on the fly), prints acceptance on held-out sequences
as it goes, saves DIR/drafter.pt and exports the GGUF and a test fixture.
"""
import argparse
import base64
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402
from model import Drafter, attention_mask, block_rows, build_target  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def load_target(path, dtype=torch.bfloat16):
    """The target from its GGUF; the dequantized tensors are cached beside
    the work files (TARGET_CACHE, e.g. /dev/shm) so later stages skip the
    numpy dequantization."""
    t0 = time.time()
    cache = os.environ.get("TARGET_CACHE")
    if cache and os.path.exists(cache):
        cfg, tensors = torch.load(cache, weights_only=False)
    else:
        cfg, tensors = gguf_io.read_target(path)
        if cache:
            torch.save((cfg, tensors), cache)
    model = build_target(cfg, tensors, DEV, dtype)
    log(f"target {cfg['arch']} {cfg['n_layers']}L d{cfg['dim']} loaded in {time.time() - t0:.1f} s")
    return cfg, tensors, model


def default_taps(n_layers, n=5):
    """Inputs of n target layers spread over 1..L-2 (hearth synth's rule)."""
    lo, hi = 1, n_layers - 2
    return [lo + (j * (hi - lo) + (n - 1) // 2) // (n - 1) for j in range(n)]


# ---------------------------------------------------------------- generation

def gen_batches(prompts, tok_budget, max_new, max_batch, rng):
    """Prompts of one temperature in batches of similar length whose padded
    size stays under tok_budget, in random order (a run cut short by its
    time budget still covers every kind and length)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]["ids"]))
    batches, cur = [], []
    for i in order:
        width = len(prompts[i]["ids"]) + max_new
        if cur and ((len(cur) + 1) * width > tok_budget or len(cur) >= max_batch):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def generate_chunk(model, chunk, temp, max_new, eos, pad):
    width = max(len(p["ids"]) for p in chunk)
    ids = torch.full((len(chunk), width), pad, dtype=torch.long)
    att = torch.zeros((len(chunk), width), dtype=torch.long)
    for j, p in enumerate(chunk):
        ids[j, width - len(p["ids"]):] = torch.tensor(p["ids"])
        att[j, width - len(p["ids"]):] = 1
    kw = dict(do_sample=False) if temp == 0 else dict(do_sample=True, temperature=temp, top_k=0, top_p=1.0)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(DEV), attention_mask=att.to(DEV), max_new_tokens=max_new,
            eos_token_id=eos, pad_token_id=pad, **kw,
        )
    res = []
    for j, p in enumerate(chunk):
        resp = out[j, width:].tolist()
        for k, t in enumerate(resp):
            if t in eos:
                resp = resp[: k + 1]
                break
        res.append(resp)
    return res


def cmd_gen(a):
    """The target's answers to the prompts, saved as shards (DIR/seqs-NNNN.pt)
    after every batch; a later `gen` skips the prompts already answered, so a
    run spread over several calls (or sessions) resumes. `train` reads every
    shard (and DIR/seqs.pt, the older single file)."""
    cfg, _, model = load_target(a.target)
    prompts = [json.loads(l) for l in open(a.prompts)]
    for i, p in enumerate(prompts):
        p["n"] = i
    if a.limit:
        prompts = prompts[: a.limit]
    os.makedirs(a.work, exist_ok=True)
    done_ids, shard = set(), 0
    for f in sorted(os.listdir(a.work)):
        if f.startswith("seqs-") and f.endswith(".pt"):
            done_ids |= {s["n"] for s in torch.load(os.path.join(a.work, f))}
            shard = max(shard, int(f[5:9]) + 1)
    eos = [151645, 151643] if cfg["vocab_size"] > 151000 else cfg["eos_ids"]
    pad = eos[-1]
    rng = random.Random(a.seed)
    t0, n_seq, n_tok, n_prompt = time.time(), 0, 0, 0
    todo = [p for p in prompts if p["n"] not in done_ids]
    log(f"{len(prompts)} prompts, {len(done_ids)} answered before, {len(todo)} to go")
    jobs = []
    for temp in (0.0, 0.7):
        group = [p for p in todo if p["temp"] == temp]
        jobs += [(temp, [group[i] for i in b]) for b in gen_batches(group, a.tok_budget, a.max_new, a.batch, rng)]
    rng.shuffle(jobs)
    for temp, chunk in jobs:
        if time.time() - t0 > a.budget_s:
            break
        parts = [chunk]
        results = []
        while parts:
            part = parts.pop()
            try:
                results += list(zip(part, generate_chunk(model, part, temp, a.max_new, eos, pad)))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                if len(part) == 1:
                    raise
                log(f"out of memory at batch {len(part)}: halving")
                parts += [part[: len(part) // 2], part[len(part) // 2 :]]
        seqs = [{"ids": p["ids"] + r, "start": len(p["ids"]), "temp": temp, "kind": p.get("kind", ""), "n": p["n"]}
                for p, r in results]
        torch.save(seqs, os.path.join(a.work, f"seqs-{shard:04d}.pt"))
        shard += 1
        n_prompt += len(chunk)
        n_seq += len(seqs)
        n_tok += sum(len(s["ids"]) - s["start"] for s in seqs)
        el = time.time() - t0
        log(f"gen T={temp} batch {len(chunk)} (prompt width {max(len(p['ids']) for p in chunk)}): "
            f"{n_prompt}/{len(todo)} prompts, {n_tok} generated tokens, {el:.0f} s, {n_tok / max(el, 1e-9):.0f} tok/s")
    log(f"answered {n_prompt} prompts this run ({len(done_ids) + n_prompt} in all), {n_tok} tokens")


def load_seqs(work):
    seqs = []
    if os.path.exists(os.path.join(work, "seqs.pt")):
        seqs += torch.load(os.path.join(work, "seqs.pt"))
    for f in sorted(os.listdir(work)):
        if f.startswith("seqs-") and f.endswith(".pt"):
            seqs += torch.load(os.path.join(work, f))
    # Answers shorter than 8 tokens teach nothing about blocks.
    return [s for s in seqs if len(s["ids"]) - s["start"] >= 8]


# ---------------------------------------------------------------- training

def taps_of(model, tokens, att, taps):
    out = model.model(input_ids=tokens, attention_mask=att, output_hidden_states=True)
    return torch.cat([out.hidden_states[l] for l in taps], dim=-1)


def make_batch(seqs, bs, rng):
    chosen = rng.sample(seqs, bs)
    width = max(len(s["ids"]) for s in chosen)
    tokens = torch.zeros((bs, width), dtype=torch.long)
    att = torch.zeros((bs, width), dtype=torch.long)
    for j, s in enumerate(chosen):
        tokens[j, : len(s["ids"])] = torch.tensor(s["ids"])
        att[j, : len(s["ids"])] = 1
    return chosen, tokens.to(DEV), att.to(DEV)


def sample_anchors(chosen, n_anchors, rng):
    """Anchor positions p in [start, len-2] (the response: at run time the
    first anchor is the first sampled token)."""
    rows = []
    for s in chosen:
        lo, hi = s["start"], len(s["ids"]) - 2
        rows.append([rng.randint(lo, hi) for _ in range(n_anchors)] if hi >= lo else [0] * n_anchors)
    return torch.tensor(rows, dtype=torch.long, device=DEV)


def labels_for(tokens, lens, anchors, block):
    b, a = anchors.shape
    t = torch.arange(block, device=DEV)
    pos = anchors.unsqueeze(-1) + t  # [b, a, block]
    valid = pos < lens.view(b, 1, 1)
    lab = torch.gather(tokens, 1, pos.clamp(max=tokens.shape[1] - 1).view(b, -1)).view(b, a, block)
    lab = torch.where(valid, lab, torch.full_like(lab, -100))
    lab[:, :, 0] = -100  # row 0 is the anchor itself
    return lab


def drafter_logits(drafter, embed, head, tokens, tap_rows, anchors, block, rows_idx=None):
    c = drafter.cfg
    b, tc = tokens.shape
    emb, bpos = block_rows(drafter, embed, tokens, anchors, block, c["mask_token"])
    mask = attention_mask(anchors, block, tc)
    cpos = torch.arange(tc, device=DEV).unsqueeze(0).expand(b, tc)
    h = drafter.hidden(tap_rows, emb, cpos, bpos, mask)  # [b, a*block, d]
    h = h.view(b, anchors.shape[1], block, -1)[:, :, 1:]
    return head(h)  # [b, a, block-1, vocab]


@torch.no_grad()
def evaluate(drafter, embed, head, model, held, taps, block, max_seqs=64):
    """Mean accepted drafts per verify (greedy, runtime blocks 8 and `block`)
    on held-out greedy sequences: anchors every 4 positions of the response;
    a block's accepted count is its leading run of exact matches."""
    drafter.eval()
    acc8, accb, n = 0.0, 0.0, 0
    seqs = [s for s in held if s["temp"] == 0.0][:max_seqs]
    for i in range(0, len(seqs), 16):
        chunk = seqs[i : i + 16]
        width = max(len(s["ids"]) for s in chunk)
        tokens = torch.zeros((len(chunk), width), dtype=torch.long, device=DEV)
        att = torch.zeros_like(tokens)
        for j, s in enumerate(chunk):
            tokens[j, : len(s["ids"])] = torch.tensor(s["ids"], device=DEV)
            att[j, : len(s["ids"])] = 1
        lens = att.sum(1)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEV == "cuda"):
            tap_rows = taps_of(model, tokens, att, taps)
            for j, s in enumerate(chunk):
                ps = list(range(s["start"], len(s["ids"]) - block, 4))
                if not ps:
                    continue
                anchors = torch.tensor([ps], device=DEV)
                for blen, slot in ((8, 0), (block, 1)):
                    lg = drafter_logits(drafter, embed, head, tokens[j : j + 1], tap_rows[j : j + 1], anchors, blen)
                    pred = lg.argmax(-1)[0]  # [a, blen-1]
                    lab = labels_for(tokens[j : j + 1], lens[j : j + 1], anchors, blen)[0, :, 1:]
                    run = (pred == lab).int().cumprod(-1).sum(-1).float().mean().item()
                    if slot == 0:
                        acc8 += run * len(ps)
                    else:
                        accb += run * len(ps)
                n += len(ps)
    drafter.train()
    return acc8 / max(n, 1), accb / max(n, 1)


def cmd_train(a):
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    cfg, tensors, model = load_target(a.target)
    seqs = load_seqs(a.work)
    rng.shuffle(seqs)
    n_held = min(64, len(seqs) // 10)
    held = [s for s in seqs[:n_held * 3] if s["temp"] == 0.0][:n_held]
    held_ids = {id(s) for s in held}
    train = [s for s in seqs if id(s) not in held_ids and len(s["ids"]) <= a.max_len]
    log(f"{len(train)} training sequences ({sum(len(s['ids']) - s['start'] for s in train)} response tokens), {len(held)} held out")

    taps = default_taps(cfg["n_layers"]) if not a.taps else [int(x) for x in a.taps.split(",")]
    dcfg = {
        "dim": cfg["dim"], "n_layers": a.layers, "n_heads": cfg["n_heads"], "n_kv_heads": cfg["n_kv_heads"],
        "head_dim": cfg["head_dim"], "ffn_dim": a.ffn or cfg["ffn_dim"], "target_layers": taps,
        "rope_theta": cfg["rope_theta"], "eps": cfg["eps"], "block_size": a.block, "mask_token": a.mask_token,
        "context_length": cfg["context_length"], "vocab_size": cfg["vocab_size"],
    }
    drafter = Drafter(dcfg).to(DEV)
    if a.resume.endswith(".gguf"):
        # An exported drafter (its Q8_0 weights dequantized) as the starting point.
        rcfg, rt = gguf_io.read_drafter(a.resume)
        for k in ("n_layers", "ffn_dim", "target_layers", "mask_token"):
            dcfg[k] = rcfg[k]
        drafter = Drafter(dcfg).to(DEV)
        drafter.load_gguf_weights(rt)
        log(f"resumed from the exported drafter {a.resume}")
    elif a.resume:
        ck = torch.load(a.resume, map_location=DEV)
        drafter.load_state_dict(ck["state"])
        log(f"resumed from {a.resume} ({ck.get('steps', 0)} steps before)")
    else:
        drafter.init_weights()
        with torch.no_grad():  # start the final norm at the target's
            drafter.norm.copy_(torch.from_numpy(tensors["output_norm.weight"]).to(DEV))
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {dcfg['n_layers']} layers, ffn {dcfg['ffn_dim']}, taps {taps}, block {a.block}, {n_params / 1e6:.1f} M parameters")

    embed = model.model.embed_tokens
    head = model.lm_head
    opt = torch.optim.AdamW(drafter.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gamma = a.gamma
    w_pos = torch.exp(-torch.arange(a.block - 1, device=DEV, dtype=torch.float32) / gamma)
    t0 = time.time()
    step, tokens_seen, history = 0, 0, []
    est_total = a.steps
    while True:
        el = time.time() - t0
        if step >= a.steps or el > a.budget_s:
            break
        # Cosine schedule over the step budget (or the time budget's estimate).
        if step == 50:
            per = el / 50
            est_total = min(a.steps, int(a.budget_s / per))
            log(f"{per * 1000:.0f} ms/step: about {est_total} steps in the budget")
        frac = max(step / max(a.steps, 1), el / a.budget_s)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        chosen, tokens, att = make_batch(train, a.bs, rng)
        lens = att.sum(1)
        anchors = sample_anchors(chosen, a.anchors, rng)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEV == "cuda"):
            tap_rows = taps_of(model, tokens, att, taps)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEV == "cuda"):
            logits = drafter_logits(drafter, embed, head, tokens, tap_rows, anchors, a.block)
        lab = labels_for(tokens, lens, anchors, a.block)[:, :, 1:]
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none", ignore_index=-100)
        ce = ce.view(lab.shape)
        w = w_pos.view(1, 1, -1) * (lab != -100)
        loss = (ce * w).sum() / w.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += int(att.sum())
        if step % a.eval_every == 0 or step == 1:
            acc8, accb = evaluate(drafter, embed, head, model, held, taps, a.block, max_seqs=32)
            with torch.no_grad():
                top1 = ((logits.argmax(-1) == lab) & (lab != -100)).float().sum() / (lab != -100).sum()
            history.append({"step": step, "seconds": round(time.time() - t0, 1), "tokens_seen": tokens_seen,
                            "loss": round(loss.item(), 4), "train_top1": round(top1.item(), 4),
                            "held_accepted_b8": round(acc8, 3), f"held_accepted_b{a.block}": round(accb, 3)})
            log(json.dumps(history[-1]))
    acc8, accb = evaluate(drafter, embed, head, model, held, taps, a.block, max_seqs=len(held))
    history.append({"step": step, "seconds": round(time.time() - t0, 1), "tokens_seen": tokens_seen,
                    "held_accepted_b8": round(acc8, 3), f"held_accepted_b{a.block}": round(accb, 3), "final": True})
    log(json.dumps(history[-1]))
    prev = torch.load(a.resume, map_location="cpu") if a.resume.endswith(".pt") else {}
    ck = {"state": {k: v.detach().to(torch.bfloat16).cpu() for k, v in drafter.state_dict().items()}, "cfg": dcfg,
          "steps": prev.get("steps", 0) + step, "tokens_seen": prev.get("tokens_seen", 0) + tokens_seen,
          "history": prev.get("history", []) + history}
    torch.save(ck, os.path.join(a.work, "drafter.pt"))
    log(f"saved {a.work}/drafter.pt ({ck['steps']} steps, {ck['tokens_seen']} tokens seen in all)")
    del model
    torch.cuda.empty_cache()
    export(a.target, ck, a.out, a.matrix_type, tensors)


# ---------------------------------------------------------------- export

def export(target_path, ck, out, matrix_type, tensors=None):
    os.makedirs(out, exist_ok=True)
    dcfg = ck["cfg"]
    drafter = Drafter(dcfg)
    drafter.load_state_dict({k: v.float() for k, v in ck["state"].items()})
    weights = {k: v.detach().float().cpu().numpy() for k, v in drafter.gguf_weights().items()}
    path = os.path.join(out, "drafter.gguf")
    gguf_io.write_drafter(path, weights, dcfg, target_path, matrix_type,
                          name=f"hearth DFlash drafter ({dcfg['n_layers']}L, {ck['steps']} steps)")
    log(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    json.dump({k: v for k, v in ck.items() if k != "state"}, open(os.path.join(out, "train_log.json"), "w"), indent=1)
    fixture(target_path, path, os.path.join(out, "fixture.json"), tensors)


@torch.no_grad()
def fixture(target_path, drafter_path, out, tensors=None):
    """Logits of the exported drafter (its dequantized weights, float32) on a
    short context, for hearth's test: the target's taps (float32 target) of
    a fixed token sequence, block [anchor, MASK x 7]."""
    dcfg, dt = gguf_io.read_drafter(drafter_path)
    if tensors is None:
        cfg, tensors = gguf_io.read_target(target_path)
    else:
        cfg = gguf_io.read_target(target_path, names=set())[0] | {"vocab_size": int(tensors["token_embd.weight"].shape[0])}
    model = build_target(cfg, tensors, DEV, torch.float32)
    drafter = Drafter(dcfg).to(DEV).float()
    drafter.load_gguf_weights(dt)
    # A fixed chat-rendered context (qwen2.5's template tokens) and its first answer token.
    ids = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950,
           17847, 13, 151645, 198, 151644, 872, 198, 7985, 264, 13027, 729, 429, 4675, 279, 2629, 315, 264,
           1140, 13, 151645, 198, 151644, 77091, 198]
    ids = [t % dcfg_vocab(model) for t in ids]
    tokens = torch.tensor([ids], device=DEV)
    out_t = model(input_ids=tokens)
    anchor = int(out_t.logits[0, -1].argmax())
    tap_rows = taps_of(model, tokens, torch.ones_like(tokens), dcfg["target_layers"]).float()
    seq = torch.tensor([ids + [anchor]], device=DEV)
    block = 8
    anchors = torch.tensor([[len(ids)]], device=DEV)
    taps_full = torch.cat([tap_rows, torch.zeros_like(tap_rows[:, :1])], 1)
    logits = drafter_logits(drafter, model.model.embed_tokens, model.lm_head, seq, taps_full, anchors, block)[0, 0]
    rows = []
    for r in range(block - 1):
        v, i = logits[r].float().topk(20)
        rows.append({"top_ids": i.tolist(), "top_logits": [float(x) for x in v.tolist()]})
    fx = {
        "drafter": os.path.basename(drafter_path),
        "note": "hearth DFlash fixture: PyTorch float32 forward of the exported drafter's dequantized weights",
        "context_ids": ids, "anchor": anchor, "block": block, "mask_token": dcfg["mask_token"],
        "taps": dcfg["target_layers"], "n_ctx": len(ids), "width": tap_rows.shape[-1],
        "hidden_f32_b64": base64.b64encode(tap_rows[0].cpu().numpy().astype("<f4").tobytes()).decode(),
        "rows": rows,
    }
    json.dump(fx, open(out, "w"))
    log(f"wrote {out}: anchor {anchor}, row-1 top ids {rows[0]['top_ids'][:5]}")


def dcfg_vocab(model):
    return model.lm_head.weight.shape[0]


def cmd_export(a):
    ck = torch.load(a.ckpt, map_location="cpu")
    export(a.target, ck, a.out, a.matrix_type)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--target", required=True)
    g.add_argument("--prompts", required=True)
    g.add_argument("--work", required=True)
    g.add_argument("--batch", type=int, default=2048, help="most prompts in one batch")
    g.add_argument("--tok-budget", type=int, default=1_000_000, help="most padded tokens (prompt + answer) in one batch")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-new", type=int, default=320)
    g.add_argument("--budget-s", type=float, default=270)
    g.add_argument("--limit", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--target", required=True)
    t.add_argument("--work", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--layers", type=int, default=3)
    t.add_argument("--ffn", type=int, default=2432)
    t.add_argument("--block", type=int, default=16)
    t.add_argument("--gamma", type=float, default=7.0)
    t.add_argument("--taps", default="")
    t.add_argument("--mask-token", type=int, default=151662)
    t.add_argument("--bs", type=int, default=16)
    t.add_argument("--anchors", type=int, default=32)
    t.add_argument("--max-len", type=int, default=1024)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--steps", type=int, default=100000)
    t.add_argument("--budget-s", type=float, default=420)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--resume", default="")
    t.add_argument("--matrix-type", default="q8_0", choices=["q8_0", "f16", "f32"])
    e = sub.add_parser("export")
    e.add_argument("--target", required=True)
    e.add_argument("--ckpt", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--matrix-type", default="q8_0", choices=["q8_0", "f16", "f32"])
    a = ap.parse_args()
    {"gen": cmd_gen, "train": cmd_train, "export": cmd_export}[a.cmd](a)


if __name__ == "__main__":
    main()
