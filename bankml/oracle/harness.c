// bankml-oracle: a small program over llama.cpp's C API, built by `python -m bankml.oracle build`.
// It runs one request and writes its answer as little-endian binary records, read by
// bankml/oracle/__init__.py. Struct layouts stay on the C side, where llama.h defines them.
//
//   bankml-oracle logits    MODEL TOKENS OUT threads n_ubatch outputs(all|last) decode_from cache n_ctx
//   bankml-oracle tensors   MODEL TOKENS OUT threads n_ubatch outputs(all|last) decode_from cache n_ctx
//   bankml-oracle tokenize  MODEL TEXT   OUT add_special parse_special
//   bankml-oracle pieces    MODEL OUT                              (every token's piece, special=true)
//
// cache: the K and V cache type (f16, q8_0, q4_0, ...: -ctk/-ctv), or K,V for two types (q8_0,f16).
// TOKENS: int32 token ids. logits OUT: int32 n_rows, int32 n_vocab, then f32 rows.
// tensors OUT: per tensor: int32 name_len, name, int32 op_len, op, int32 ubatch, int32 type,
//              int64 ne[4], int64 n_bytes, data (contiguous, type F32/F16/I32/I64 as in ggml).
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char * msg) { fprintf(stderr, "bankml-oracle: %s\n", msg); exit(1); }

static void quiet_log(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("BANKML_ORACLE_VERBOSE")) fputs(text, stderr);
}

static void * read_file(const char * path, long * size) {
    FILE * f = fopen(path, "rb");
    if (!f) die("cannot open input file");
    fseek(f, 0, SEEK_END); *size = ftell(f); fseek(f, 0, SEEK_SET);
    char * buf = malloc(*size + 1);
    if (*size && fread(buf, 1, *size, f) != (size_t) *size) die("short read");
    buf[*size] = 0;
    fclose(f);
    return buf;
}

// ---- the eval callback: every named node of the graph, in compute order ----
struct dump { FILE * out; int ubatch; };

static void write_str(FILE * f, const char * s) { int n = (int) strlen(s); fwrite(&n, 4, 1, f); fwrite(s, 1, n, f); }

static bool cb_eval(struct ggml_tensor * t, bool ask, void * ud) {
    struct dump * d = ud;
    if (ask) return true;
    size_t es;
    switch (t->type) {
        case GGML_TYPE_F32: case GGML_TYPE_I32: es = 4; break;
        case GGML_TYPE_F16: es = 2; break;
        case GGML_TYPE_I64: es = 8; break;
        default: return true;   // quantized views (a q8_0 cache) are not dumped
    }
    int64_t n = ggml_nelements(t);
    char * host = NULL;
    char * data;
    if (ggml_backend_buffer_is_host(t->buffer)) {
        data = t->data;
    } else {
        host = malloc(ggml_nbytes(t));
        ggml_backend_tensor_get(t, host, 0, ggml_nbytes(t));
        data = host;
    }
    char * buf = malloc(n * es);
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
    for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
    for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
        memcpy(buf + es * k++, data + i0*t->nb[0] + i1*t->nb[1] + i2*t->nb[2] + i3*t->nb[3], es);
    }
    write_str(d->out, t->name);
    write_str(d->out, ggml_op_desc(t));
    fwrite(&d->ubatch, 4, 1, d->out);
    int type = t->type;
    fwrite(&type, 4, 1, d->out);
    fwrite(t->ne, 8, 4, d->out);
    int64_t nb = n * es;
    fwrite(&nb, 8, 1, d->out);
    fwrite(buf, 1, nb, d->out);
    free(buf); free(host);
    if (strcmp(t->name, "result_output") == 0) d->ubatch++;
    return true;
}

// a cache type by llama.cpp's name (common/arg.cpp kv_cache_types)
static enum ggml_type cache_type(const char * name, size_t len) {
    static const struct { const char * name; enum ggml_type type; } types[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"bf16", GGML_TYPE_BF16}, {"q8_0", GGML_TYPE_Q8_0},
        {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1}, {"iq4_nl", GGML_TYPE_IQ4_NL},
        {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (strlen(types[i].name) == len && strncmp(types[i].name, name, len) == 0) return types[i].type;
    }
    die("unknown cache type");
    return GGML_TYPE_F16;
}

