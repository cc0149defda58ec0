//! Continuous batching (`Model::forward_batch`) against the same sequences
//! run one at a time through `Model::forward` (which the parity suite checks
//! bit for bit against llama.cpp): in batch-invariant order a batch of
//! decode steps equals the steps run alone bit for bit, on the packaged
//! qwen2.5-coder-0.5b (Q4_K_M) and gemma3-270m (sliding window); in the
//! batched order, prompt chunks and decode tokens share passes and agree
//! with the solo passes to rounding.

use hearth_kernels::RowOrder;
use hearth_models::packaged::model_path;
use hearth_models::{BatchItem, Input, Logits, Model, State};

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Sequence `i`'s prompt (mixed lengths, ids spread over the vocabulary)
/// and how many tokens it generates.
fn sequence(i: usize, vocab: usize) -> (Vec<u32>, usize) {
    let len = 3 + (i * 37) % 30;
    let ids = (0..len)
        .map(|j| ((i * 7919 + j * 104_729 + 11) % (vocab - 200) + 100) as u32)
        .collect();
    (ids, 3 + (i * 5) % 10)
}

/// Greedy continuation of one sequence alone: prompt in one pass, then one
/// decode pass per token. Returns the tokens and every decode logits row.
fn alone(m: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut st = m.new_state(512);
    let mut logits = m.forward(&mut st, prompt, Logits::Last).unwrap();
    let (mut toks, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&logits);
        toks.push(t);
        logits = m.forward(&mut st, &[t], Logits::Last).unwrap();
        rows.push(logits.clone());
    }
    (toks, rows)
}

fn check_invariant_decode(file: &str, n_seq: usize) {
    let m = Model::load(model_path(file)).unwrap();
    let vocab = m.config.vocab_size;
    let seqs: Vec<(Vec<u32>, usize)> = (0..n_seq).map(|i| sequence(i, vocab)).collect();
    let want: Vec<_> = seqs.iter().map(|(p, n)| alone(&m, p, *n)).collect();

    // Prompts prefilled alone (as the scheduler does in this mode), then
    // every live sequence's next token in one batched pass per step.
    let mut states: Vec<State> = seqs.iter().map(|_| m.new_state(512)).collect();
    let mut last: Vec<Vec<f32>> = seqs
        .iter()
        .zip(&mut states)
        .map(|((p, _), st)| m.forward(st, p, Logits::Last).unwrap())
        .collect();
    let mut got: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![Default::default(); n_seq];
    let mut widest = 0;
    loop {
        let live: Vec<usize> = (0..n_seq).filter(|&i| got[i].0.len() < seqs[i].1).collect();
        if live.is_empty() {
            break;
        }
        widest = widest.max(live.len());
        let toks: Vec<u32> = live.iter().map(|&i| argmax(&last[i])).collect();
        let mut items: Vec<BatchItem<State>> = states
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| live.contains(i))
            .zip(&toks)
            .map(|((_, st), t)| {
                BatchItem::new(st, Input::Tokens(std::slice::from_ref(t)), Logits::Last)
            })
            .collect();
        let out = m.forward_batch(&mut items, RowOrder::Invariant);
        for ((&i, t), row) in live.iter().zip(toks).zip(out) {
            let row = row.unwrap();
            got[i].0.push(t);
            got[i].1.push(row.clone());
            last[i] = row;
        }
    }
    assert_eq!(widest, n_seq, "every sequence decoded in the first batch");
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.0, g.0, "{file}: sequence {i}'s tokens");
        for (step, (a, b)) in w.1.iter().zip(&g.1).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{file}: sequence {i} step {step}: logits differ");
        }
    }
}

