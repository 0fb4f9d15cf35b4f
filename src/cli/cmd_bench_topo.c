/*
 * cmd_bench_topo.c — `dtrain bench topo`: measure the links between the
 * ranks of a job (dt_group_probe) and print what was found: the hierarchy
 * (hosts, ranks per host, whether latency confirms them, switch groups),
 * alpha and beta per link class, the latency and bandwidth of every pair,
 * and the allreduce algorithm the chooser now picks at a few sizes.
 */
#include "cli.h"
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const transport_choices[] = {"auto", "shm", "tcp", NULL};

static const cli_opt topo_opts[] = {
    {"nproc", 'n', CLI_INT, "N", "0", NULL,
     "start N local ranks (0: join the job of dtrain launch, mpirun, srun or torchrun)", NULL, 0,
     256},
    {"bytes", 0, CLI_SIZE, "SIZE", "1M", NULL, "message size of the bandwidth ping-pong", NULL,
     1024, 1 << 30},
    {"quick", 0, CLI_FLAG, NULL, NULL, NULL,
     "one pair per link class instead of every pair (what DT_TOPO_PROBE=1 runs)", NULL, 0, 0},
    {"transport", 0, CLI_ENUM, "T", "auto", "DT_TRANSPORT", "transport", transport_choices, 0, 0},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "one JSON object instead of the tables", NULL, 0, 0},
    {0},
};

/* Sizes at which the chooser's allreduce choice is shown. */
static const size_t choice_sizes[] = {64 << 10, 1 << 20, 16 << 20};
#define NCHOICES (sizeof choice_sizes / sizeof choice_sizes[0])

static json_t *link_json(const dt_link_params *l) {
    return json_pack("{s:i, s:o, s:o}", "pairs", l->pairs, "alpha_us", cli_json_num(l->alpha * 1e6),
                     "beta_gbs", cli_json_num(l->beta * 1e-9));
}

static void print_matrix(const char *title, const double *m, int n, double scale) {
    printf("%s\n%6s", title, "");
    for (int b = 0; b < n; b++)
        printf("%9d", b);
    printf("\n");
    for (int a = 0; a < n; a++) {
        printf("%6d", a);
        for (int b = 0; b < n; b++)
            if (a == b || m[a * n + b] <= 0)
                printf("%9s", "-");
            else
                printf("%9.2f", m[a * n + b] * scale);
        printf("\n");
    }
}

static void report(dt_group *g, const dt_topology *t, const double *lat, const double *bw,
                   bool quick, size_t bytes, bool json) {
    const dt_link_params *in = &t->link[DT_LINK_INTRA], *x = &t->link[DT_LINK_INTER];
    if (json) {
        json_t *choice = json_object();
        for (size_t i = 0; i < NCHOICES; i++) {
            char k[32];
            snprintf(k, sizeof k, "%zu", choice_sizes[i]);
            json_object_set_new(choice, k,
                                json_string(dt_algo_name(
                                    dt_group_algo_for(g, DT_COLL_ALLREDUCE, choice_sizes[i]))));
        }
        cli_json_line(json_pack("{s:i, s:i, s:i, s:b, s:i, s:s, s:o, s:o, s:o}", "ranks", t->size,
                                "hosts", t->nhosts, "ranks_per_host", t->ranks_per_host,
                                "hosts_confirmed", t->hosts_confirmed, "switches", t->switches,
                                "transport", dt_group_transport(g), "intra", link_json(in), "inter",
                                link_json(x), "allreduce", choice));
        return;
    }
    printf("# dtrain bench topo: %d ranks, transport %s, %zu-byte messages, %s\n", t->size,
           dt_group_transport(g), bytes, quick ? "one pair per class" : "every pair");
    if (t->ranks_per_host)
        printf("hierarchy: %d host(s) x %d rank(s)", t->nhosts, t->ranks_per_host);
    else
        printf("hierarchy: %d hosts with different rank counts", t->nhosts);
    printf(", latency confirms the hosts: %s, switch groups: %d\n",
           t->hosts_confirmed      ? "yes"
           : in->pairs && x->pairs ? "no"
                                   : "n/a",
           t->switches);
    printf("%-6s %6s %11s %11s\n", "class", "pairs", "alpha(us)", "beta(GB/s)");
    const char *names[DT_LINK_CLASS_COUNT] = {"intra", "inter"};
    for (int c = 0; c < DT_LINK_CLASS_COUNT; c++)
        if (t->link[c].pairs)
            printf("%-6s %6d %11.2f %11.3f\n", names[c], t->link[c].pairs, t->link[c].alpha * 1e6,
                   t->link[c].beta * 1e-9);
    if (!quick) {
        print_matrix("latency (us), rank x rank:", lat, t->size, 1e6);
        print_matrix("bandwidth (GB/s), rank x rank:", bw, t->size, 1e-9);
    }
    printf("allreduce chooser with these links:");
    for (size_t i = 0; i < NCHOICES; i++)
        printf(" %zuK %s", choice_sizes[i] >> 10,
               dt_algo_name(dt_group_algo_for(g, DT_COLL_ALLREDUCE, choice_sizes[i])));
    printf("\n");
}

static int run_topo(cli_args *a) {
    int np = (int)cli_int(a, "nproc");
    if (np > 0 && !getenv("DT_RANK") && !getenv("OMPI_COMM_WORLD_RANK"))
        return cli_bench_self_launch(np, a);
    setenv("DT_TRANSPORT", cli_str(a, "transport"), 1);
    dt_group *g = NULL;
    dt_status st = dt_group_init_from_env(&g);
    if (st != DT_OK)
        return cli_fail(st);
    int n = dt_group_size(g);
    bool quick = cli_bool(a, "quick");
    size_t bytes = cli_size(a, "bytes");
    double *lat = calloc((size_t)n * (size_t)n, sizeof *lat);
    double *bw = calloc((size_t)n * (size_t)n, sizeof *bw);
    dt_topology t;
    if (!lat || !bw)
        st = dt_error_set(DT_ERR_NOMEM, "bench topo: out of memory for %d ranks", n);
    if (st == DT_OK)
        st = dt_group_probe(g, !quick, bytes, &t, lat, bw);
    int rc = st == DT_OK ? 0 : cli_fail(st);
    if (st == DT_OK && dt_group_rank(g) == 0)
        report(g, &t, lat, bw, quick, bytes, cli_bool(a, "json"));
    free(lat);
    free(bw);
    dt_group_destroy(g);
    return rc;
}

const cli_cmd cli_bench_topo = {
    .name = "topo",
    .parent = "bench",
    .summary = "link latency/bandwidth per pair of ranks, hierarchy, alpha-beta per class",
    .usage = "dtrain bench topo [--nproc N] [--bytes SIZE] [--quick] [--json]",
    .description = "Ping-pongs between every pair of ranks, one pair at a time (8 bytes for\n"
                   "latency, --bytes for bandwidth), then prints the hierarchy (hosts, ranks\n"
                   "per host, whether latency confirms them, groups of hosts closer to each\n"
                   "other than to the rest), the alpha-beta parameters of each link class\n"
                   "(inside a host, between hosts), the per-pair matrices and the allreduce\n"
                   "algorithm the chooser picks with the measured links. Start it with\n"
                   "--nproc N or under a launcher, like `dtrain bench comm`.",
    .opts = topo_opts,
    .run = run_topo,
};
