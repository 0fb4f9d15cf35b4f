/*
 * model_io.c — a model from whatever file a user has, and a model out to
 * the file other tools read (dtrain/train.h, "Model files").
 *
 * dt_model_open takes a path and finds out what it is from its first bytes,
 * never from its name:
 *
 *   "DTGW"                          a dtrain weights file (run/model.dtgw)
 *   "DTRNCKPT"                      a dtrain checkpoint (its manifest)
 *   int32 20240326, version 3 or 5  llm.c's gpt2_124M.bin (fp32 or bf16)
 *   u64 N, then '{'                 a safetensors file (JSON header + data)
 *
 * A folder is a run folder (its model.dtgw, else the newest checkpoint of
 * its ckpt/) or a checkpoint folder (its newest valid checkpoint). Anything
 * else is one error naming what was expected.
 *
 * Tensor names and layouts. dtrain's table (dt_gpt_config_tensors) names
 * the GPT-2 tensors as Hugging Face's GPT2Model does ("h.0.attn.c_attn.
 * weight") except wte and wpe (HF: "wte.weight", "wpe.weight"); its linear
 * weights are (out, in) like torch.nn.Linear, HF's Conv1D weights are
 * (in, out): c_attn, attn.c_proj, c_fc and mlp.c_proj are transposed on the
 * way in and out. A reader takes both HF spellings ("transformer." prefix
 * or not), ignores HF's attention-mask buffers and the tied lm_head.
 * llm.c's file holds the same tensors in nn.Linear layout, concatenated
 * over layers, with wte padded to Vp rows.
 *
 * safetensors written here: tensors in the table's order, F32, the header
 * padded with spaces to a multiple of 8, metadata {"format": "pt"} plus
 * what the shapes do not say (dtrain.heads) and the char/byte tokenizer's
 * table (dtrain.tokenizer, dtrain.vocab as hex), so export -> import ->
 * export gives the same bytes.
 */
#include "dtrain/amp.h"
#include "train_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240326

const char *const dt_model_format_names[DT_MODEL_FORMAT_COUNT] = {
    [DT_MODEL_WEIGHTS] = "dtrain weights",
    [DT_MODEL_CHECKPOINT] = "dtrain checkpoint",
    [DT_MODEL_SAFETENSORS] = "safetensors",
    [DT_MODEL_LLMC] = "llm.c",
};

