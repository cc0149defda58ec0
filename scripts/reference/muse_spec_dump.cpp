// muse_spec_dump: llama-speculative-simple (examples/speculative-simple in llama.cpp 11434)
// with a dump of what the DFlash / DFlash2 drafter computes, for hearth's Muse Glimmer
// speculative fixtures (scripts/fixtures/make_muse_fixtures.py).
//
//   muse_spec_dump OUT_PREFIX [llama-speculative-simple arguments: -m TARGET -md DRAFT -f PROMPT ...]
//
// The decode loop is speculative-simple's, unchanged: common_speculative_init with the
// draft type read from the draft GGUF, prompt (all but the last token) decoded on the
// target and fed to common_speculative_process (the drafter's KV injection), then per
// round common_speculative_draft -> verify [id_last, draft...] on the target ->
// common_sampler_sample_and_accept_n -> common_speculative_accept.
//
// Extra output, right after each common_speculative_draft (before anything else runs on
// the draft context):
//   DFlash1: the draft context's raw logits of every row of the noise block
//            (llama_get_logits_ith(ctx_dft, i), i = 0 .. n_block-1), appended as f32 to
//            OUT_PREFIX.rows.bin (needs --no-spec-draft-backend-sampling so the logits
//            are copied out);
//   DFlash2: the selector lattice, llama_get_embeddings_nextn(ctx_dft), rows 0 .. n_block-1
//            of n_embd_dft floats each, appended to OUT_PREFIX.rows.bin.
// OUT_PREFIX.json lists, per round: n_past, id_last, the draft, the accepted ids, and the
// row range in the .bin. Floats in JSON are %.9g (round-trips f32).
//
// Built by make_muse_fixtures.py against the static libs of the reference build (it
// needs src/llama-ext.h); the binary lives in the cache dir, never in the repo.

#include "arg.h"
#include "common.h"
#include "log.h"
#include "sampling.h"
#include "speculative.h"
#include "llama.h"
#include "llama-ext.h"

#include <algorithm>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static void write_ids(FILE * f, const std::vector<llama_token> & ids) {
    fputc('[', f);
    for (size_t i = 0; i < ids.size(); i++) {
        fprintf(f, "%s%d", i ? "," : "", ids[i]);
    }
    fputc(']', f);
}

