/*
 * logits_dump.c MODEL OUT ID... — the logits dtrain computes for one
 * sequence of token ids with a model read by dt_model_open (any format):
 * T x V float32 to OUT. tests/interop_safetensors.sh compares them with
 * the PyTorch reference's on the same file.
 */
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: logits_dump MODEL OUT ID...\n");
        return 2;
    }
    int T = argc - 3;
    dt_model_file mf;
    if (dt_model_open(&mf, argv[1], 0, 0) != DT_OK) {
        fprintf(stderr, "logits_dump: %s\n", dt_last_error());
        return 1;
    }
    const dt_gpt_config *c = dt_gpt_get_config(mf.model);
    int32_t *ids = calloc((size_t)T, sizeof *ids), *tgt = calloc((size_t)T, sizeof *tgt);
    for (int t = 0; t < T; t++)
        ids[t] = atoi(argv[3 + t]);
    /* With targets (any) the forward keeps every position's logits. */
    float loss;
    if (T > c->max_seq || dt_gpt_forward(mf.model, ids, tgt, 1, T, &loss) != DT_OK) {
        fprintf(stderr, "logits_dump: %s\n", T > c->max_seq ? "too many ids" : dt_last_error());
        return 1;
    }
    FILE *f = fopen(argv[2], "wb");
    fwrite(dt_gpt_logits(mf.model), sizeof(float), (size_t)T * (size_t)c->vocab, f);
    fclose(f);
    free(ids);
    free(tgt);
    dt_model_close(&mf);
    return 0;
}