void dt_model_close(dt_model_file *f) {
    if (!f)
        return;
    dt_gpt_destroy(f->model);
    f->model = NULL;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The tensor at index i of the whole model m and whether HF stores it
 * transposed; name gets the HF name. */
static bool hf_name(const dt_param_info *pi, char *name, size_t len) {
    if (strcmp(pi->name, "wte") == 0 || strcmp(pi->name, "wpe") == 0)
        snprintf(name, len, "%s.weight", pi->name);
    else
        snprintf(name, len, "%s", pi->name);
    size_t n = strlen(pi->name);
    return n > 7 && strcmp(pi->name + n - 7, ".weight") == 0 &&
           (strstr(pi->name, "c_attn") || strstr(pi->name, "c_proj") || strstr(pi->name, "c_fc"));
}

/* dst (rows x cols) = src^T where src is (cols x rows). */
static void transpose(float *dst, const float *src, size_t rows, size_t cols) {
    for (size_t c = 0; c < cols; c++)
        for (size_t r = 0; r < rows; r++)
            dst[r * cols + c] = src[c * rows + r];
}

/* ------------------------------------------------------------------------ */
/* dtrain checkpoints                                                       */
/* ------------------------------------------------------------------------ */

static dt_status open_checkpoint(dt_model_file *out, const char *path, bool dir, int max_seq) {
    dt_ckpt_set *set = NULL;
    DT_CHECK(dir ? dt_ckpt_set_open_latest(&set, path) : dt_ckpt_set_open(&set, path, true));
    const dt_ckpt *m = dt_ckpt_set_manifest(set);
    dt_status st = DT_OK;
    dt_param_info *all = NULL;
    dt_ckpt_tensor *tensors = NULL;
    dt_ckpt_box *boxes = NULL;
    int64_t id[DT_TRAIN_IDENT_COUNT], tok[2] = {-1, 0};
    DT_CHECK_GOTO(dt_ckpt_read(m, "ident", DT_CKPT_I64, id, DT_TRAIN_IDENT_COUNT), st, done);
    dt_gpt_config cfg = {(int)id[0], (int)id[1], (int)id[2], (int)id[3], (int)id[4]};
    DT_CHECK_GOTO(dt_gpt_config_validate(&cfg), st, done);
    DT_CHECK_GOTO(dt_gpt_create(&out->model, &cfg, 1,
                                max_seq && max_seq < cfg.max_seq ? max_seq : cfg.max_seq),
                  st, done);
    size_t ng = dt_gpt_config_num_tensors(&cfg);
    DT_CHECK_GOTO(dt_gpt_config_tensors(&cfg, &all), st, done);
    tensors = dt_calloc(ng, sizeof *tensors);
    boxes = dt_calloc(ng, sizeof *boxes);
    if (!tensors || !boxes) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < ng; i++) {
        snprintf(tensors[i].name, sizeof tensors[i].name, "%s", all[i].name);
        tensors[i].ndim = (uint32_t)all[i].ndim;
        boxes[i] = (dt_ckpt_box){.tensor = (uint32_t)i, .offset = all[i].offset};
        for (int d = 0; d < DT_CKPT_MAX_DIMS; d++) {
            tensors[i].shape[d] = all[i].shape[d];
            boxes[i].extent[d] = all[i].shape[d];
        }
    }
    DT_CHECK_GOTO(
        dt_ckpt_set_read_boxes(set, "params", tensors, ng, boxes, ng, dt_gpt_params(out->model)),
        st, done);
    DT_CHECK_GOTO(dt_ckpt_read(m, "step", DT_CKPT_I64, &out->step, 1), st, done);
    dt_ckpt_info vi;
    if (dt_ckpt_read(m, "tokenizer", DT_CKPT_I64, tok, 2) == DT_OK && tok[0] == DT_TOKENIZER_BPE) {
        out->tok_kind = DT_TOKENIZER_BPE; /* named by its hash only */
    } else if (dt_ckpt_find(m, "vocab", &vi) == DT_OK && vi.bytes <= sizeof out->vocab &&
               tok[0] >= 0) {
        out->tok_kind = (int)tok[0];
        out->vocab_len = (int)vi.bytes;
        memcpy(out->vocab, vi.data, vi.bytes);
    }
    snprintf(out->path, sizeof out->path, "%s", dt_ckpt_file(m));
    out->format = DT_MODEL_CHECKPOINT;
done:
    dt_free(all);
    dt_free(tensors);
    dt_free(boxes);
    dt_ckpt_set_close(set);
    if (st != DT_OK)
        dt_model_close(out);
    return st;
}

/* ------------------------------------------------------------------------ */
/* safetensors                                                              */
/* ------------------------------------------------------------------------ */

/* The model's table entry named (in HF spelling) `key`, or -1. */
static long table_index(const dt_gpt *m, const char *key) {
    if (strncmp(key, "transformer.", 12) == 0)
        key += 12;
    for (size_t i = 0; i < dt_gpt_num_tensors(m); i++) {
        dt_param_info pi;
        char name[96];
        dt_gpt_tensor_info(m, i, &pi);
        hf_name(&pi, name, sizeof name);
        if (strcmp(name, key) == 0)
            return (long)i;
    }
    return -1;
}

/* An HF key that is not a parameter of ours: the causal-mask buffers and
 * the lm_head tied to wte. */
