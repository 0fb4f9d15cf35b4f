/*
 * test_cli_config.c — `--config FILE` in the shared flag parser: values
 * from the file act as defaults below flags and DT_* variables; comments,
 * quotes and blank lines; unknown keys, duplicates, malformed lines, bad
 * values and missing files are errors naming the file, line and key.
 * Error cases run in a child (cli_parse exits 2) with stderr captured.
 */
#include "cli/cli.h"
#include "test.h"

#include <sys/wait.h>
#include <unistd.h>

static const char *const modes[] = {"fast", "slow", NULL};
static const cli_opt opts[] = {
    {"config", 0, CLI_STRING, "FILE", NULL, "DT_TEST_CONFIG", "config file", NULL, 0, 0},
    {"lr", 0, CLI_DOUBLE, "X", "0.1", NULL, "learning rate", NULL, 0, 10},
    {"steps", 0, CLI_INT, "N", "10", "DT_TEST_STEPS", "steps", NULL, 1, 1000},
    {"name", 0, CLI_STRING, "S", "anon", NULL, "a name", NULL, 0, 0},
    {"verbose", 'v', CLI_FLAG, NULL, NULL, NULL, "talk", NULL, 0, 0},
    {"mode", 0, CLI_ENUM, "M", "fast", NULL, "mode", modes, 0, 0},
    {"bucket", 0, CLI_SIZE, "SIZE", "25M", NULL, "bucket", NULL, 1, 1e12},
    {0},
};
static const cli_cmd cmd = {.name = "train", .usage = "dtrain train", .opts = opts};

static char dir[64];

static const char *write_cfg(const char *name, const char *text) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

static void parse(cli_args *a, int argc, const char **argv) {
    cli_parse(&cmd, argc, (char **)argv, a);
}

static void test_precedence(void) {
    const char *cfg = write_cfg("a.cfg", "# a comment\n"
                                         "\n"
                                         "lr = 0.25   # trailing comment\n"
                                         "  steps=7\n"
                                         "name = \"has # and spaces\"\n"
                                         "verbose = true\n"
                                         "mode = slow\n"
                                         "bucket = 4M\n");
    static cli_args a; /* static: the values it points to stay reachable (LSan) */
    const char *argv1[] = {"train", "--config", cfg};
    parse(&a, 3, argv1);
    ASSERT_NEAR(cli_double(&a, "lr"), 0.25, 0, 0);
    ASSERT_EQ(cli_int(&a, "steps"), 7);
    ASSERT_STREQ(cli_str(&a, "name"), "has # and spaces");
    ASSERT_TRUE(cli_bool(&a, "verbose"));
    ASSERT_EQ(cli_enum(&a, "mode"), 1);
    ASSERT_EQ(cli_size(&a, "bucket"), 4u << 20);
    ASSERT_STREQ(cli_get(&a, "lr")->from, "config");
    ASSERT_TRUE(cli_is_set(&a, "lr"));

    /* Flags win over the file; the environment wins over the file too. */
    setenv("DT_TEST_STEPS", "9", 1);
    const char *argv2[] = {"train", "--lr", "0.5", "--config", cfg};
    parse(&a, 5, argv2);
    ASSERT_NEAR(cli_double(&a, "lr"), 0.5, 0, 0);
    ASSERT_STREQ(cli_get(&a, "lr")->from, "flag");
    ASSERT_EQ(cli_int(&a, "steps"), 9);
    ASSERT_STREQ(cli_get(&a, "steps")->from, "env");
    const char *argv3[] = {"train", "--steps", "3", "--config", cfg};
    parse(&a, 5, argv3);
    ASSERT_EQ(cli_int(&a, "steps"), 3);
    unsetenv("DT_TEST_STEPS");

    /* Without --config nothing from the file; the file can come from env. */
    const char *argv4[] = {"train"};
    parse(&a, 1, argv4);
    ASSERT_NEAR(cli_double(&a, "lr"), 0.1, 0, 0);
    ASSERT_STREQ(cli_get(&a, "lr")->from, "default");
    ASSERT_TRUE(!cli_bool(&a, "verbose"));
    setenv("DT_TEST_CONFIG", cfg, 1);
    parse(&a, 1, argv4);
    ASSERT_NEAR(cli_double(&a, "lr"), 0.25, 0, 0);
    unsetenv("DT_TEST_CONFIG");
}

/* Parse in a child; return its exit code and its stderr in err. */
static char err[512]; /* small: ASSERT_CONTAINS formats it into 1 KiB */
static int parse_fails(int argc, const char **argv) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        alarm(20); /* a reader that never returns fails the test, not its timeout */
        static cli_args a;
        parse(&a, argc, argv);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while ((r = read(fds[0], err + n, sizeof err - 1 - n)) > 0)
        n += (size_t)r;
    err[n] = '\0';
    close(fds[0]);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void expect_error(const char *cfgtext, const char *needle) {
    const char *cfg = write_cfg("bad.cfg", cfgtext);
    const char *argv[] = {"train", "--config", cfg};
    ASSERT_EQ(parse_fails(3, argv), 2);
    ASSERT_CONTAINS(err, needle);
    ASSERT_CONTAINS(err, "bad.cfg");
}

static void test_errors(void) {
    expect_error("lr = 0.1\n\nlearning_rate = 3\n", "bad.cfg:3: unknown key 'learning_rate'");
    expect_error("steps = 2\nsteps = 3\n",
                 "bad.cfg:2: duplicate key 'steps' (first set on line 1)");
    expect_error("# ok\nlr 0.1\n", "bad.cfg:2: expected 'key = value', got 'lr 0.1'");
    expect_error("steps = 0\n", "bad.cfg:1: steps");
    expect_error("lr = fast\n", "bad.cfg:1: lr");
    expect_error("mode = medium\n", "bad.cfg:1: mode");
    expect_error("config = other.cfg\n", "unknown key 'config'");
    const char *argv[] = {"train", "--config", "/nonexistent/x.cfg"};
    ASSERT_EQ(parse_fails(3, argv), 2);
    ASSERT_CONTAINS(err, "--config /nonexistent/x.cfg: No such file or directory");
    /* Bounded: an endless file (it used to be read until memory ran out),
     * an endless line, binary data. */
    const char *zero[] = {"train", "--config", "/dev/zero"};
    ASSERT_EQ(parse_fails(3, zero), 2);
    ASSERT_CONTAINS(err, "--config /dev/zero: larger than 1 MiB");
    static char line[6000];
    memset(line, 'x', sizeof line - 2);
    memcpy(line, "lr = ", 5);
    line[sizeof line - 2] = '\n';
    expect_error(line, "bad.cfg:1: line longer than 4096 bytes");
    const char *bin = write_cfg("bad.cfg", "lr = 0.1\nsteps");
    FILE *f = fopen(bin, "ab");
    ASSERT_TRUE(f != NULL);
    fwrite("\0= 3\n", 1, 5, f);
    fclose(f);
    const char *argv_bin[] = {"train", "--config", bin};
    ASSERT_EQ(parse_fails(3, argv_bin), 2);
    ASSERT_CONTAINS(err, "bad.cfg:2: a NUL byte");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dt_clicfg_XXXXXX");
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    RUN(test_precedence);
    RUN(test_errors);
    char cmdline[128];
    snprintf(cmdline, sizeof cmdline, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmdline), 0);
    return TEST_SUMMARY();
}
