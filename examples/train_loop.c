/*
 * train_loop.c — a training loop in C on the public headers: a small GPT
 * learns to continue a repeating sequence with AdamW, one process. The
 * data, the model, the optimizer and the loop are all in view; dtrain train
 * adds ranks, checkpoints and the rest around the same calls.
 *
 *     cc train_loop.c $(pkg-config --cflags --libs dtrain) -o train_loop
 *     ./train_loop 50
 */
#include <dtrain/nn.h>
#include <dtrain/optim.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 50;
    enum { B = 4, T = 32, V = 16 };
    dt_gpt_config cfg = {.layers = 2, .dim = 32, .heads = 2, .max_seq = T, .vocab = V};
    dt_gpt *m = NULL;
    if (dt_gpt_create(&m, &cfg, B, T) != DT_OK) {
        fprintf(stderr, "train_loop: %s\n", dt_last_error());
        return 1;
    }
    dt_gpt_init_params(m, 1337);
    size_t n = dt_gpt_num_params(m);
    float *mom = calloc(n, sizeof *mom), *var = calloc(n, sizeof *var);
    int32_t inputs[B * T], targets[B * T];
    dt_adamw_config opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f};
    float first = 0, loss = 0;
    for (int step = 0; step < steps && mom && var; step++) {
        /* The sequence 0, 1, ..., V-1, 0, 1, ... from a random offset per row. */
        for (int b = 0; b < B; b++) {
            int start = (step * 7 + b * 3) % V;
            for (int t = 0; t < T; t++) {
                inputs[b * T + t] = (start + t) % V;
                targets[b * T + t] = (start + t + 1) % V;
            }
        }
        if (dt_gpt_forward(m, inputs, targets, B, T, &loss) != DT_OK ||
            dt_gpt_backward_mode(m, 1.0f, DT_GRAD_OVERWRITE, NULL, NULL) != DT_OK) {
            fprintf(stderr, "train_loop: %s\n", dt_last_error());
            return 1;
        }
        dt_adamw_step(dt_gpt_params(m), dt_gpt_grads(m), mom, var, n, 3e-3f, &opt, step + 1, 0.0f);
        if (step == 0)
            first = loss;
        if (step % 10 == 0 || step == steps - 1)
            printf("step %3d  loss %.4f\n", step + 1, (double)loss);
    }
    printf("%zu parameters, loss %.4f -> %.4f\n", n, (double)first, (double)loss);
    dt_gpt_destroy(m);
    free(mom);
    free(var);
    return loss < first ? 0 : 1;
}