static bool ignorable(const char *key) {
    size_t n = strlen(key);
    return (n > 10 && strcmp(key + n - 10, ".attn.bias") == 0) ||
           (n > 17 && strcmp(key + n - 17, ".attn.masked_bias") == 0) ||
           strcmp(key, "lm_head.weight") == 0 || strcmp(key, "__metadata__") == 0;
}

static int64_t shape_dim(json_t *shape, size_t i) {
    json_t *v = json_array_get(shape, i);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static dt_status open_safetensors(dt_model_file *out, const char *path, FILE *f, uint64_t hlen,
                                  uint64_t fsize, int max_seq, int heads) {
    dt_status st = DT_OK;
    char *htext = NULL;
    json_t *h = NULL;
    float *buf = NULL;
    if (hlen > fsize - 8 || hlen > (100u << 20))
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: safetensors header of %llu bytes in a %llu-byte file", path,
                            (unsigned long long)hlen, (unsigned long long)fsize);
    htext = malloc(hlen + 1);
    if (!htext)
        return DT_ERR_NOMEM;
    if (fread(htext, 1, hlen, f) != hlen) {
        st = dt_error_set(DT_ERR_CORRUPT, "%s: truncated safetensors header", path);
        goto done;
    }
    json_error_t je;
    h = json_loadb(htext, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!h || !json_is_object(h)) {
        st = dt_error_set(DT_ERR_CORRUPT, "%s: safetensors header is not a JSON object (%s)", path,
                          h ? "other JSON" : je.text);
        goto done;
    }
    uint64_t data0 = 8 + hlen, dlen = fsize - data0;
    /* The shape: C and V from wte, T from wpe, L from the blocks. */
    json_t *wte = json_object_get(h, "wte.weight"), *wpe = json_object_get(h, "wpe.weight");
    if (!wte)
        wte = json_object_get(h, "transformer.wte.weight");
    if (!wpe)
        wpe = json_object_get(h, "transformer.wpe.weight");
    if (!wte || !wpe) {
        st = dt_error_set(DT_ERR_INVALID,
                          "%s: not a GPT-2 model: no wte.weight / wpe.weight tensor (Hugging Face "
                          "GPT-2 names are expected)",
                          path);
        goto done;
    }
    int64_t V = shape_dim(json_object_get(wte, "shape"), 0),
            C = shape_dim(json_object_get(wte, "shape"), 1),
            T = shape_dim(json_object_get(wpe, "shape"), 0);
    int L = 0;
    char probe[96];
    for (;; L++) {
        snprintf(probe, sizeof probe, "h.%d.ln_1.weight", L);
        char probe2[112];
        snprintf(probe2, sizeof probe2, "transformer.%s", probe);
        if (!json_object_get(h, probe) && !json_object_get(h, probe2))
            break;
    }
    json_t *meta = json_object_get(h, "__metadata__");
    const char *mh = json_string_value(json_object_get(meta, "dtrain.heads"));
    int NH = heads > 0 ? heads : mh ? atoi(mh) : (C % 64 == 0 ? (int)(C / 64) : 0);
    if (NH <= 0) {
        st = dt_error_set(DT_ERR_INVALID,
                          "%s: the file does not say how many attention heads the model has and "
                          "dim %lld is not a multiple of GPT-2's head size 64: give --heads",
                          path, (long long)C);
        goto done;
    }
    if (V < 1 || C < 1 || T < 1 || V > (1 << 24) || C > 65536 || T > (1 << 20)) {
        st = dt_error_set(DT_ERR_CORRUPT, "%s: implausible shapes (wte %lld x %lld, wpe %lld rows)",
                          path, (long long)V, (long long)C, (long long)T);
        goto done;
    }
    dt_gpt_config cfg = {L, (int)C, NH, (int)T, (int)V};
    DT_CHECK_GOTO(dt_gpt_config_validate(&cfg), st, done);
    DT_CHECK_GOTO(dt_gpt_create(&out->model, &cfg, 1, max_seq && max_seq < T ? max_seq : (int)T),
                  st, done);
    size_t nt = dt_gpt_num_tensors(out->model), found = 0, most = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(out->model, i, &pi);
        most = pi.rows * pi.cols > most ? pi.rows * pi.cols : most;
    }
    buf = dt_alloc(most * sizeof(float));
    if (!buf) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (ignorable(key))
            continue;
        long i = table_index(out->model, key);
        if (i < 0) {
            st = dt_error_set(DT_ERR_INVALID, "%s: tensor \"%s\" is not part of a GPT-2 model",
                              path, key);
            goto done;
        }
        dt_param_info pi;
        dt_gpt_tensor_info(out->model, (size_t)i, &pi);
        char name[96];
        bool tr = hf_name(&pi, name, sizeof name);
        const char *dtype = json_string_value(json_object_get(v, "dtype"));
        json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
        size_t want = pi.rows * pi.cols, count = 1;
        for (size_t d = 0; d < json_array_size(shape); d++)
            count *= shape_dim(shape, d) > 0 ? (size_t)shape_dim(shape, d) : 0;
        int esize = dtype && strcmp(dtype, "F32") == 0                                   ? 4
                    : dtype && (strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0) ? 2
                                                                                         : 0;
        uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0)),
                 e = (uint64_t)json_integer_value(json_array_get(offs, 1));
        if (!esize || count != want || e < b || e > dlen || e - b != count * (uint64_t)esize) {
            st = dt_error_set(DT_ERR_INVALID,
                              "%s: tensor \"%s\": %s with %zu values at bytes [%llu, %llu), this "
                              "model needs %zu F32/BF16/F16 values",
                              path, key, dtype ? dtype : "no dtype", count, (unsigned long long)b,
                              (unsigned long long)e, want);
            goto done;
        }
        float *dst = dt_gpt_params(out->model) + pi.offset;
        float *into = tr ? buf : dst;
        if (fseeko(f, (off_t)(data0 + b), SEEK_SET) != 0 ||
            fread(into, (size_t)esize, count, f) != count) {
            st = dt_error_set(DT_ERR_CORRUPT, "%s: truncated tensor \"%s\"", path, key);
            goto done;
        }
        if (esize == 2) { /* widen in place, from the back */
            const unsigned char *raw = (const unsigned char *)into;
            bool bf = strcmp(dtype, "BF16") == 0;
            for (size_t k = count; k-- > 0;) {
                uint16_t h16;
                memcpy(&h16, raw + 2 * k, 2);
                into[k] = bf ? dt_f32_from_bf16(h16) : dt_f32_from_f16(h16);
            }
        }
        if (tr)
            transpose(dst, buf, pi.rows, pi.cols);
        found++;
    }
    if (found != nt) {
        st = dt_error_set(DT_ERR_INVALID, "%s: holds %zu of the %zu tensors of a %d-layer GPT-2",
                          path, found, nt, L);
        goto done;
    }
    const char *tk = json_string_value(json_object_get(meta, "dtrain.tokenizer"));
    const char *tv = json_string_value(json_object_get(meta, "dtrain.vocab"));
    if (tk && tv && strlen(tv) % 2 == 0 && strlen(tv) / 2 <= sizeof out->vocab) {
        for (int k = 0; k < DT_TOKENIZER_COUNT; k++)
            if (strcmp(tk, dt_tokenizer_names[k]) == 0)
                out->tok_kind = k;
        out->vocab_len = (int)(strlen(tv) / 2);
        for (int k = 0; k < out->vocab_len; k++) {
            unsigned x = 0;
            sscanf(tv + 2 * k, "%2x", &x);
            out->vocab[k] = (uint8_t)x;
        }
    }
    snprintf(out->path, sizeof out->path, "%s", path);
    out->format = DT_MODEL_SAFETENSORS;
