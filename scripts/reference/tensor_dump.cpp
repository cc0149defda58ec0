// Debug aid: runs one prompt through llama.cpp (any llama-completion
// arguments, e.g. -ctk q8_0 -ctv q8_0 -fa on) and writes every f32
// contiguous tensor of the graph to $DUMP_DIR/<name>.<k>.bin (k counts
// tensors of the same name), for diffing against hearth's
// `HEARTH_DUMP=DIR cargo run --release -p hearth-models --example logits`.
// Built against the reference build like parity_dump.cpp:
//   python3 -c "import sys; sys.path.insert(0, 'scripts/fixtures'); import make_parity_fixtures as m; \
//     from pathlib import Path; print(m.compile_against_reference(Path('BIN_DIR'), \
//     Path('scripts/reference/tensor_dump.cpp').resolve(), 'parity-dump/tensor_dump', ['common', 'vendor', 'include', 'ggml/include']))"
//   DUMP_DIR=/tmp/d tensor_dump -m MODEL.gguf -p "PROMPT" -t 2 -c 2048
#include "arg.h"
#include "common.h"
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

static std::map<std::string, int> seen;

static bool dump_tensor(struct ggml_tensor * t, bool ask, void *) {
    const bool want = t->type == GGML_TYPE_F32 && ggml_is_contiguous(t);
    if (ask || !want) {
        return want || !ask;
    }
    const std::string name = t->name;
    const int k = seen[name]++;
    std::vector<float> buf(ggml_nelements(t));
    memcpy(buf.data(), t->data, ggml_nbytes(t));
    const std::string path = std::string(getenv("DUMP_DIR")) + "/" + name + "." + std::to_string(k) + ".bin";
    FILE * f = fopen(path.c_str(), "wb");
    if (f) {
        fwrite(buf.data(), sizeof(float), buf.size(), f);
        fclose(f);
    }
    return true;
}

int main(int argc, char ** argv) {
    if (!getenv("DUMP_DIR")) {
        fprintf(stderr, "set DUMP_DIR to the directory for the tensors\n");
        return 1;
    }
    common_params params;
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_COMMON)) {
        return 1;
    }
    llama_backend_init();
    params.cb_eval = dump_tensor;
    params.cb_eval_user_data = nullptr;
    params.warmup = false;
    auto init = common_init_from_params(params);
    llama_context * ctx = init->context();
    if (ctx == nullptr) {
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(init->model());
    std::vector<llama_token> tokens = common_tokenize(ctx, params.prompt, llama_vocab_get_add_bos(vocab), true);
    common_batch batch = common_batch_get_one(ctx, tokens);
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get())) {
        return 1;
    }
    fprintf(stderr, "%zu tokens\n", tokens.size());
    return 0;
}