static struct llama_model * load(const char * path) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * m = llama_model_load_from_file(path, mp);
    if (!m) die("cannot load model");
    return m;
}

static int run_decode(int argc, char ** argv, bool dump) {
    if (argc != 11) die("usage: logits|tensors MODEL TOKENS OUT threads n_ubatch outputs decode_from cache n_ctx");
    long sz; int32_t * toks = read_file(argv[3], &sz);
    int n = (int) (sz / 4);
    int threads = atoi(argv[5]), n_ubatch = atoi(argv[6]);
    bool all = strcmp(argv[7], "all") == 0;
    int decode_from = atoi(argv[8]);
    if (decode_from <= 0 || decode_from > n) decode_from = n;
    FILE * out = fopen(argv[4], "wb");
    if (!out) die("cannot open output");
    struct dump d = { out, 0 };

    struct llama_model * model = load(argv[2]);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) atoi(argv[10]);
    cp.n_batch = (uint32_t) (decode_from > n_ubatch ? decode_from : n_ubatch);
    cp.n_ubatch = (uint32_t) n_ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    const char * comma = strchr(argv[9], ',');
    cp.type_k = cache_type(argv[9], comma ? (size_t) (comma - argv[9]) : strlen(argv[9]));
    cp.type_v = comma ? cache_type(comma + 1, strlen(comma + 1)) : cp.type_k;
    if (dump) { cp.cb_eval = cb_eval; cp.cb_eval_user_data = &d; }
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create context");
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    int n_rows = (all ? decode_from : 1) + (n - decode_from);
    if (!dump) { fwrite(&n_rows, 4, 1, out); fwrite(&n_vocab, 4, 1, out); }

    struct llama_batch b = llama_batch_init(decode_from, 0, 1);
    for (int i = 0; i < decode_from; i++) {
        b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = all || i == decode_from - 1;
    }
    b.n_tokens = decode_from;
    if (llama_decode(ctx, b) != 0) die("llama_decode failed");
    if (!dump) {
        for (int i = 0; i < decode_from; i++) {
            if (b.logits[i]) fwrite(llama_get_logits_ith(ctx, i), 4, n_vocab, out);
        }
    }
    for (int i = decode_from; i < n; i++) {
        b.token[0] = toks[i]; b.pos[0] = i; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
        b.n_tokens = 1;
        if (llama_decode(ctx, b) != 0) die("llama_decode failed");
        if (!dump) fwrite(llama_get_logits_ith(ctx, 0), 4, n_vocab, out);
    }
    llama_batch_free(b);
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

static int run_tokenize(int argc, char ** argv) {
    if (argc != 7) die("usage: tokenize MODEL TEXT OUT add_special parse_special");
    long sz; char * text = read_file(argv[3], &sz);
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[2], mp);
    if (!model) die("cannot load model");
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    int cap = (int) sz + 16;
    int32_t * toks = malloc(sizeof(int32_t) * cap);
    int n = llama_tokenize(vocab, text, (int32_t) sz, toks, cap, atoi(argv[5]) != 0, atoi(argv[6]) != 0);
    if (n < 0) die("llama_tokenize failed");
    FILE * out = fopen(argv[4], "wb");
    fwrite(toks, 4, n, out);
    fclose(out);
    llama_model_free(model);
    return 0;
}

static int run_pieces(int argc, char ** argv) {
    if (argc != 4) die("usage: pieces MODEL OUT");
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[2], mp);
    if (!model) die("cannot load model");
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * out = fopen(argv[3], "wb");
    char buf[1024];
    for (int t = 0; t < llama_vocab_n_tokens(vocab); t++) {
        int len = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, true);
        if (len < 0) len = 0;
        fwrite(&len, 4, 1, out); fwrite(buf, 1, len, out);
    }
    fclose(out);
    llama_model_free(model);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc < 2) die("usage: bankml-oracle logits|tensors|tokenize|pieces ...");
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    if (!strcmp(argv[1], "logits")) return run_decode(argc, argv, false);
    if (!strcmp(argv[1], "tensors")) return run_decode(argc, argv, true);
    if (!strcmp(argv[1], "tokenize")) return run_tokenize(argc, argv);
    if (!strcmp(argv[1], "pieces")) return run_pieces(argc, argv);
    die("unknown command");
    return 1;
}