struct round_rec {
    int n_past;
    llama_token id_last;
    std::vector<llama_token> draft;
    std::vector<llama_token> accepted;
    long row_beg = -1;  // first row in the .bin
    int  n_rows  = 0;
    bool restored = false;
};

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT_PREFIX [llama-speculative-simple args]\n", argv[0]);
        return 2;
    }
    const std::string out_prefix = argv[1];
    std::vector<char *> args = { argv[0] };
    for (int i = 2; i < argc; i++) {
        args.push_back(argv[i]);
    }

    common_params params;
    common_init();
    if (!common_params_parse((int) args.size(), args.data(), params, LLAMA_EXAMPLE_SPECULATIVE)) {
        return 1;
    }

    const auto output_limits = common_speculative_get_output_limits(
            params.n_batch, params.n_parallel, common_speculative_n_max(&params.speculative));
    params.n_outputs_max = output_limits.total;
    params.n_outputs_max_per_seq = output_limits.per_seq;

    llama_backend_init();
    llama_numa_init(params.numa);

    auto llama_init_tgt = common_init_from_params(params);
    llama_model *   model_tgt = llama_init_tgt->model();
    llama_context * ctx_tgt   = llama_init_tgt->context();
    const llama_vocab * vocab = llama_model_get_vocab(model_tgt);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    common_speculative_init_result_ptr spec_init;
    {
        common_params params_dft = common_base_params_to_speculative(params);
        spec_init = common_speculative_init_from_params(params_dft, model_tgt, ctx_tgt);
        params.speculative.draft.ctx_tgt = ctx_tgt;
        params.speculative.draft.ctx_dft = spec_init->context();
    }
    llama_context * ctx_dft = params.speculative.draft.ctx_dft;
    if (ctx_dft == nullptr) {
        LOG_ERR("no draft context\n");
        return 1;
    }
    const llama_model * model_dft = llama_get_model(ctx_dft);
    const int  n_embd_dft = llama_model_n_embd(model_dft);
    const int  top_k_sel  = llama_model_dflash_selector_top_k(model_dft);
    const bool is_dflash2 = top_k_sel > 0;

    const bool use_ckpt_tgt = common_context_can_seq_rm(ctx_tgt) == COMMON_CONTEXT_SEQ_RM_TYPE_FULL;
    const bool use_ckpt_dft = common_context_can_seq_rm(ctx_dft) == COMMON_CONTEXT_SEQ_RM_TYPE_FULL;

    std::vector<llama_token> inp = common_tokenize(ctx_tgt, params.prompt, true, true);
    if (inp.empty() || llama_n_batch(ctx_tgt) < (uint32_t) inp.size() || llama_n_ctx(ctx_tgt) < (uint32_t) inp.size()) {
        LOG_ERR("prompt does not fit\n");
        return 1;
    }

    int n_predict = 0;
    bool has_eos = false;
    llama_seq_id seq_id = 0;

    common_sampler_ptr smpl(common_sampler_init(model_tgt, params.sampling));
    struct common_speculative * spec = common_speculative_init(params.speculative, 1);
    if (spec == nullptr) {
        LOG_ERR("failed to initialize speculative decoding\n");
        return 1;
    }
    {
        common_batch batch_prompt(ctx_tgt);
        for (size_t i = 0; i < inp.size() - 1; ++i) {
            batch_prompt.add(inp[i], i, seq_id, false);
        }
        llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_prompt.get());
        if (!common_speculative_process(spec, batch_prompt)) {
            LOG_ERR("failed to process speculative prompt\n");
            return 1;
        }
    }
    llama_token id_last = inp.back();
    llama_tokens prompt_tgt(inp.begin(), inp.end() - 1);
    prompt_tgt.reserve(llama_n_ctx(ctx_tgt));
    int n_past = inp.size() - 1;
    common_speculative_begin(spec, seq_id, prompt_tgt);

    common_batch batch_tgt(ctx_tgt);
    llama_tokens draft;
    common_prompt_checkpoint ckpt;

    FILE * fbin = fopen((out_prefix + ".rows.bin").c_str(), "wb");
    if (fbin == nullptr) {
        LOG_ERR("cannot open %s.rows.bin\n", out_prefix.c_str());
        return 1;
    }
    long n_rows_written = 0;
    std::vector<round_rec> rounds;
    std::vector<llama_token> generated;
    const int n_block = common_speculative_n_max(&params.speculative) + 1;

    while (true) {
        round_rec rec;
        rec.n_past  = n_past;
        rec.id_last = id_last;
        if (draft.empty()) {
            ckpt.update_pos(prompt_tgt.size(),
                    llama_memory_seq_pos_min(llama_get_memory(ctx_tgt), seq_id),
                    llama_memory_seq_pos_max(llama_get_memory(ctx_tgt), seq_id));
            if (use_ckpt_dft) {
                ckpt.update_dft(ctx_dft, seq_id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            int n_draft_max = (int) llama_n_ctx(ctx_tgt) - n_past - 2;
            if (params.n_predict >= 0) {
                n_draft_max = std::min(n_draft_max, params.n_predict - n_predict - 1);
            }
            n_draft_max = std::max(n_draft_max, 0);
            common_speculative_get_draft_params(spec, seq_id) = {
                /* .drafting   = */ true,
                /* .n_max      = */ n_draft_max,
                /* .pos0       = */ n_past,
                /* .id_last    = */ id_last,
                /* .prompt     = */ &prompt_tgt,
                /* .result     = */ &draft,
            };
            common_speculative_draft(spec);

            // --- dump: the draft context's output of this noise block ---
            rec.row_beg = n_rows_written;
            for (int i = 0; i < n_block; i++) {
                const float * row = nullptr;
                size_t n = 0;
                if (is_dflash2) {
                    const float * lat = llama_get_embeddings_nextn(ctx_dft);
                    row = lat ? lat + (size_t) i * n_embd_dft : nullptr;
                    n = n_embd_dft;
                } else {
                    row = llama_get_logits_ith(ctx_dft, i);
                    n = n_vocab;
                }
                if (row == nullptr) {
                    LOG_ERR("no draft output for row %d\n", i);
                    return 1;
                }
                fwrite(row, sizeof(float), n, fbin);
                n_rows_written++;
                rec.n_rows++;
            }
            rec.draft = draft;

            if (!draft.empty() && use_ckpt_tgt) {
                ckpt.update_tgt(ctx_tgt, seq_id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            if (use_ckpt_dft) {
                ckpt.load_dft(ctx_dft, seq_id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, ckpt.pos_max + 1, -1);
        } else {
            rec.draft = draft;
            rec.restored = true;
        }

        batch_tgt.clear();
        batch_tgt.add(id_last, n_past++, seq_id, true);
        for (size_t i = 0; i < draft.size(); ++i) {
            batch_tgt.add(draft[i], n_past + i, seq_id, true);
        }
        llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get());
        if (!common_speculative_process(spec, batch_tgt)) {
            LOG_ERR("failed to process speculative batch\n");
            break;
        }
        common_sampler_ptr smpl_save;
        if (use_ckpt_tgt) {
            smpl_save.reset(common_sampler_clone(smpl.get()));
        }
        const size_t n_draft = draft.size();
        auto ids = common_sampler_sample_and_accept_n(smpl.get(), ctx_tgt, draft);
        GGML_ASSERT(ids.size() > 0);
        rec.accepted = ids;
        rounds.push_back(rec);

        if (use_ckpt_tgt && ids.size() - 1 < n_draft) {
            draft = std::move(ids);
            ckpt.load_tgt(ctx_tgt, seq_id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq_id, ckpt.pos_max + 1, -1);
            ckpt.load_dft(ctx_dft, seq_id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, ckpt.pos_max + 1, -1);
            prompt_tgt.resize(ckpt.n_tokens);
            smpl = std::move(smpl_save);
            n_past = (int) prompt_tgt.size();
            continue;
        }

        common_speculative_accept(spec, seq_id, ids.size() - 1);
        n_past    += ids.size() - 1;
        n_predict += ids.size();
        for (size_t i = 0; i < ids.size(); ++i) {
            prompt_tgt.push_back(id_last);
            id_last = ids[i];
            generated.push_back(id_last);
            if (llama_vocab_is_eog(vocab, id_last)) {
                has_eos = true;
                break;
            }
        }
        draft.clear();
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq_id, n_past, -1);
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, n_past, -1);
        if ((params.n_predict >= 0 && n_predict > params.n_predict) || has_eos) {
            break;
        }
    }
    fclose(fbin);

    FILE * f = fopen((out_prefix + ".json").c_str(), "w");
    if (f == nullptr) {
        return 1;
    }
    char meta[256] = {};
    std::string spec_type = "?";
    if (llama_model_meta_val_str(model_dft, "general.architecture", meta, sizeof(meta)) >= 0) {
        spec_type = meta;
    }
    fprintf(f, "{\"n_vocab\":%d,\"n_embd_dft\":%d,\"is_dflash2\":%s,\"selector_top_k\":%d,\"n_block\":%d,",
            n_vocab, n_embd_dft, is_dflash2 ? "true" : "false", top_k_sel, n_block);
    fprintf(f, "\"row_floats\":%d,\"use_ckpt_tgt\":%s,\"use_ckpt_dft\":%s,\"draft_arch\":\"%s\",\n",
            is_dflash2 ? n_embd_dft : n_vocab, use_ckpt_tgt ? "true" : "false", use_ckpt_dft ? "true" : "false",
            spec_type.c_str());
    fprintf(f, "\"n_ctx\":%u,\"n_ctx_dft\":%u,\"n_ubatch\":%u,\"n_threads\":%d,\"mask_token_id\":%d,\n",
            llama_n_ctx(ctx_tgt), llama_n_ctx(ctx_dft), llama_n_ubatch(ctx_tgt), llama_n_threads(ctx_tgt),
            llama_vocab_mask(llama_model_get_vocab(model_dft)));
    fprintf(f, "\"target_layer_ids\":[");
    for (uint32_t k = 0; k < llama_model_target_layer_ids_n(model_dft); k++) {
        fprintf(f, "%s%d", k ? "," : "", llama_model_target_layer_ids(model_dft)[k]);
    }
    fprintf(f, "],\n\"prompt_ids\":");
    write_ids(f, inp);
    fprintf(f, ",\n\"generated_ids\":");
    write_ids(f, generated);
    fprintf(f, ",\n\"rounds\":[");
    for (size_t r = 0; r < rounds.size(); r++) {
        const auto & rc = rounds[r];
        fprintf(f, "%s\n{\"n_past\":%d,\"id_last\":%d,\"restored\":%s,\"row_beg\":%ld,\"n_rows\":%d,\"draft\":",
                r ? "," : "", rc.n_past, rc.id_last, rc.restored ? "true" : "false", rc.row_beg, rc.n_rows);
        write_ids(f, rc.draft);
        fprintf(f, ",\"accepted\":");
        write_ids(f, rc.accepted);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
    fclose(f);

    common_speculative_free(spec);
    llama_backend_free();
    return 0;
}
