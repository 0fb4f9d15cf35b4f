/*
 * cmd_ckpt.c — `dtrain ckpt info PATH`: what a checkpoint (or a model file) holds.
 *
 * Prints the format version, size, checksum status, the section table and
 * the small sections' values (step, schedule, RNG and loader positions) and
 * the config text. A damaged file is still shown as far as its structure
 * allows, with the checksum reported BAD and exit status 1.
 */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const cli_opt info_opts[] = {
    {"no-verify", 0, CLI_FLAG, NULL, NULL, NULL, "skip the checksum (fast on huge files)", NULL, 0,
     0},
    {0},
};

/* Print up to 8 values of a small numeric section. */
static void print_values(const dt_ckpt_info *s) {
    if (s->count == 0 || s->count > 8 || s->type == DT_CKPT_BYTES || s->type == DT_CKPT_TEXT)
        return;
    printf("  =");
    for (size_t i = 0; i < s->count; i++) {
        const unsigned char *p = (const unsigned char *)s->data + i * dt_ckpt_type_size(s->type);
        union {
            float f;
            double d;
            int32_t i32;
            int64_t i64;
            uint64_t u64;
        } v;
        memcpy(&v, p, dt_ckpt_type_size(s->type));
        switch (s->type) {
        case DT_CKPT_F32: printf(" %.9g", (double)v.f); break;
        case DT_CKPT_F64: printf(" %.17g", v.d); break;
        case DT_CKPT_I32: printf(" %" PRId32, v.i32); break;
        case DT_CKPT_I64: printf(" %" PRId64, v.i64); break;
        case DT_CKPT_U64: printf(" %" PRIu64, v.u64); break;
        default: break;
        }
    }
}

/* The layout a checkpoint was written from, its shard files and, per
 * global tensor, the boxes of "params" each rank wrote. Returns 1 when a
 * shard file is missing or damaged. */
static int print_shards(const char *manifest, bool verify) {
    dt_ckpt_set *set;
    if (dt_ckpt_set_open(&set, manifest, verify) != DT_OK) {
        printf("shards:    UNUSABLE: %s\n", dt_last_error());
        return 1;
    }
    const dt_ckpt *m = dt_ckpt_set_manifest(set);
    dt_ckpt_info li;
    if (dt_ckpt_find(m, "layout", &li) == DT_OK && li.type == DT_CKPT_I64 &&
        li.count == 1 + 2 * DT_AXIS_COUNT) {
        int64_t v[1 + 2 * DT_AXIS_COUNT];
        memcpy(v, li.data, sizeof v);
        dt_mesh_shape shape;
        bool ok = true;
        for (int a = 0; a < DT_AXIS_COUNT; a++) {
            ok &= v[1 + a] >= 1 && v[1 + DT_AXIS_COUNT + a] >= 0 &&
                  v[1 + DT_AXIS_COUNT + a] < DT_AXIS_COUNT;
            shape.degree[a] = (int)v[1 + a];
            shape.order[a] = (dt_axis)(ok ? v[1 + DT_AXIS_COUNT + a] : 0);
        }
        char mesh[64];
        printf("layout:    written by %" PRId64 " rank(s)", v[0]);
        if (ok)
            printf(" as %s (rank order %s-%s-%s-%s, fastest first)",
                   dt_mesh_format(&shape, mesh, sizeof mesh), dt_axis_names[shape.order[0]],
                   dt_axis_names[shape.order[1]], dt_axis_names[shape.order[2]],
                   dt_axis_names[shape.order[3]]);
        printf("\n");
    }
    size_t nf = dt_ckpt_set_num_files(set), nt = dt_ckpt_set_num_tensors(set);
    printf("files:     the manifest and %zu shard file(s)%s\n", nf - 1,
           nf > 1 && verify ? ", checksums ok" : "");
    for (size_t i = 1; i < nf; i++) {
        char sz[32];
        const dt_ckpt *f = dt_ckpt_set_file(set, i);
        printf("  rank %-5d %s (%s)\n", dt_ckpt_set_file_rank(set, i), dt_ckpt_file(f),
               dt_format_bytes((double)dt_ckpt_file_size(f), sz, sizeof sz));
    }
    if (nt == 0)
        printf("tensors:   none (format 1: one unsharded \"params\" section)\n");
    else
        printf("tensors:   %zu global tensors; the boxes of \"params\" by writer:\n", nt);
    for (size_t t = 0; t < nt; t++) {
        const dt_ckpt_tensor *g = dt_ckpt_set_tensor(set, t);
        char shape[64];
        int w = snprintf(shape, sizeof shape, "%" PRIu64, g->shape[0]);
        for (uint32_t d = 1; d < g->ndim && w > 0 && (size_t)w < sizeof shape; d++)
            w += snprintf(shape + w, sizeof shape - (size_t)w, "x%" PRIu64, g->shape[d]);
        printf("  %-28s %-14s", g->name, shape);
        for (size_t i = 0; i < nf; i++) {
            dt_ckpt_info mi;
            if (dt_ckpt_find(dt_ckpt_set_file(set, i), "params.map", &mi) != DT_OK)
                continue;
            const dt_ckpt_box *b = mi.data;
            for (size_t k = 0; k < mi.bytes / sizeof *b; k++) {
                if (b[k].tensor != t)
                    continue;
                printf(" r%d[", dt_ckpt_set_file_rank(set, i));
                for (uint32_t d = 0; d < g->ndim; d++)
                    printf("%s%" PRIu64 ":%" PRIu64, d ? "," : "", b[k].begin[d],
                           b[k].begin[d] + b[k].extent[d]);
                printf("]");
            }
        }
        printf("\n");
    }
    dt_ckpt_set_close(set);
    return 0;
}

