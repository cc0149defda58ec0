"""PyTorch modules of the DFlash pipeline: the target (a Hugging Face Qwen2
built from the GGUF's dequantized weights) and the drafter, whose forward is
the math hearth's `crates/models/src/dflash/forward.rs` runs (llama.cpp
11434's dflash graph):

- context: g = RMSNorm(fc · taps) · enc.output_norm; per layer
  K = RoPE(k_norm(W_k g)), V = W_v g at the context positions;
- block [anchor, MASK, ...] at positions p, p+1, ...: raw target token
  embeddings; pre-norm layers (attn_norm, per-head q/k RMSNorm with gains,
  NeoX RoPE), attention over the visible context plus every block row
  (non-causal), SwiGLU MLP (ffn_norm); output_norm; the target's LM head.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype)


def rope_neox(x, pos, theta):
    """x: [..., T, H, D]; pos: [..., T] (long). NeoX half-split rotation in f32."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) * 2.0 / d)
    ang = pos.float().unsqueeze(-1) * inv  # [..., T, half]
    c, s = ang.cos().unsqueeze(-2), ang.sin().unsqueeze(-2)  # [..., T, 1, half]
    xf = x.float()
    x0, x1 = xf[..., :half], xf[..., half:]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, dim, n_heads, n_kv, hd, ffn):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(dim))
        self.wq = nn.Linear(dim, n_heads * hd, bias=False)
        self.wk = nn.Linear(dim, n_kv * hd, bias=False)
        self.wv = nn.Linear(dim, n_kv * hd, bias=False)
        self.wo = nn.Linear(n_heads * hd, dim, bias=False)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.ffn_norm = nn.Parameter(torch.ones(dim))
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)


