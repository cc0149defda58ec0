// mtmd_vision_dump: what llama.cpp 11434's libmtmd makes of images, for hearth's vision
// fixtures (scripts/fixtures/make_vision_fixtures.py) and the encode benchmark.
//
//   mtmd_vision_dump TEXT.gguf MMPROJ.gguf OUT_DIR [-t THREADS] [--no-encode] [--tensors DIR] INPUT...
//
// INPUT is an image file (decoded by mtmd's stb_image helper) or `pattern:WxH`, the spec's
// synthetic image (vision.md §12.2: R = (37x + 11y) mod 256, G = 255 in the top-left
// third-by-half else 16, B = (x² + 3y²) mod 256). Per input, in order:
//   - preprocessing: mtmd_image_preprocessor_muse_glimmer (the same object mtmd uses) on
//     the decoded RGB; the normalized f32 image is mapped back to bytes
//     (round((v·std + mean)·255)) and written to OUT_DIR/<i>.pre.rgb;
//   - encoding (unless --no-encode): mtmd_tokenize on the default marker, then
//     mtmd_encode_chunk + mtmd_get_output_embd of the image chunk, written as f32 to
//     OUT_DIR/<i>.embd.f32 ([n_tokens, n_embd], row-major), timed around mtmd_encode_chunk.
// --tensors DIR: every graph node the clip graph computes (the eval callback) written to
// DIR/<node index>.<name>.f32 as f32 in ggml's element order (ne0 fastest), with its shape in
// DIR/index.tsv (index, name, op, type, ne0..ne3); a later encode overwrites an earlier one
// (so the last input's last encode is what stays).
// On stdout: a first JSON line with llama.cpp's build and system info, then one JSON line per
// input: input, width, height, pre_w, pre_h, n_tokens, n_embd, encode_ms. The text model only provides the vocabulary (for the <|image_start|> /
// <|image_end|> text around the image); it is loaded vocab-only (so mtmd's width check
// against it is skipped; the rows' width is the projector's).
// Context parameters are mtmd's defaults (as llama-mtmd-cli's): the warmup encode runs,
// and it is what turns flash attention on for the CPU backend (CLIP_FLASH_ATTN_TYPE_AUTO).
//
// Built by make_vision_fixtures.py against the static libs of the reference build (it uses
// the internal mtmd-image.h / clip-impl.h); the binary lives in the cache dir.

#include "build-info.h"
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include "clip.h"
#include "clip-impl.h"
#include "clip-model.h"
#include "mtmd-image.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static bool write_file(const std::string & path, const void * data, size_t n) {
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) {
        return false;
    }
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static std::vector<unsigned char> pattern(int w, int h) {
    std::vector<unsigned char> px((size_t) w * h * 3);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            unsigned char * p = &px[((size_t) y * w + x) * 3];
            p[0] = (unsigned char) ((37 * x + 11 * y) % 256);
            p[1] = (x < w / 3 && y < h / 2) ? 255 : 16;
            p[2] = (unsigned char) (((long) x * x + 3L * y * y) % 256);
        }
    }
    return px;
}

struct TensorDump {
    std::string dir;
    int index = 0;
    FILE * tsv = nullptr;
};

static bool dump_tensor(struct ggml_tensor * t, bool ask, void * user_data) {
    if (ask) {
        return true;
    }
    auto * d = (TensorDump *) user_data;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_I32) {
        return true;
    }
    const auto * data = (const uint8_t *) t->data;
    std::vector<float> out;
    out.reserve(ggml_nelements(t));
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    const uint8_t * p = data + i3 * t->nb[3] + i2 * t->nb[2] + i1 * t->nb[1] + i0 * t->nb[0];
                    float v = 0.0f;
                    if (t->type == GGML_TYPE_F32) {
                        memcpy(&v, p, 4);
                    } else if (t->type == GGML_TYPE_F16) {
                        v = ggml_fp16_to_fp32(*(const ggml_fp16_t *) p);
                    } else {
                        v = (float) *(const int32_t *) p;
                    }
                    out.push_back(v);
                }
            }
        }
    }
    if (d->index == 0 || !d->tsv) {
        d->tsv = fopen((d->dir + "/index.tsv").c_str(), "w");
    }
    std::string name = t->name;
    std::replace(name.begin(), name.end(), '/', '_');
    std::replace(name.begin(), name.end(), ' ', '_');
    const std::string path = d->dir + "/" + std::to_string(d->index) + "." + name + ".f32";
    write_file(path, out.data(), out.size() * sizeof(float));
    fprintf(d->tsv, "%d\t%s\t%s\t%s\t%lld\t%lld\t%lld\t%lld\n", d->index, name.c_str(), ggml_op_desc(t),
            ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2],
            (long long) t->ne[3]);
    fflush(d->tsv);
    d->index++;
    return true;
}

