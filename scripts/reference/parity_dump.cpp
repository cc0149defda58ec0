// parity_dump: a stripped-down llama-completion that records what llama.cpp
// computes, for hearth's forward-pass parity fixtures (scripts/fixtures/make_parity_fixtures.py).
//
//   parity_dump OUT.json TOP_K [llama-completion arguments: -m, -f, -n, -c, -t, --temp 0, ...]
//
// It goes through the same code path as tools/completion/completion.cpp in
// non-conversation mode (-no-cnv): common_params_parse(LLAMA_EXAMPLE_COMPLETION),
// common_init_from_params (incl. warm-up), common_tokenize(ctx, prompt, true, true),
// one common_batch_get_one decode of the whole prompt (prompt <= n_batch, logits
// for the last token only), then per step common_sampler_sample(smpl, ctx, -1),
// accept, decode one token; stop after n_predict tokens or at an EOG token.
//
// Unlike llama-completion it writes token ids and raw logits (llama_get_logits_ith,
// before any sampler) as JSON. Floats are printed with %.9g, which round-trips f32.
// With PARITY_DUMP_LOGITS=FILE in the environment it also writes all n_vocab raw logits
// of the last prompt position to FILE as little-endian f32 (scripts/fixtures/make_muse_fixtures.py).
//
// Built by make_parity_fixtures.py against the static libs of the reference build;
// the binary lives in the cache dir, never in the repo.

#include "arg.h"
#include "common.h"
#include "log.h"
#include "sampling.h"
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