class Drafter(nn.Module):
    """cfg: dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, target_layers,
    rope_theta, eps, block_size, mask_token."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        d, n_t = cfg["dim"], len(cfg["target_layers"])
        self.fc = nn.Linear(n_t * d, d, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(d))
        self.layers = nn.ModuleList(
            DraftLayer(d, cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["ffn_dim"])
            for _ in range(cfg["n_layers"])
        )
        self.norm = nn.Parameter(torch.ones(d))

    def init_weights(self, std=0.02):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)
        for l in self.layers:
            nn.init.normal_(l.wo.weight, 0.0, std / math.sqrt(2 * len(self.layers)))
            nn.init.normal_(l.down.weight, 0.0, std / math.sqrt(2 * len(self.layers)))

    def _kv(self, l, x, pos):
        c = self.cfg
        b, t, _ = x.shape
        k = l.wk(x).view(b, t, c["n_kv_heads"], c["head_dim"])
        k = rope_neox(rms_norm(k, l.k_norm, c["eps"]), pos, c["rope_theta"])
        v = l.wv(x).view(b, t, c["n_kv_heads"], c["head_dim"])
        return k, v

    def hidden(self, taps, block_emb, ctx_pos, block_pos, mask):
        """Final-normed hidden states of the block rows.

        taps: [b, Tc, n_t·dim] context features (positions ctx_pos [b, Tc]);
        block_emb: [b, R, dim] block-row embeddings at positions block_pos [b, R];
        mask: [b, R, Tc + R] bool, True where a block row may attend.
        """
        c = self.cfg
        g = rms_norm(self.fc(taps), self.hidden_norm, c["eps"])
        x = block_emb
        b, r, _ = x.shape
        for l in self.layers:
            h = rms_norm(x, l.attn_norm, c["eps"])
            q = l.wq(h).view(b, r, c["n_heads"], c["head_dim"])
            q = rope_neox(rms_norm(q, l.q_norm, c["eps"]), block_pos, c["rope_theta"])
            kb, vb = self._kv(l, h, block_pos)
            kc, vc = self._kv(l, g, ctx_pos)
            k = torch.cat([kc, kb], 1).transpose(1, 2)
            v = torch.cat([vc, vb], 1).transpose(1, 2)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k, v, attn_mask=mask.unsqueeze(1),
                scale=1.0 / math.sqrt(c["head_dim"]), enable_gqa=True,
            )
            x = x + l.wo(y.transpose(1, 2).reshape(b, r, -1))
            h2 = rms_norm(x, l.ffn_norm, c["eps"])
            x = x + l.down(F.silu(l.gate(h2)) * l.up(h2))
        return rms_norm(x, self.norm, c["eps"])

    # GGUF names <-> parameters
    def gguf_weights(self):
        sd = {"fc.weight": self.fc.weight, "enc.output_norm.weight": self.hidden_norm, "output_norm.weight": self.norm}
        for i, l in enumerate(self.layers):
            p = f"blk.{i}."
            sd.update({
                p + "attn_norm.weight": l.attn_norm, p + "attn_q.weight": l.wq.weight,
                p + "attn_k.weight": l.wk.weight, p + "attn_v.weight": l.wv.weight,
                p + "attn_output.weight": l.wo.weight, p + "attn_q_norm.weight": l.q_norm,
                p + "attn_k_norm.weight": l.k_norm, p + "ffn_norm.weight": l.ffn_norm,
                p + "ffn_gate.weight": l.gate.weight, p + "ffn_up.weight": l.up.weight,
                p + "ffn_down.weight": l.down.weight,
            })
        return sd

    def load_gguf_weights(self, tensors):
        with torch.no_grad():
            for name, p in self.gguf_weights().items():
                p.copy_(torch.from_numpy(tensors[name]).to(p.device, p.dtype))


def block_rows(drafter, embed, tokens, anchors, block, mask_token):
    """Block inputs for anchors [b, A] of sequences tokens [b, T]:
    ids [b, A·block] = [tokens[p], MASK, ...] and positions p + t."""
    b, a = anchors.shape
    t = torch.arange(block, device=tokens.device)
    pos = (anchors.unsqueeze(-1) + t).reshape(b, a * block)
    ids = torch.full((b, a, block), mask_token, device=tokens.device, dtype=torch.long)
    ids[:, :, 0] = torch.gather(tokens, 1, anchors)
    return embed(ids.reshape(b, a * block)).float(), pos


def attention_mask(anchors, block, n_ctx):
    """[b, A·block, n_ctx + A·block]: row (a, t) sees context positions < p_a
    and every row of its own block."""
    b, a = anchors.shape
    dev = anchors.device
    ctx = torch.arange(n_ctx, device=dev)
    see_ctx = ctx.view(1, 1, 1, n_ctx) < anchors.view(b, a, 1, 1)  # [b, a, 1, Tc]
    see_ctx = see_ctx.expand(b, a, block, n_ctx).reshape(b, a * block, n_ctx)
    own = torch.arange(a, device=dev).repeat_interleave(block)
    see_blk = (own.view(-1, 1) == own.view(1, -1)).unsqueeze(0).expand(b, -1, -1)
    return torch.cat([see_ctx, see_blk], dim=-1)


def build_target(cfg, tensors, device, dtype):
    """A transformers Qwen2ForCausalLM holding the GGUF's (dequantized) weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hc = Qwen2Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["dim"], intermediate_size=cfg["ffn_dim"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
        num_key_value_heads=cfg["n_kv_heads"], max_position_embeddings=cfg["context_length"],
        rms_norm_eps=cfg["eps"], tie_word_embeddings=False, use_sliding_window=False,
        rope_theta=cfg["rope_theta"],
    )
    if getattr(hc, "rope_parameters", None) is not None:
        hc.rope_parameters = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    hc._attn_implementation = "sdpa"
    with torch.device(device):
        m = Qwen2ForCausalLM(hc)
    m = m.to(dtype)
    sd = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight" if "output.weight" in tensors else "token_embd.weight"}
    for i in range(cfg["n_layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        for hf, gg in [("input_layernorm.weight", "attn_norm.weight"),
                       ("post_attention_layernorm.weight", "ffn_norm.weight"),
                       ("self_attn.q_proj.weight", "attn_q.weight"), ("self_attn.q_proj.bias", "attn_q.bias"),
                       ("self_attn.k_proj.weight", "attn_k.weight"), ("self_attn.k_proj.bias", "attn_k.bias"),
                       ("self_attn.v_proj.weight", "attn_v.weight"), ("self_attn.v_proj.bias", "attn_v.bias"),
                       ("self_attn.o_proj.weight", "attn_output.weight"),
                       ("mlp.gate_proj.weight", "ffn_gate.weight"), ("mlp.up_proj.weight", "ffn_up.weight"),
                       ("mlp.down_proj.weight", "ffn_down.weight")]:
            sd[p + hf] = g + gg
    state = {k: torch.from_numpy(tensors[v]) for k, v in sd.items()}
    missing, unexpected = m.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise SystemExit(f"target weights: missing {missing}, unexpected {unexpected}")
    # The rotary frequencies must be the GGUF's base (checked, not assumed).
    hd = cfg["head_dim"]
    want = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    for name, buf in m.named_buffers():
        if name.endswith("inv_freq"):
            if not torch.allclose(buf.float().cpu(), want, rtol=1e-5):
                buf.copy_(want.to(buf.device, buf.dtype))
                print(f"note: set {name} to base {cfg['rope_theta']}")
    m.eval()
    m.requires_grad_(False)
    return m