static void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf OUT_DIR [-t THREADS] [--no-encode] INPUT...\n", argv[0]);
        return 2;
    }
    const std::string text_path = argv[1], mmproj_path = argv[2], out_dir = argv[3];
    int n_threads = 2;
    bool encode = true;
    std::vector<std::string> inputs;
    TensorDump tensors;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--tensors") && i + 1 < argc) {
            tensors.dir = argv[++i];
        } else if (!strcmp(argv[i], "--no-encode")) {
            encode = false;
        } else {
            inputs.push_back(argv[i]);
        }
    }
    llama_log_set(quiet_log, nullptr);
    mtmd_helper_log_set(quiet_log, nullptr);
    llama_backend_init();
    printf("{\"llama_cpp\": \"%s\", \"system_info\": \"%s\"}\n", llama_build_info(), llama_print_system_info());

    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(text_path.c_str(), mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", text_path.c_str());
        return 1;
    }
    mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false;
    cp.n_threads = n_threads;
    cp.print_timings = false;
    if (!tensors.dir.empty()) {
        cp.cb_eval = dump_tensor;
        cp.cb_eval_user_data = &tensors;
    }
    mtmd_context * ctx = mtmd_init_from_file(mmproj_path.c_str(), model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot load %s\n", mmproj_path.c_str());
        return 1;
    }
    // A second, metadata-only clip context for the preprocessor object.
    clip_context_params ccp = {};
    ccp.use_gpu = false;
    ccp.flash_attn_type = CLIP_FLASH_ATTN_TYPE_AUTO;
    ccp.no_alloc = true;
    clip_init_result cr = clip_init(mmproj_path.c_str(), ccp);
    if (!cr.ctx_v) {
        fprintf(stderr, "clip_init failed for %s\n", mmproj_path.c_str());
        return 1;
    }
    const clip_hparams & hp = *clip_get_hparams(cr.ctx_v);
    mtmd_image_preprocessor_muse_glimmer pre(cr.ctx_v);

    for (size_t ii = 0; ii < inputs.size(); ii++) {
        const std::string & in = inputs[ii];
        mtmd_bitmap * bmp = nullptr;
        int pw = 0, ph = 0;
        if (in.rfind("pattern:", 0) == 0 && sscanf(in.c_str() + 8, "%dx%d", &pw, &ph) == 2) {
            std::vector<unsigned char> px = pattern(pw, ph);
            bmp = mtmd_bitmap_init(pw, ph, px.data());
        } else {
            bmp = mtmd_helper_bitmap_init_from_file(ctx, in.c_str(), false, mtmd_helper_init_opt_default()).bitmap;
        }
        if (!bmp) {
            fprintf(stderr, "cannot read %s\n", in.c_str());
            return 1;
        }
        const int w = (int) mtmd_bitmap_get_nx(bmp), h = (int) mtmd_bitmap_get_ny(bmp);

        clip_image_u8 img;
        img.set_size({w, h}, false);
        img.cpy_buf(std::vector<uint8_t>(mtmd_bitmap_get_data(bmp), mtmd_bitmap_get_data(bmp) + mtmd_bitmap_get_n_bytes(bmp)));
        mtmd_image_preproc_out out = pre.preprocess(img);
        if (out.entries.size() != 1) {
            fprintf(stderr, "%s: %zu preprocessed entries\n", in.c_str(), out.entries.size());
            return 1;
        }
        const clip_image_f32 & f = out.entries[0];
        const std::vector<float> & buf = f.get_ro_buf();
        std::vector<unsigned char> bytes(buf.size());
        for (size_t i = 0; i < buf.size(); i++) {
            const int c = (int) (i % 3);
            const double v = std::round(((double) buf[i] * hp.image_std[c] + hp.image_mean[c]) * 255.0);
            bytes[i] = (unsigned char) std::max(0.0, std::min(255.0, v));
        }
        const std::string stem = out_dir + "/" + std::to_string(ii);
        if (!write_file(stem + ".pre.rgb", bytes.data(), bytes.size())) {
            fprintf(stderr, "cannot write %s.pre.rgb\n", stem.c_str());
            return 1;
        }

        long n_tokens = 0;
        int n_embd = 0;
        double ms = 0;
        if (encode) {
            mtmd_input_chunks * chunks = mtmd_input_chunks_init();
            mtmd_input_text text = {mtmd_default_marker(), strlen(mtmd_default_marker()), false, true};
            const mtmd_bitmap * bitmaps[1] = {bmp};
            if (mtmd_tokenize(ctx, chunks, &text, bitmaps, 1) != 0) {
                fprintf(stderr, "%s: mtmd_tokenize failed\n", in.c_str());
                return 1;
            }
            const mtmd_input_chunk * img_chunk = nullptr;
            for (size_t c = 0; c < mtmd_input_chunks_size(chunks); c++) {
                const mtmd_input_chunk * ch = mtmd_input_chunks_get(chunks, c);
                if (mtmd_input_chunk_get_type(ch) == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
                    img_chunk = ch;
                }
            }
            if (!img_chunk) {
                fprintf(stderr, "%s: no image chunk\n", in.c_str());
                return 1;
            }
            n_tokens = (long) mtmd_input_chunk_get_n_tokens(img_chunk);
            n_embd = clip_n_mmproj_embd(cr.ctx_v);  // the vocab-only text model has no widths
            if (tensors.tsv) {
                fclose(tensors.tsv);
                tensors.tsv = nullptr;
            }
            tensors.index = 0;
            const auto t0 = std::chrono::steady_clock::now();
            if (mtmd_encode_chunk(ctx, img_chunk) != 0) {
                fprintf(stderr, "%s: mtmd_encode_chunk failed\n", in.c_str());
                return 1;
            }
            ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            const float * embd = mtmd_get_output_embd(ctx);
            if (!write_file(stem + ".embd.f32", embd, (size_t) n_tokens * n_embd * sizeof(float))) {
                fprintf(stderr, "cannot write %s.embd.f32\n", stem.c_str());
                return 1;
            }
            mtmd_input_chunks_free(chunks);
        }
        printf("{\"input\": \"%s\", \"width\": %d, \"height\": %d, \"pre_w\": %d, \"pre_h\": %d, "
               "\"n_tokens\": %ld, \"n_embd\": %d, \"encode_ms\": %.3f}\n",
               in.c_str(), w, h, f.nx(), f.ny(), n_tokens, n_embd, ms);
        fflush(stdout);
        mtmd_bitmap_free(bmp);
    }
    clip_free(cr.ctx_v);
    mtmd_free(ctx);
    llama_model_free(model);
    return 0;
}