done:
    dt_free(buf);
    json_decref(h);
    free(htext);
    if (st != DT_OK)
        dt_model_close(out);
    return st;
}

dt_status dt_model_export_safetensors(const dt_model_file *mf, const char *path) {
    const dt_gpt *m = mf->model;
    const dt_gpt_config *cfg = dt_gpt_get_config(m);
    size_t nt = dt_gpt_num_tensors(m), most = 0;
    json_t *h = json_object(), *meta = json_object();
    char heads[16], hex[513] = "";
    snprintf(heads, sizeof heads, "%d", cfg->heads);
    bool ok = h && meta && json_object_set_new(meta, "format", json_string("pt")) == 0 &&
              json_object_set_new(meta, "dtrain.heads", json_string(heads)) == 0;
    if (ok && mf->tok_kind >= 0 && mf->tok_kind < DT_TOKENIZER_COUNT && mf->vocab_len > 0) {
        for (int k = 0; k < mf->vocab_len; k++)
            snprintf(hex + 2 * k, 3, "%02x", mf->vocab[k]);
        ok = json_object_set_new(meta, "dtrain.tokenizer",
                                 json_string(dt_tokenizer_names[mf->tok_kind])) == 0 &&
             json_object_set_new(meta, "dtrain.vocab", json_string(hex)) == 0;
    }
    ok = ok && json_object_set(h, "__metadata__", meta) == 0;
    uint64_t off = 0;
    for (size_t i = 0; ok && i < nt; i++) {
        dt_param_info pi;
        char name[96];
        dt_gpt_tensor_info(m, i, &pi);
        bool tr = hf_name(&pi, name, sizeof name);
        size_t n = pi.rows * pi.cols;
        most = n > most ? n : most;
        /* HF shapes: vectors 1-D, matrices 2-D ((in, out) when transposed). */
        json_t *shape = pi.rows == 1 ? json_pack("[I]", (json_int_t)pi.cols)
                        : tr         ? json_pack("[I, I]", (json_int_t)pi.cols, (json_int_t)pi.rows)
                             : json_pack("[I, I]", (json_int_t)pi.rows, (json_int_t)pi.cols);
        json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + 4 * n));
        ok = t && json_object_set_new(h, name, t) == 0;
        off += 4 * n;
    }
    char *text = ok ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(meta);
    json_decref(h);
    if (!text)
        return dt_error_set(DT_ERR_NOMEM, "safetensors header");
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    char *head = malloc(8 + padded);
    float *buf = dt_alloc((most ? most : 1) * sizeof(float));
    FILE *f = NULL;
    char tmp[4200];
    dt_status st = DT_OK;
    if (!head || !buf) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    uint64_t le = padded;
    memcpy(head, &le, 8);
    memcpy(head + 8, text, hl);
    memset(head + 8 + hl, ' ', padded - hl);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (!f) {
        st = dt_error_set_errno(DT_ERR_IO, "cannot create %s", tmp);
        goto done;
    }
    bool wrote = fwrite(head, 1, 8 + padded, f) == 8 + padded;
    for (size_t i = 0; wrote && i < nt; i++) {
        dt_param_info pi;
        char name[96];
        dt_gpt_tensor_info(m, i, &pi);
        const float *src = dt_gpt_params((dt_gpt *)m) + pi.offset;
        if (hf_name(&pi, name, sizeof name)) {
            transpose(buf, src, pi.cols, pi.rows);
            src = buf;
        }
        wrote = fwrite(src, sizeof(float), pi.rows * pi.cols, f) == pi.rows * pi.cols;
    }
    if (!wrote || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st = dt_error_set_errno(errno == ENOSPC ? DT_ERR_NOSPACE : DT_ERR_IO, "cannot write %s",
                                tmp);
        goto done;
    }
    if (fclose(f) != 0) {
        f = NULL;
        st = dt_error_set_errno(DT_ERR_IO, "cannot write %s", tmp);
        goto done;
    }
    f = NULL;
    if (rename(tmp, path) != 0)
        st = dt_error_set_errno(DT_ERR_IO, "cannot rename %s to %s", tmp, path);