#[test]
fn invariant_batched_decode_equals_decoding_alone_qwen2() {
    check_invariant_decode("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 16);
}

#[test]
fn invariant_batched_decode_equals_decoding_alone_gemma3() {
    check_invariant_decode("gemma-3-270m-q4_k_m.gguf", 8);
}

/// Prompt chunks and decode tokens of different sequences in one pass (the
/// default, batched order): a one-item batch is the solo pass exactly; in a
/// mixed batch every row agrees with its solo pass to rounding, and bad
/// items fail alone.
#[test]
fn mixed_batches_of_prefill_and_decode_agree_with_solo_passes() {
    let m = Model::load(model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")).unwrap();
    let vocab = m.config.vocab_size;
    let (p0, _) = sequence(3, vocab);
    let (p1, _) = sequence(7, vocab);
    let (p2, _) = sequence(11, vocab);

    // A one-item batch in the batched order is the solo pass.
    let mut a = m.new_state(512);
    let mut b = m.new_state(512);
    let solo = m.forward(&mut a, &p0, Logits::All).unwrap();
    let mut one = [BatchItem::new(&mut b, Input::Tokens(&p0), Logits::All)];
    let batched = m
        .forward_batch(&mut one, RowOrder::Batched)
        .remove(0)
        .unwrap();
    assert!(solo
        .iter()
        .zip(&batched)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(b.pos, p0.len());

    // Sequence 0 decodes one token, 1 prefills its prompt, 2 prefills half
    // of its prompt (no logits), a fourth item has a token out of range.
    let t0 = argmax(&solo[solo.len() - vocab..]);
    let half = p2.len() / 2;
    let mut ref0 = m.new_state(512);
    m.forward(&mut ref0, &p0, Logits::None).unwrap();
    let want0 = m.forward(&mut ref0, &[t0], Logits::Last).unwrap();
    let want1 = m.forward(&mut m.new_state(512), &p1, Logits::Last).unwrap();
    let (mut s1, mut s2, mut s3) = (m.new_state(512), m.new_state(512), m.new_state(512));
    let bad = [vocab as u32];
    let mut items = [
        BatchItem::new(
            &mut b,
            Input::Tokens(std::slice::from_ref(&t0)),
            Logits::Last,
        ),
        BatchItem::new(&mut s1, Input::Tokens(&p1), Logits::Last),
        BatchItem::new(&mut s2, Input::Tokens(&p2[..half]), Logits::None),
        BatchItem::new(&mut s3, Input::Tokens(&bad), Logits::Last),
    ];
    let out = m.forward_batch(&mut items, RowOrder::Invariant);
    // How far the solo pass itself moves when the same prompt is cut into
    // chunks differently (llama.cpp's batched kernels round by batch shape):
    // the batched pass may move a row as far, not further.
    let worst = |got: &[f32], want: &[f32]| {
        got.iter()
            .zip(want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()))
    };
    let resplit = [1, 2, 3, 5]
        .iter()
        .map(|&split| {
            let mut st = m.new_state(512);
            m.forward(&mut st, &p1[..split], Logits::None).unwrap();
            let got = m.forward(&mut st, &p1[split..], Logits::Last).unwrap();
            worst(&got, &want1)
        })
        .fold(0f32, f32::max);
    let scale = want1.iter().fold(0f32, |a, v| a.max(v.abs()));
    assert!(
        resplit > 0.0 && resplit < 0.05 * scale,
        "re-chunking moved logits by {resplit}"
    );
    let close = |got: &[f32], want: &[f32]| {
        let w = worst(got, want);
        assert!(
            w <= 1.5 * resplit,
            "max |diff| {w}; re-chunking alone moves {resplit}"
        );
        // The top token agrees unless the solo pass has a near tie.
        let (mut top, best) = (want.to_vec(), argmax(want) as usize);
        top[best] = f32::NEG_INFINITY;
        let margin = want[best] - top[argmax(&top) as usize];
        if margin > 2.0 * w {
            assert_eq!(argmax(got), best as u32);
        }
    };
    close(out[0].as_ref().unwrap(), &want0);
    close(out[1].as_ref().unwrap(), &want1);
    assert!(out[2].as_ref().unwrap().is_empty());
    let err = out[3].as_ref().unwrap_err().to_string();
    assert!(err.contains(&vocab.to_string()), "{err}");
    assert_eq!(
        (b.pos, s1.pos, s2.pos, s3.pos),
        (p0.len() + 1, p1.len(), half, 0)
    );

    // Sequence 2 finishes its prompt alone: its KV from the shared pass
    // serves the rest as its own would.
    let rest = m.forward(&mut s2, &p2[half..], Logits::Last).unwrap();
    let mut ref2 = m.new_state(512);
    m.forward(&mut ref2, &p2[..half], Logits::None).unwrap();
    close(
        &rest,
        &m.forward(&mut ref2, &p2[half..], Logits::Last).unwrap(),
    );
}

/// Speculative verify blocks of several sequences in one invariant batched
/// pass (the scheduler's pass when sessions speculate), tapped as a DFlash
/// drafter taps the target (inner layers and the last layer's output), next
/// to a decode token and a prompt chunk: each block's logits rows and tapped
/// hidden rows equal `forward_verify` of that block alone, bit for bit, and
/// the untapped items are unchanged by the taps of the others.
#[test]
fn tapped_verify_blocks_in_a_batch_equal_verify_passes_alone() {
    use hearth_models::Backend;
    let m = Model::load(model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")).unwrap();
    let (vocab, n_layers) = (m.config.vocab_size, m.config.n_layers);
    let taps = [1, n_layers / 2, n_layers];
    let prompts: Vec<Vec<u32>> = [2, 5, 9, 13]
        .iter()
        .map(|&i| sequence(i, vocab).0)
        .collect();
    // Blocks of 1, 3 and 5 rows after sequences 0..3's prompts; sequence 3
    // decodes one token; a fifth state prefills a prompt.
    let blocks: Vec<Vec<u32>> = (0..3)
        .map(|i| sequence(20 + i, vocab).0[..1 + 2 * i].to_vec())
        .collect();
    let prefilled = |p: &[u32]| {
        let mut st = m.new_state(512);
        m.forward(&mut st, p, Logits::None).unwrap();
        st
    };
    let mut want = Vec::new();
    for (p, block) in prompts.iter().zip(&blocks) {
        let mut st = prefilled(p);
        let mut hidden = Vec::new();
        let rows =
            Backend::forward_verify(&m, &mut st, block, Logits::All, &taps, &mut hidden).unwrap();
        want.push((rows, hidden));
    }
    let t3 = [777u32];
    let want3 = m
        .forward(&mut prefilled(&prompts[3]), &t3, Logits::Last)
        .unwrap();
    let p4 = sequence(30, vocab).0;
    let mut st4 = m.new_state(512);
    let want4 = Backend::forward_batch(
        &m,
        &mut [BatchItem::new(&mut st4, Input::Tokens(&p4), Logits::Last)],
        true,
    )
    .remove(0)
    .unwrap();

    let mut states: Vec<State> = prompts.iter().map(|p| prefilled(p)).collect();
    let mut st4 = m.new_state(512);
    let (head, last) = states.split_at_mut(3);
    let mut items: Vec<BatchItem<State>> = head
        .iter_mut()
        .zip(&blocks)
        .map(|(st, b)| BatchItem::new(st, Input::Tokens(b), Logits::All).tapped(&taps))
        .collect();
    items.push(BatchItem::new(
        &mut last[0],
        Input::Tokens(&t3),
        Logits::Last,
    ));
    items.push(BatchItem::new(&mut st4, Input::Tokens(&p4), Logits::Last));
    assert!(Backend::batches_verify(&m));
    let out = Backend::forward_batch(&m, &mut items, true);
    let bits = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    for (i, (w, it)) in want.iter().zip(&items).enumerate() {
        let got = out[i].as_ref().unwrap();
        assert_eq!(got.len(), blocks[i].len() * vocab);
        assert!(
            bits(got, &w.0),
            "block {i}: logits rows differ from its verify pass alone"
        );
        assert_eq!(it.hidden.len(), blocks[i].len() * taps.len() * m.config.dim);
        assert!(
            bits(&it.hidden, &w.1),
            "block {i}: tapped rows differ from its verify pass alone"
        );
    }
    assert!(bits(out[3].as_ref().unwrap(), &want3), "the decode token");
    assert!(items[3].hidden.is_empty() && items[4].hidden.is_empty());
    assert!(bits(out[4].as_ref().unwrap(), &want4), "the prompt chunk");
}