/* A model file that is not a checkpoint (weights, safetensors, llm.c):
 * what dt_model_open reads from it. */
static int print_model(const char *path) {
    dt_model_file mf;
    dt_status st = dt_model_open(&mf, path, 0, 0);
    if (st != DT_OK)
        return cli_fail(st);
    const dt_gpt_config *c = dt_gpt_get_config(mf.model);
    char sz[32];
    size_t n = dt_gpt_num_params(mf.model);
    printf("file:      %s\n", mf.path);
    printf("format:    %s\n", dt_model_format_names[mf.format]);
    printf("model:     %d layers, dim %d, %d heads, seq %d, vocab %d: %zu parameters (%s)\n",
           c->layers, c->dim, c->heads, c->max_seq, c->vocab, n,
           dt_format_bytes((double)n * 4, sz, sizeof sz));
    if (mf.tok_kind >= 0 && mf.tok_kind < DT_TOKENIZER_COUNT)
        printf("tokenizer: %s, %d entries\n", dt_tokenizer_names[mf.tok_kind], mf.vocab_len);
    else
        printf("tokenizer: none recorded%s\n",
               c->vocab == 50257 ? " (GPT-2's vocabulary size: --tokenizer gpt2)" : "");
    dt_model_close(&mf);
    return 0;
}