done:
    if (f)
        fclose(f);
    if (st != DT_OK)
        remove(tmp);
    free(text);
    free(head);
    dt_free(buf);
    return st;
}

/* ------------------------------------------------------------------------ */
/* llm.c                                                                    */
/* ------------------------------------------------------------------------ */

static dt_status open_llmc(dt_model_file *out, const char *path, FILE *f, const int32_t *hd,
                           uint64_t fsize, int max_seq) {
    int version = hd[1], T = hd[2], V = hd[3], L = hd[4], NH = hd[5], C = hd[6], Vp = hd[7];
    if (version != 3 && version != 5)
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "%s: llm.c model file version %d (this build reads 3, fp32, and 5, "
                            "bf16)",
                            path, version);
    if (Vp == 0)
        Vp = V; /* files of version 1 style carry no padded size */
    dt_gpt_config cfg = {L, C, NH, T, V};
    if (dt_gpt_config_validate(&cfg) != DT_OK || Vp < V) {
        dt_error_prefix("%s: llm.c header (T %d, V %d, L %d, NH %d, C %d, Vp %d)", path, T, V, L,
                        NH, C, Vp);
        return DT_ERR_CORRUPT;
    }
    /* The tensors in file order: (name in our table or NULL for a block
     * tensor k, rows, cols, per layer). */
    size_t Cs = (size_t)C, Ls = (size_t)L;
    size_t total = (size_t)Vp * Cs + (size_t)T * Cs + Ls * (12 * Cs * Cs + 13 * Cs) + 2 * Cs;
    int es = version == 3 ? 4 : 2;
    if (fsize != 256 * 4 + total * (size_t)es)
        return dt_error_set(DT_ERR_CORRUPT, "%s: %llu bytes, an llm.c model of this header has %zu",
                            path, (unsigned long long)fsize, 256 * 4 + total * (size_t)es);
    DT_CHECK(dt_gpt_create(&out->model, &cfg, 1, max_seq && max_seq < T ? max_seq : T));
    float *all = dt_alloc(total * sizeof(float));
    if (!all) {
        dt_model_close(out);
        return dt_error_set(DT_ERR_NOMEM, "%s: %zu parameters", path, total);
    }
    dt_status st = DT_OK;
    if (fread(all, (size_t)es, total, f) != total) {
        st = dt_error_set(DT_ERR_CORRUPT, "%s: truncated", path);
        goto done;
    }
    if (es == 2) {
        const unsigned char *raw = (const unsigned char *)all;
        for (size_t k = total; k-- > 0;) {
            uint16_t h16;
            memcpy(&h16, raw + 2 * k, 2);
            all[k] = dt_f32_from_bf16(h16);
        }
    }
    /* llm.c's order: wte, wpe, then each kind over all layers (ln1w, ln1b,
     * qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
     * fcprojb), then lnfw, lnfb; our block tensor k is that kind k, in
     * the same (out, in) layout. */
    float *p = dt_gpt_params(out->model);
    const float *src = all;
    dt_param_info pi;
    dt_gpt_tensor_info(out->model, 0, &pi); /* wte: the first V of Vp rows */
    memcpy(p + pi.offset, src, (size_t)V * Cs * sizeof(float));
    src += (size_t)Vp * Cs;
    dt_gpt_tensor_info(out->model, 1, &pi);
    memcpy(p + pi.offset, src, (size_t)T * Cs * sizeof(float));
    src += (size_t)T * Cs;
    for (int k = 0; k < 12; k++) {
        for (int l = 0; l < L; l++) {
            dt_gpt_tensor_info(out->model, 2 + 12 * (size_t)l + (size_t)k, &pi);
            memcpy(p + pi.offset, src, pi.rows * pi.cols * sizeof(float));
            src += pi.rows * pi.cols;
        }
    }
    dt_gpt_tensor_info(out->model, 2 + 12 * Ls, &pi);
    memcpy(p + pi.offset, src, Cs * sizeof(float));
    dt_gpt_tensor_info(out->model, 3 + 12 * Ls, &pi);
    memcpy(p + pi.offset, src + Cs, Cs * sizeof(float));
    snprintf(out->path, sizeof out->path, "%s", path);
    out->format = DT_MODEL_LLMC;