// Indices of the k largest logits, ordered by logit descending, then id ascending.
static std::vector<int> top_k_ids(const float * logits, int n_vocab, int k) {
    std::vector<int> idx(n_vocab);
    std::iota(idx.begin(), idx.end(), 0);
    k = std::min(k, n_vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    idx.resize(k);
    return idx;
}

static std::string hex_bytes(const std::string & s) {
    static const char * digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

static std::string json_str(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    return out + "\"";
}

static void write_ids(FILE * f, const std::vector<int> & ids) {
    fputc('[', f);
    for (size_t i = 0; i < ids.size(); i++) {
        fprintf(f, "%s%d", i ? "," : "", ids[i]);
    }
    fputc(']', f);
}

static void write_top(FILE * f, const float * logits, const std::vector<int> & ids) {
    fprintf(f, "{\"ids\":");
    write_ids(f, ids);
    fprintf(f, ",\"logits\":[");
    for (size_t i = 0; i < ids.size(); i++) {
        fprintf(f, "%s%.9g", i ? "," : "", logits[ids[i]]);
    }
    fprintf(f, "]}");
}

// Token pieces as llama-completion echoes them (special = params.special, false by default).
static void write_pieces(FILE * f, llama_context * ctx, const std::vector<int> & ids, bool special) {
    fputc('[', f);
    for (size_t i = 0; i < ids.size(); i++) {
        fprintf(f, "%s\"%s\"", i ? "," : "", hex_bytes(common_token_to_piece(ctx, ids[i], special)).c_str());
    }
    fputc(']', f);
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.json TOP_K [llama-completion args]\n", argv[0]);
        return 2;
    }
    const char * out_path = argv[1];
    const int    top_k    = atoi(argv[2]);

    std::vector<char *> args = { argv[0] };
    for (int i = 3; i < argc; i++) {
        args.push_back(argv[i]);
    }

    common_params params;
    common_init();
    if (!common_params_parse((int) args.size(), args.data(), params, LLAMA_EXAMPLE_COMPLETION)) {
        return 1;
    }
    llama_backend_init();
    llama_numa_init(params.numa);

    auto llama_init = common_init_from_params(params);
    llama_context *     ctx   = llama_init->context();
    const llama_model * model = llama_init->model();
    common_sampler *    smpl  = llama_init->sampler(0);
    if (ctx == nullptr || model == nullptr || smpl == nullptr) {
        LOG_ERR("failed to init\n");
        return 1;
    }
    const llama_vocab * vocab   = llama_model_get_vocab(model);
    const int           n_vocab = llama_vocab_n_tokens(vocab);

    // completion.cpp, non-conversation branch
    std::vector<llama_token> prompt = common_tokenize(ctx, params.prompt, true, true);
    if (prompt.empty() || (int) prompt.size() > params.n_batch || (int) prompt.size() + params.n_predict > (int) llama_n_ctx(ctx)) {
        LOG_ERR("prompt of %zu tokens does not fit n_batch %d / n_ctx %d\n", prompt.size(), params.n_batch, llama_n_ctx(ctx));
        return 1;
    }
    for (llama_token t : prompt) {
        common_sampler_accept(smpl, t, false);
    }
    {
        common_batch batch = common_batch_get_one(ctx, prompt);
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get())) {
            LOG_ERR("prompt decode failed\n");
            return 1;
        }
    }

    // The raw logits of the last prompt position, copied before the sampler touches anything.
    std::vector<float> prompt_logits(llama_get_logits_ith(ctx, -1), llama_get_logits_ith(ctx, -1) + n_vocab);
    if (const char * path = getenv("PARITY_DUMP_LOGITS")) {
        FILE * fl = fopen(path, "wb");
        if (fl == nullptr || fwrite(prompt_logits.data(), sizeof(float), n_vocab, fl) != (size_t) n_vocab) {
            LOG_ERR("cannot write %s\n", path);
            return 1;
        }
        fclose(fl);
    }

    std::vector<int>                generated;
    std::vector<std::vector<float>> step_top_logits;  // per step: top-5 raw logits
    std::vector<std::vector<int>>   step_top_ids;     // per step: their ids
    bool hit_eog = false;
    for (int step = 0; step < params.n_predict; step++) {
        const float * logits = llama_get_logits_ith(ctx, -1);
        std::vector<int> top = top_k_ids(logits, n_vocab, 5);
        std::vector<float> top_vals;
        for (int id : top) {
            top_vals.push_back(logits[id]);
        }

        const llama_token id = common_sampler_sample(smpl, ctx, -1);
        common_sampler_accept(smpl, id, true);
        generated.push_back(id);
        step_top_ids.push_back(top);
        step_top_logits.push_back(top_vals);

        if (llama_vocab_is_eog(vocab, id)) {
            hit_eog = true;
            break;
        }
        if (step + 1 == params.n_predict) {
            break;
        }
        common_batch batch = common_batch_get_one(ctx, &generated.back(), 1);
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get())) {
            LOG_ERR("decode failed at step %d\n", step);
            return 1;
        }
    }

    std::vector<int> eog_ids;
    for (int id = 0; id < n_vocab; id++) {
        if (llama_vocab_is_eog(vocab, id)) {
            eog_ids.push_back(id);
        }
    }

    FILE * f = fopen(out_path, "w");
    if (f == nullptr) {
        LOG_ERR("cannot open %s\n", out_path);
        return 1;
    }
    fprintf(f, "{\"n_vocab\":%d,\"n_ctx\":%u,\"n_batch\":%u,\"n_ubatch\":%u,\"n_threads\":%d,\"n_threads_batch\":%d,",
            n_vocab, llama_n_ctx(ctx), llama_n_batch(ctx), llama_n_ubatch(ctx), llama_n_threads(ctx), llama_n_threads_batch(ctx));
    fprintf(f, "\"system_info\":%s,\n\"sampler_params\":%s,\n\"sampler_chain\":%s,\n",
            json_str(common_params_get_system_info(params)).c_str(),
            json_str(params.sampling.print()).c_str(),
            json_str(common_sampler_print(smpl)).c_str());
    fprintf(f, "\"swa_full\":%s,\"type_k\":\"%s\",\"type_v\":\"%s\",\"flash_attn_type\":\"%s\",\n",
            params.swa_full ? "true" : "false", ggml_type_name(params.cache_type_k), ggml_type_name(params.cache_type_v),
            llama_flash_attn_type_name(params.flash_attn_type));
    fprintf(f, "\"add_bos\":%s,\"bos_id\":%d,\"eog_ids\":", llama_vocab_get_add_bos(vocab) ? "true" : "false", llama_vocab_bos(vocab));
    write_ids(f, eog_ids);
    fprintf(f, ",\n\"prompt_ids\":");
    write_ids(f, std::vector<int>(prompt.begin(), prompt.end()));
    fprintf(f, ",\n\"prompt_pieces_hex\":");
    write_pieces(f, ctx, std::vector<int>(prompt.begin(), prompt.end()), params.special);
    fprintf(f, ",\n\"prompt_top\":");
    write_top(f, prompt_logits.data(), top_k_ids(prompt_logits.data(), n_vocab, top_k));
    fprintf(f, ",\n\"greedy_ids\":");
    write_ids(f, generated);
    fprintf(f, ",\n\"greedy_pieces_hex\":");
    write_pieces(f, ctx, generated, params.special);
    fprintf(f, ",\n\"hit_eog\":%s,\n\"step_top5\":[", hit_eog ? "true" : "false");
    for (size_t s = 0; s < generated.size(); s++) {
        fprintf(f, "%s\n{\"ids\":", s ? "," : "");
        write_ids(f, step_top_ids[s]);
        fprintf(f, ",\"logits\":[");
        for (size_t i = 0; i < step_top_logits[s].size(); i++) {
            fprintf(f, "%s%.9g", i ? "," : "", step_top_logits[s][i]);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    fclose(f);

    llama_backend_free();
    return 0;
}