static int run_info(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd, "expected one checkpoint, model file or folder");
    const char *path = a->argv[0];
    struct stat sb;
    dt_ckpt *ck = NULL;
    dt_status st;
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/ckpt", path);
    if (stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
        path = sub; /* a run folder: its checkpoints */
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        char magic[8] = "";
        FILE *f = fopen(path, "rb");
        size_t got = f ? fread(magic, 1, 8, f) : 0;
        if (f)
            fclose(f);
        if (got == 8 && memcmp(magic, "DTRNCKPT", 8) != 0)
            return print_model(path);
    }
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* A directory: the checkpoint resume would pick. */
        st = dt_ckpt_open_latest(&ck, path);
        if (st != DT_OK)
            return cli_fail(st);
    } else {
        st = dt_ckpt_open_unverified(&ck, path);
        if (st != DT_OK)
            return cli_fail(st);
    }
    char sz[32];
    size_t n = dt_ckpt_num_sections(ck);
    printf("file:      %s\n", dt_ckpt_file(ck));
    printf("format:    dtrain checkpoint version %" PRIu32 ", %s (%" PRIu64 " bytes), %zu "
           "sections\n",
           dt_ckpt_version(ck), dt_format_bytes((double)dt_ckpt_file_size(ck), sz, sizeof sz),
           dt_ckpt_file_size(ck), n);
    int rc = 0;
    if (cli_bool(a, "no-verify")) {
        printf("checksum:  not checked (--no-verify)\n");
    } else {
        uint64_t stored, computed;
        double t0 = dt_now();
        st = dt_ckpt_verify(ck, &stored, &computed);
        if (st == DT_OK) {
            printf("checksum:  ok (xxh3-64 %016" PRIx64 ", verified in %.3f s)\n", stored,
                   dt_now() - t0);
        } else {
            printf("checksum:  BAD (stored %016" PRIx64 ", computed %016" PRIx64
                   "): the file is damaged and will not be loaded\n",
                   stored, computed);
            rc = 1;
        }
    }
    dt_ckpt_info s;
    if (dt_ckpt_find(ck, "step", &s) == DT_OK && s.type == DT_CKPT_I64 && s.count == 1) {
        int64_t step;
        memcpy(&step, s.data, sizeof step);
        printf("step:      %" PRId64 "\n", step);
    }
    if (dt_ckpt_find(ck, "ident", &s) == DT_OK && s.type == DT_CKPT_I64 &&
        s.count == DT_TRAIN_IDENT_COUNT) {
        int64_t v[DT_TRAIN_IDENT_COUNT];
        memcpy(v, s.data, sizeof v);
        printf("run:      ");
        for (int i = 0; i < DT_TRAIN_IDENT_COUNT; i++) {
            bool opt = i == 5 && v[i] >= 0 && v[i] < DT_OPTIM_COUNT;
            printf("%s %s", i ? "," : "", dt_train_ident_names[i]);
            if (opt)
                printf(" %s", dt_optim_names[v[i]]);
            else
                printf(" %" PRId64, v[i]);
        }
        printf("\n");
    }
    printf("sections:\n  %-24s %-5s %14s %12s %12s\n", "name", "type", "count", "bytes", "offset");
    for (size_t i = 0; i < n; i++) {
        dt_ckpt_section_at(ck, i, &s);
        printf("  %-24s %-5s %14zu %12s %12" PRIu64, s.name, dt_ckpt_type_name(s.type), s.count,
               dt_format_bytes((double)s.bytes, sz, sizeof sz), s.offset);
        print_values(&s);
        printf("\n");
    }
    if (print_shards(dt_ckpt_file(ck), !cli_bool(a, "no-verify")) != 0)
        rc = 1;
    if (dt_ckpt_find(ck, "config", &s) == DT_OK && s.type == DT_CKPT_TEXT) {
        printf("config:\n");
        fwrite(s.data, 1, s.bytes, stdout);
        if (s.bytes == 0 || ((const char *)s.data)[s.bytes - 1] != '\n')
            printf("\n");
    }
    dt_ckpt_close(ck);
    return rc;
}

static const cli_cmd ckpt_info = {
    .name = "info",
    .parent = "ckpt",
    .summary = "show what a checkpoint holds and whether it is intact",
    .usage = "dtrain ckpt info [--no-verify] PATH",
    .description = "PATH is a checkpoint (.dtck), a checkpoint folder or a run folder (the\n"
                   "checkpoint --resume would pick), or a model file (.dtgw weights,\n"
                   "safetensors, llm.c .bin: its shape and tokenizer). Exit status 1 when a\n"
                   "checksum does not match.",
    .opts = info_opts,
    .run = run_info,
};

static const cli_opt ckpt_opts[] = {{0}};

static const cli_cmd *const ckpt_subs[] = {&ckpt_info};

static int run_ckpt(cli_args *a) {
    return cli_run_sub(a, ckpt_subs, 1, "action", "(expected: info)");
}

const cli_cmd cli_cmd_ckpt = {
    .name = "ckpt",
    .summary = "inspect checkpoints and model files: dtrain ckpt info PATH",
    .usage = "dtrain ckpt info PATH",
    .description = "actions:\n  info       sections, sizes, step, config and checksum status",
    .opts = ckpt_opts,
    .run = run_ckpt,
    .stop_at_positional = true,
    .subs = ckpt_subs,
    .nsubs = 1,
};
