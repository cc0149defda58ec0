#!/usr/bin/env python3
"""Lane-level emulation of attention.cu's fa_attn (numpy): ldmatrix / ldmatrix.trans
and mma.m16n8k16 fragments as the PTX ISA lays them out, the swizzled K/V tiles,
masks, online softmax, P hi/lo split, key-warp merge and attn_combine, against a
plain reference. Catches indexing bugs without a GPU (not races or timing).
Keep it in step with the kernel by hand.

    python3 scripts/emulate/attention-emulate.py
"""
import numpy as np, math
rng = np.random.default_rng(1)
BK = 32

def ldsm(smem, addrs, trans):
    # addrs: 32 element offsets (halves) into smem (1-D float array); returns regs[lane][4][2]
    out = np.zeros((32, 4, 2))
    for i in range(4):
        mat = np.array([smem[addrs[8 * i + r]: addrs[8 * i + r] + 8] for r in range(8)])  # [row][col]
        for l in range(32):
            if not trans:
                out[l, i] = mat[l // 4, 2 * (l % 4): 2 * (l % 4) + 2]
            else:
                out[l, i] = [mat[2 * (l % 4), l // 4], mat[2 * (l % 4) + 1, l // 4]]
    return out

def mma(c, a, b0, b1):
    # c[32][4], a[32][4][2], b0/b1[32][2]
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, t = l >> 2, l & 3
        for i, (r, cc) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            A[r, cc:cc + 2] = a[l][i]
        B[2 * t:2 * t + 2, g] = b0[l]; B[2 * t + 8:2 * t + 10, g] = b1[l]
    C = A @ B
    for l in range(32):
        g, t = l >> 2, l & 3
        c[l] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]

def r16(x, bf):
    if not bf: return np.float64(np.float16(x))
    u = np.float32(x).view(np.uint32); u = (int(u) + 0x7fff + ((int(u) >> 16) & 1)) & 0xffff0000
    return np.float64(np.uint32(u).view(np.float32))

def run(HD, bf, WR, WK, STAGES, nh, nkv, T, slots, window, pos0, S, q, kc, vc, scale):
    G = nh // nkv; R = G * T; CH = HD // 8; TILE = BK * HD; KW = BK // WK; NKT = KW // 8; KS = HD // 16; DT = HD // 8
    part_o = np.full((T * nh * S, HD), np.nan); part_ml = np.full((T * nh * S, 2), np.nan)
    nrb = 1 if R <= 16 else -(-R // 64)
    for bx in range(nrb):
      for kvh in range(nkv):
        for s in range(S):
            smem = np.zeros(STAGES * 2 * TILE)
            row0 = bx * 16 * WR
            t_first = row0 // G; t_last = (min(R, row0 + 16 * WR) - 1) // G
            c_hi = pos0 + t_last; c_lo = max(0, pos0 + t_first - window + 1) if window > 0 else 0
            chunk = (c_hi - c_lo + S) // S; chunk = (max(chunk, BK) + BK - 1) // BK * BK
            start = c_lo + s * chunk; end = min(start + chunk, c_hi + 1)
            n_tiles = (end - start + BK - 1) // BK if start < end else 0
            def issue(tile):
                if tile >= n_tiles: return
                base = start + tile * BK; ks = (tile % STAGES) * 2 * TILE; vs = ks + TILE
                for i in range(BK * CH):
                    r, c = i // CH, i % CH; p = base + r; ok = p < end
                    slot = p if ok else start
                    if slot >= slots: slot %= slots
                    so = r * HD + ((c ^ (r & 7)) * 8)
                    smem[ks + so: ks + so + 8] = kc[kvh, slot, c * 8:c * 8 + 8] if ok else 0
                    smem[vs + so: vs + so + 8] = vc[kvh, slot, c * 8:c * 8 + 8] if ok else 0
            for i in range(STAGES - 1): issue(i)
            W = WR * WK
            st = []
            for w in range(W):
                rt, kg = w % WR, w // WR
                L = []
                for lane in range(32):
                    gq, tq = lane >> 2, lane & 3
                    d = dict(rlo=[0, 0], rhi=[0, 0], orow=[0, 0], rv=[0, 0])
                    for h in range(2):
                        r = row0 + rt * 16 + gq + 8 * h; rv = r < R; rc = min(r, R - 1); t = rc // G; g = rc % G
                        qp = pos0 + t; lo = max(0, qp - window + 1) if window > 0 else 0
                        d['rv'][h] = rv; d['rlo'][h] = max(lo, start) if rv else 1 << 30
                        d['rhi'][h] = min(qp, end - 1) if rv else -(1 << 30); d['orow'][h] = t * nh + kvh * G + g
                    qa = np.zeros((KS, 4, 2))
                    for k in range(KS):
                        for i in range(4):
                            h, half = i & 1, i >> 1
                            if d['rv'][h]:
                                off = k * 16 + half * 8 + 2 * tq
                                qa[k, i] = [r16(q[d['orow'][h], off], bf), r16(q[d['orow'][h], off + 1], bf)]
                    d['qa'] = qa
                    L.append(d)
                a_lo = min(min(d['rlo']) for d in L); a_hi = max(max(d['rhi']) for d in L)
                f_lo = max(max(d['rlo'][h] if d['rv'][h] else -(1 << 30) for h in range(2)) for d in L)
                f_hi = min(min(d['rhi'][h] if d['rv'][h] else (1 << 30) for h in range(2)) for d in L)
                st.append(dict(L=L, a_lo=a_lo, a_hi=a_hi, f_lo=f_lo, f_hi=f_hi, o=np.zeros((DT, 32, 4)),
                               m=np.full((32, 2), -np.inf), l=np.zeros((32, 2)), rt=rt, kg=kg))
            sl2 = scale * 1.4426950408889634
            for j in range(n_tiles):
                issue(j + STAGES - 1)  # (emulation: the copy lands at once; its buffer was read in j-1)
                for w in range(W):
                    S_ = st[w]; kg = S_['kg']
                    kb = start + j * BK + kg * KW
                    if kb > S_['a_hi'] or kb + KW - 1 < S_['a_lo']: continue
                    kr = kg * KW; ks = (j % STAGES) * 2 * TILE; vs = ks + TILE
                    sc = np.zeros((NKT, 32, 4))
                    for k in range(KS):
                        for np_ in range(NKT // 2):
                            addrs = []
                            for lane in range(32):
                                row = kr + np_ * 16 + ((lane >> 4) << 3) + (lane & 7); c = k * 2 + ((lane >> 3) & 1)
                                addrs.append(ks + row * HD + ((c ^ (row & 7)) * 8))
                            b = ldsm(smem, addrs, False)
                            qa = np.array([S_['L'][l]['qa'][k] for l in range(32)])
                            mma(sc[2 * np_], qa, b[:, 0], b[:, 1]); mma(sc[2 * np_ + 1], qa, b[:, 2], b[:, 3])
                    full = kb >= S_['f_lo'] and kb + KW - 1 <= S_['f_hi']
                    for h in range(2):
                        mx = np.full(32, -np.inf)
                        for lane in range(32):
                            tq = lane & 3
                            for n in range(NKT):
                                for e in range(2):
                                    x = sc[n, lane, 2 * h + e] * sl2
                                    if not full:
                                        p = kb + n * 8 + 2 * tq + e
                                        if p < S_['L'][lane]['rlo'][h] or p > S_['L'][lane]['rhi'][h]: x = -np.inf
                                    sc[n, lane, 2 * h + e] = x; mx[lane] = max(mx[lane], x)
                        mx = np.array([max(mx[(l & ~3) + i] for i in range(4)) for l in range(32)])
                        for lane in range(32):
                            mn = max(S_['m'][lane, h], mx[lane]); base = 0.0 if mn == -np.inf else mn
                            alpha = 2.0 ** (S_['m'][lane, h] - base); S_['m'][lane, h] = mn
                            ssum = 0
                            for n in range(NKT):
                                for e in range(2):
                                    p = 2.0 ** (sc[n, lane, 2 * h + e] - base); sc[n, lane, 2 * h + e] = p; ssum += p
                            S_['l'][lane, h] = S_['l'][lane, h] * alpha + ssum
                            S_['o'][:, lane, 2 * h:2 * h + 2] *= alpha
                    for kk in range(KW // 16):
                        ah = np.zeros((32, 4, 2)); al = np.zeros((32, 4, 2))
                        for lane in range(32):
                            for i, (n, e0) in enumerate([(2 * kk, 0), (2 * kk, 2), (2 * kk + 1, 0), (2 * kk + 1, 2)]):
                                for e in range(2):
                                    p = sc[n, lane, e0 + e]; hi = r16(p, bf); lo = r16(p - hi, bf)
                                    ah[lane, i, e] = hi; al[lane, i, e] = lo
                        for dp in range(DT // 2):
                            addrs = []
                            for lane in range(32):
                                row = kr + kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7); c = dp * 2 + (lane >> 4)
                                addrs.append(vs + row * HD + ((c ^ (row & 7)) * 8))
                            b = ldsm(smem, addrs, True)
                            mma(S_['o'][2 * dp], ah, b[:, 0], b[:, 1]); mma(S_['o'][2 * dp], al, b[:, 0], b[:, 1])
                            mma(S_['o'][2 * dp + 1], ah, b[:, 2], b[:, 3]); mma(S_['o'][2 * dp + 1], al, b[:, 2], b[:, 3])
            # merge key warps into kg == 0
            for w in range(W):
                S0 = st[w]
                if S0['kg'] != 0: continue
                for w2 in range(W):
                    S1 = st[w2]
                    if S1['kg'] == 0 or S1['rt'] != S0['rt']: continue
                    for lane in range(32):
                        for h in range(2):
                            m0, m1 = S0['m'][lane, h], S1['m'][lane, h]; mn = max(m0, m1); base = 0.0 if mn == -np.inf else mn
                            a0, a1 = 2.0 ** (m0 - base), 2.0 ** (m1 - base)
                            S0['l'][lane, h] = S0['l'][lane, h] * a0 + S1['l'][lane, h] * a1; S0['m'][lane, h] = mn
                            S0['o'][:, lane, 2 * h:2 * h + 2] = S0['o'][:, lane, 2 * h:2 * h + 2] * a0 + S1['o'][:, lane, 2 * h:2 * h + 2] * a1
                for h in range(2):
                    for lane in range(32):
                        d = S0['L'][lane]
                        if not d['rv'][h]: continue
                        lt = sum(S0['l'][(lane & ~3) + i, h] for i in range(4))
                        idx = d['orow'][h] * S + s; tq = lane & 3
                        for dt in range(DT):
                            part_o[idx, dt * 8 + 2 * tq: dt * 8 + 2 * tq + 2] = S0['o'][dt, lane, 2 * h:2 * h + 2]
                        if tq == 0: part_ml[idx] = [S0['m'][lane, h] * math.log(2), lt]
    # combine
    out = np.zeros((T * nh, HD))
    for i in range(T * nh):
        ml = part_ml[i * S:(i + 1) * S]; M = ml[:, 0].max()
        w = np.where(ml[:, 0] == -np.inf, 0, np.exp(ml[:, 0] - M))
        out[i] = (w[:, None] * part_o[i * S:(i + 1) * S]).sum(0) / (w * ml[:, 1]).sum()
    return out

def case(nh, nkv, HD, slots, window, pos0, T, S, bf):
    dec = lambda x: np.vectorize(lambda v: r16(v, bf))(x)
    kc = dec(rng.uniform(-1, 1, (nkv, slots, HD))); vc = dec(rng.uniform(-1, 1, (nkv, slots, HD)))
    q = dec(rng.uniform(-1, 1, (T * nh, HD)))
    scale = 1 / math.sqrt(HD)
    G = nh // nkv
    decode = G * T <= 16
    WR, WK = (1, 2) if decode else (4, 1)
    STG = 3 if HD == 128 else 4
    got = run(HD, bf, WR, WK, STG, nh, nkv, T, slots, window, pos0, S, q, kc, vc, scale)
    want = np.zeros_like(got)
    for t in range(T):
        qp = pos0 + t; lo = max(0, qp + 1 - window) if window > 0 else 0
        for h in range(nh):
            kvh = h // G; ps = np.arange(lo, qp + 1) % slots
            sc = kc[kvh, ps] @ q[t * nh + h] * scale; e = np.exp(sc - sc.max())
            want[t * nh + h] = e @ vc[kvh, ps] / e.sum()
    err = math.sqrt(((got - want) ** 2).sum() / (want ** 2).sum())
    print(f"nh {nh} nkv {nkv} hd {HD} slots {slots} win {window} pos {pos0} T {T} S {S} bf {bf}: nrmse {err:.2e}", flush=True)
    assert np.isfinite(got).all() and err < 1e-4

cases = [
    (5, 1, 64, 300, 0, 250, 1, 4, False),   # decode, G=5, empty splits, partial tiles
    (2, 2, 128, 200, 0, 100, 1, 2, True),   # decode hd128 bf16 G=1
    (4, 1, 64, 96, 40, 150, 3, 2, False),   # ring wrapped, rows 12 (d), per-row windows
    (5, 1, 64, 200, 0, 20, 5, 3, True),     # 25 rows (b), causal near start
    (16, 1, 64, 160, 64, 300, 6, 2, False), # 96 rows: 2 row blocks, ring wrapped
    (16, 1, 128, 100, 0, 60, 1, 3, True),   # decode G=16 hd128
    (8, 2, 128, 120, 0, 40, 20, 2, False),  # 80 rows hd128 (b), partial last row block
    (5, 1, 128, 70, 30, 200, 2, 2, False),  # 10 rows (d) on a wrapped ring
    (1, 1, 64, 40, 0, 0, 40, 1, True),      # prefill from 0, G=1
]
for c in cases: case(*c)
