// teacher_dump: llama.cpp's greedy continuations of a few prompts, as token
// ids, for comparing another runtime with llama.cpp on a real model
// (bench/cuda/scripts/real-model-agreement.sh: hearth's teacher-forced top-1
// agreement and greedy text on the GPU against llama.cpp's CUDA backend).
//
//   teacher_dump MODEL.gguf PROMPTS.txt N_GEN OUT.json [N_GPU_LAYERS=99 [THREADS]]
//
// PROMPTS.txt holds one prompt per line ("\n" in a line stands for a newline).
// Each prompt is tokenized as llama-completion does without a chat template
// (llama_tokenize with add_special = true, parse_special = false), decoded in
// one batch, then continued for N_GEN tokens: every step takes the argmax of
// the raw logits (lowest id on ties) and decodes it, EOG tokens included (the
// continuation does not stop, so every prompt gives N_GEN positions).
// Flash attention is on, as in hearth's `--device cuda` and `llama-bench -fa 1`.
//
// Built against the static or shared libraries of a llama.cpp build:
//   g++ -O2 -std=c++17 scripts/reference/teacher_dump.cpp -I$SRC/include -I$SRC/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -o teacher_dump

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

static std::string unescape(const std::string & line) {
    std::string out;
    for (size_t i = 0; i < line.size(); i++) {
        if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == 'n') {
            out += '\n';
            i++;
        } else {
            out += line[i];
        }
    }
    return out;
}

static std::string json_string(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    return out + "\"";
}

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

static void die(const char * what) {
    fprintf(stderr, "teacher_dump: %s\n", what);
    exit(1);
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        die("usage: teacher_dump MODEL.gguf PROMPTS.txt N_GEN OUT.json [N_GPU_LAYERS]");
    }
    const int n_gen = atoi(argv[3]);
    const int ngl = argc > 5 ? atoi(argv[5]) : 99;
    const int threads = argc > 6 ? atoi(argv[6]) : 0;
    std::vector<std::string> prompts;
    {
        std::ifstream in(argv[2]);
        std::string line;
        while (std::getline(in, line)) {
            if (!line.empty()) {
                prompts.push_back(unescape(line));
            }
        }
    }
    if (prompts.empty()) {
        die("no prompts");
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        die("cannot load the model");
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    if (threads > 0) {
        // The CPU's flash attention splits a step's keys between threads, so
        // its last bits depend on the thread count (hearth's CPU numerics
        // follow llama.cpp run with as many threads as hearth's pool).
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create a context");
    }

    std::string json = "{\"n_gen\": " + std::to_string(n_gen) + ", \"prompts\": [";
    for (size_t p = 0; p < prompts.size(); p++) {
        const std::string & text = prompts[p];
        std::vector<llama_token> ids(text.size() + 16);
        int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), true, false);
        if (n < 0) {
            die("tokenize failed");
        }
        ids.resize(n);
        llama_memory_clear(llama_get_memory(ctx), true);

        llama_batch batch = llama_batch_init((int) ids.size(), 0, 1);
        batch.n_tokens = (int) ids.size();
        for (int i = 0; i < batch.n_tokens; i++) {
            batch.token[i] = ids[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i == batch.n_tokens - 1;
        }
        if (llama_decode(ctx, batch) != 0) {
            die("decode of the prompt failed");
        }
        llama_batch_free(batch);

        std::vector<int> gen;
        int pos = (int) ids.size();
        llama_batch one = llama_batch_init(1, 0, 1);
        for (int k = 0; k < n_gen; k++) {
            const int next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            gen.push_back(next);
            if (k + 1 == n_gen) {
                break;
            }
            one.n_tokens = 1;
            one.token[0] = next;
            one.pos[0] = pos++;
            one.n_seq_id[0] = 1;
            one.seq_id[0][0] = 0;
            one.logits[0] = 1;
            if (llama_decode(ctx, one) != 0) {
                die("decode of a generated token failed");
            }
        }
        llama_batch_free(one);

        json += p ? ", " : "";
        json += "{\"text\": " + json_string(text) + ", \"prompt_ids\": [";
        for (size_t i = 0; i < ids.size(); i++) {
            json += (i ? ", " : "") + std::to_string(ids[i]);
        }
        json += "], \"greedy_ids\": [";
        for (size_t i = 0; i < gen.size(); i++) {
            json += (i ? ", " : "") + std::to_string(gen[i]);
        }
        json += "]}";
        fprintf(stderr, "teacher_dump: prompt %zu: %zu prompt tokens, %d generated\n", p, ids.size(), n_gen);
    }
    json += "]}\n";
    FILE * f = fopen(argv[4], "w");
    if (!f) {
        die("cannot write the output");
    }
    fputs(json.c_str(), f);
    fclose(f);

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