done:
    dt_free(all);
    if (st != DT_OK)
        dt_model_close(out);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Detection                                                                */
/* ------------------------------------------------------------------------ */

dt_status dt_model_open(dt_model_file *out, const char *path, int max_seq, int heads) {
    memset(out, 0, sizeof *out);
    out->step = -1;
    out->tok_kind = -1;
    if (!path || !*path)
        return dt_error_set(DT_ERR_INVALID, "no model path given");
    if (is_dir(path)) {
        char p[4200];
        snprintf(p, sizeof p, "%s/model.dtgw", path);
        if (is_file(p))
            return dt_model_open(out, p, max_seq, heads);
        snprintf(p, sizeof p, "%s/ckpt", path);
        if (is_dir(p))
            return open_checkpoint(out, p, true, max_seq);
        dt_status st = open_checkpoint(out, path, true, max_seq);
        if (st == DT_ERR_NOT_FOUND)
            return dt_error_set(DT_ERR_NOT_FOUND,
                                "%s is a folder without a model: expected a run folder "
                                "(model.dtgw or ckpt/) or a checkpoint folder (ckpt-*.dtck)",
                                path);
        return st;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return dt_error_set_errno(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "cannot open %s",
                                  path);
    int32_t hd[256];
    size_t got = fread(hd, 1, sizeof hd, f);
    fseeko(f, 0, SEEK_END);
    uint64_t fsize = (uint64_t)ftello(f);
    unsigned char *b = (unsigned char *)hd;
    uint64_t hlen;
    memcpy(&hlen, b, 8);
    dt_status st;
    if (got >= 4 && (uint32_t)hd[0] == DT_GPT_WEIGHTS_MAGIC) {
        fclose(f);
        DT_CHECK(dt_gpt_load_weights(&out->model, path, 1, max_seq ? max_seq : 1 << 20, out->vocab,
                                     &out->vocab_len));
        /* A 256-entry identity table is the byte tokenizer; a shorter one
         * a char tokenizer's. */
        out->tok_kind = out->vocab_len == 256 ? DT_TOKENIZER_BYTE
                        : out->vocab_len > 0  ? DT_TOKENIZER_CHAR
                                              : -1;
        snprintf(out->path, sizeof out->path, "%s", path);
        out->format = DT_MODEL_WEIGHTS;
        return DT_OK;
    }
    if (got >= 8 && memcmp(b, "DTRNCKPT", 8) == 0) {
        fclose(f);
        return open_checkpoint(out, path, false, max_seq);
    }
    if (got == sizeof hd && hd[0] == LLMC_MAGIC) {
        fseeko(f, sizeof hd, SEEK_SET);
        st = open_llmc(out, path, f, hd, fsize, max_seq);
        fclose(f);
        return st;
    }
    if (got >= 9 && hlen >= 2 && b[8] == '{') {
        fseeko(f, 8, SEEK_SET);
        st = open_safetensors(out, path, f, hlen, fsize, max_seq, heads);
        fclose(f);
        return st;
    }
    fclose(f);
    char shown[17] = "";
    for (size_t i = 0; i < 8 && i < got; i++)
        snprintf(shown + 2 * i, 3, "%02x", b[i]);
    return dt_error_set(DT_ERR_INVALID,
                        "%s is not a model file (it starts with %s): expected a dtrain weights "
                        "file (.dtgw), a checkpoint (.dtck, its folder or a run folder), a "
                        "safetensors file or an llm.c .bin",
                        path, got ? shown : "nothing, it is empty");
}

/* ------------------------------------------------------------------------ */
/* --init-from                                                              */
/* ------------------------------------------------------------------------ */

dt_status dt__train_init_config(trainer *t, dt_gpt_config *mc) {
    const dt_train_config *c = t->c;
    DT_CHECK(dt_model_open(&t->init, c->init_from, 0, c->heads));
    const dt_gpt_config *f = dt_gpt_get_config(t->init.model);
    const char *p = t->init.path;
    if ((c->layers && c->layers != f->layers) || (c->dim && c->dim != f->dim) ||
        (c->heads && c->heads != f->heads) || (c->vocab && c->vocab != f->vocab))
        return bad("--init-from %s: the file's model has %d layers, dim %d, %d heads, vocab %d; "
                   "leave --layers / --dim / --heads / --vocab out or give those",
                   p, f->layers, f->dim, f->heads, f->vocab);
    if (c->seq > f->max_seq)
        return bad("--init-from %s: --seq %d is longer than the file's %d positions", p, c->seq,
                   f->max_seq);
    int V = t->tok->vocab_size;
    if (V > f->vocab)
        return bad("--init-from %s: the data has %d tokens, the model only %d", p, V, f->vocab);
    if (t->init.vocab_len > 0 &&
        (t->init.vocab_len != V || memcmp(t->init.vocab, t->tok->id_to_byte, (size_t)V) != 0))
        return bad("--init-from %s: the model was trained with another %s vocabulary (%d "
                   "entries) than the data's %s one (%d): the same ids would mean other bytes",
                   p, t->init.tok_kind >= 0 ? dt_tokenizer_names[t->init.tok_kind] : "",
                   t->init.vocab_len, dt_tokenizer_names[t->tok->kind], V);
    *mc = *f;
    if (c->seq)
        mc->max_seq = c->seq;
    return DT_OK;
}

dt_status dt__train_init_params(trainer *t) {
    dt_gpt *w = t->init.model;
    size_t nw = dt_gpt_num_tensors(w), nt = dt_gpt_num_tensors(t->m);
    dt_ckpt_box *have = dt_calloc(nw, sizeof *have), *want = dt_calloc(nt, sizeof *want);
    if (!have || !want) {
        dt_free(have);
        dt_free(want);
        return DT_ERR_NOMEM;
    }
    for (size_t i = 0; i < nw; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(w, i, &pi);
        have[i] = (dt_ckpt_box){.tensor = (uint32_t)pi.global, .offset = pi.offset};
        for (int d = 0; d < DT_CKPT_MAX_DIMS; d++)
            have[i].extent[d] = pi.extent[d];
    }
    uint64_t need = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        want[i] = (dt_ckpt_box){.tensor = (uint32_t)pi.global, .offset = pi.offset};
        for (int d = 0; d < DT_CKPT_MAX_DIMS; d++) {
            want[i].begin[d] = pi.begin[d];
            want[i].extent[d] = pi.extent[d];
        }
        /* wpe may be shorter here (--seq): what the file has of it. */
        if (strcmp(pi.name, "wpe") == 0)
            DT_ASSERT(want[i].extent[0] <= (uint64_t)dt_gpt_get_config(w)->max_seq);
        need += dt_ckpt_box_volume(&want[i]);
    }
    uint64_t got = dt_ckpt_copy_boxes(have, nw, dt_gpt_params(w), want, nt, dt_gpt_params(t->m));
    dt_free(have);
    dt_free(want);
    dt_model_close(&t->init);
    if (got != need)
        return dt_error_set(DT_ERR_INTERNAL, "--init-from: copied %llu of %llu parameters",
                            (unsigned long long)got, (unsigned long long)need);
    return DT_OK;
}
