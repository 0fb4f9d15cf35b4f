/*
 * cmd_export.c — `dtrain export`: write a trained model in a format other
 * tools read. Today one format: safetensors with Hugging Face GPT-2 names
 * and layouts, which transformers' GPT2LMHeadModel and the reference model
 * of tests/reference load (dt_model_export_safetensors).
 */
#include "cli.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <string.h>

static const char *const formats[] = {"safetensors", NULL};

static const cli_opt export_opts[] = {
    {"format", 'f', CLI_ENUM, "FORMAT", "safetensors", NULL, "file format to write", formats, 0, 0},
    {"output", 'o', CLI_STRING, "FILE", NULL, NULL,
     "the file to write (default: model.safetensors next to the input)", NULL, 0, 0},
    {"heads", 0, CLI_INT, "NH", "0", NULL,
     "attention heads when the input does not record them (0: the file's, else dim / 64)", NULL, 0,
     4096},
    {0},
};

static int run_export(cli_args *a) {
    if (a->argc != 1)
        cli_usage_error(a->cmd,
                        "expected one model PATH (a run folder, checkpoint, .dtgw, "
                        ".safetensors or llm.c .bin), got %d arguments",
                        a->argc);
    dt_model_file mf;
    dt_status st = dt_model_open(&mf, a->argv[0], 0, (int)cli_int(a, "heads"));
    if (st != DT_OK)
        return cli_fail(st);
    char out[4200];
    const char *o = cli_str(a, "output");
    if (o && *o) {
        snprintf(out, sizeof out, "%s", o);
    } else {
        const char *slash = strrchr(mf.path, '/');
        int dir = slash ? (int)(slash - mf.path) : 0;
        snprintf(out, sizeof out, "%.*s%smodel.safetensors", dir, mf.path, slash ? "/" : "");
    }
    st = dt_model_export_safetensors(&mf, out);
    const dt_gpt_config *c = dt_gpt_get_config(mf.model);
    if (st == DT_OK)
        printf("wrote %s: %s of %d layers, dim %d, %d heads, seq %d, vocab %d (from %s %s)\n", out,
               cli_enum(a, "format") == 0 ? "safetensors" : "?", c->layers, c->dim, c->heads,
               c->max_seq, c->vocab, dt_model_format_names[mf.format], mf.path);
    dt_model_close(&mf);
    return st == DT_OK ? 0 : cli_fail(st);
}

const cli_cmd cli_cmd_export = {
    .name = "export",
    .summary = "write a model as safetensors (Hugging Face GPT-2 names and layouts)",
    .usage = "dtrain export [--format safetensors] [-o FILE] PATH",
    .description = "PATH is a run folder, a checkpoint (file or folder), a weights file, a\n"
                   "safetensors or an llm.c model file. The output loads in Hugging Face's\n"
                   "GPT2LMHeadModel (config: n_layer, n_embd, n_head, n_positions, vocab_size)\n"
                   "and back into dtrain with `dtrain train --init-from FILE`.",
    .opts = export_opts,
    .run = run_export,
};
