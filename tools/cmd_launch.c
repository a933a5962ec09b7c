/* cmd_launch.c — `mmc launch -n N RUN.yaml [--hostfile F] [--set k=v]... [--resume]
 * [-- extra mpirun args]`: a thin wrapper that checks the run config, then execs
 *   mpirun -np N [--allow-run-as-root] --bind-to none [--oversubscribe] [--hostfile F]
 *          -x OMP_NUM_THREADS [-x MMC_... (k_forward, those set)] [extra] <this mmc> train RUN.yaml
 *          --set parallel.data_parallel=N [--set ...] [--resume]
 * so that the data-parallel training of mmc_trainer runs on N processes (the same as
 * torchrun / deepspeed's launcher do for PyTorch, but MPI is the process manager here).
 * Threads per rank: training.threads, else OMP_NUM_THREADS, else cores / N (at least 1).
 * MMC_MPIRUN names the mpirun to use (default: mpirun on PATH). */
#include "cli.h"
#include "mmc_config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the MMC_* variables the library reads that every rank must see alike (test hooks excluded) */
static const char *const k_forward[] = {"MMC_DIST_TIMEOUT", "MMC_DP_BUCKET_BYTES", "MMC_GEMM_KERNEL",
                                        "MMC_GEMM_BLOCKING", "MMC_GEMM_BF16", "MMC_GEMM_SPLIT", "MMC_CONV_COL_MB",
                                        "MMC_CONV_ALGO", "MMC_ATTN_TILES", "MMC_MATMUL_PRECISION", NULL};

void help_launch(FILE *f) {
    fprintf(f,
            "usage: mmc launch -n N RUN.yaml [--hostfile FILE] [--set key.path=value]... [--resume]\n"
            "                  [--print] [-- extra mpirun arguments]\n\n"
            "Run `mmc train RUN.yaml` on N data-parallel processes with mpirun (OpenMPI). The config's\n"
            "parallel.data_parallel is set to N (N / (tensor_parallel x pipeline_parallel x context_parallel) with model parallelism);\n"
            "data.batch_size stays the global batch and must divide into data_parallel x data.micro_batch_size. Only rank 0 prints progress and writes logs/checkpoints.\n\n"
            "options:\n"
            "  -n, --np, -np N       number of processes (ranks)\n"
            "  --hostfile FILE       mpirun hostfile for a multi-node run (\"host slots=K\" per line)\n"
            "  --set key.path=value  config override passed on to mmc train (repeatable)\n"
            "  --resume              continue from the latest complete checkpoint (any rank count / ZeRO stage)\n"
            "  --print               print the mpirun command line and exit without running it\n"
            "  -- ARGS               everything after -- goes to mpirun before the program\n\n"
            "mpirun flags added: --bind-to none; -x OMP_NUM_THREADS; -x NAME for each of these that is set:\n"
            " ");
    for (int i = 0; k_forward[i]; i++) fprintf(f, "%s%s", i ? ", " : " ", k_forward[i]);
    fprintf(f,
            "\n"
            "(no other variable is forwarded: add -x NAME after --); --allow-run-as-root when run as\n"
            "root; --oversubscribe when N exceeds the cores here and no hostfile is given.\n"
            "threads per rank: training.threads, else OMP_NUM_THREADS, else cores / N (at least 1).\n"
            "environment: MMC_MPIRUN (mpirun to exec), MMC_DIST_TIMEOUT (overrides parallel.timeout).\n\n"
            "examples:\n"
            "  mmc launch -n 4 run.yaml\n"
            "  mmc launch -n 16 run.yaml --hostfile hosts.txt -- --mca btl_tcp_if_include eth0\n");
}

/* mpirun on PATH (or MMC_MPIRUN): a full path in out, or false */
static bool find_mpirun(char *out, size_t cap) {
    const char *env = getenv("MMC_MPIRUN");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return strchr(env, '/') ? access(env, X_OK) == 0 : true;
    }
    const char *path = getenv("PATH");
    if (!path) return false;
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len > 0) {
            snprintf(out, cap, "%.*s/mpirun", (int)len, path);
            if (access(out, X_OK) == 0) return true;
        }
        path += len + (end ? 1 : 0);
    }
    return false;
}

int cmd_launch(int argc, char **argv) {
    long long n = 0;
    const char *file = NULL, *hostfile = NULL;
    bool resume = false, print_only = false;
    int extra_at = argc;   /* index of the first argument after -- */
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0, rc = CLI_USAGE;
    char **av = NULL;
    char *setdp = NULL;
    if (!sets) return cli_fail(MMC_ERR_OOM, "launch: out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--") == 0) { extra_at = i + 1; break; }
        int sr = cli_set_arg(argc, argv, &i, &sets[n_sets]);
        if (sr < 0) goto out;
        if (sr > 0) n_sets++;
        else if (strcmp(a, "-n") == 0 || strcmp(a, "--np") == 0 || strcmp(a, "-np") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1 << 20, &n)) goto out;
        } else if (strcmp(a, "--hostfile") == 0) {
            if (!(hostfile = cli_value(argc, argv, &i))) goto out;
        } else if (strcmp(a, "--resume") == 0) {
            resume = true;
        } else if (strcmp(a, "--print") == 0) {
            print_only = true;
        } else if (a[0] == '-' && a[1]) {
            cli_usage("launch", "unknown option '%s' (mpirun options go after --)", a);
            goto out;
        } else if (file) {
            cli_usage("launch", "one run config expected, got '%s' and '%s'", file, a);
            goto out;
        } else {
            file = a;
        }
    }
    if (n <= 0 || !file) {
        cli_usage("launch", "%s", !file ? "missing RUN.yaml" : "missing -n N");
        goto out;
    }
    if (hostfile && access(hostfile, R_OK) != 0) {
        rc = cli_fail(MMC_OK, "launch: --hostfile %s: %s", hostfile, strerror(errno));
        goto out;
    }
    /* check the config here (with parallel.data_parallel = N) so a bad one fails once,
     * before any process starts; it also gives training.threads */
    size_t sl = 64;
    if (!(setdp = malloc(sl))) { rc = cli_fail(MMC_ERR_OOM, "launch: out of memory"); goto out; }
    snprintf(setdp, sl, "parallel.data_parallel=%lld", n);
    const char **all = calloc((size_t)n_sets + 2, sizeof *all);
    if (!all) { rc = cli_fail(MMC_ERR_OOM, "launch: out of memory"); goto out; }
    all[0] = setdp;
    for (int i = 0; i < n_sets; i++) all[i + 1] = sets[i];
    mmc_run_config cfg;
    mmc_status st = mmc_run_config_load(file, all, n_sets + 1, &cfg);
    /* tensor / pipeline / context parallelism: N ranks are N / (tp x pp x cp) replicas */
    long long mp = st ? 1 : (long long)cfg.parallel.tensor_parallel * (long long)cfg.parallel.pipeline_parallel *
                                  (long long)cfg.parallel.context_parallel;
    if (st) {   /* data_parallel N may be what failed (the batch split): read the sizes without it */
        mmc_run_config c2;
        if (mmc_run_config_load(file, all + 1, n_sets, &c2) == MMC_OK) {
            mp = (long long)c2.parallel.tensor_parallel * (long long)c2.parallel.pipeline_parallel *
                 (long long)c2.parallel.context_parallel;
            mmc_run_config_free(&c2);
        }
    }
    if (mp > 1 && n % mp == 0) {
        snprintf(setdp, sl, "parallel.data_parallel=%lld", n / mp);
        if (!st) mmc_run_config_free(&cfg);
        st = mmc_run_config_load(file, all, n_sets + 1, &cfg);
    }
    free(all);
    if (st) { rc = cli_fail(st, "launch"); goto out; }
    long long threads = cfg.training.threads;
    mmc_run_config_free(&cfg);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (threads <= 0) {
        const char *omp = getenv("OMP_NUM_THREADS");
        threads = omp ? atoll(omp) : 0;
        if (threads <= 0) threads = cores / n > 0 ? cores / n : 1;
    }
    char tbuf[32];
    snprintf(tbuf, sizeof tbuf, "%lld", threads);
    setenv("OMP_NUM_THREADS", tbuf, 1);

    char mpirun[PATH_MAX], self[PATH_MAX];
    if (!find_mpirun(mpirun, sizeof mpirun)) {
        rc = cli_fail(MMC_OK, "launch: mpirun not found (%s); install OpenMPI (Debian: apt-get install "
                      "openmpi-bin libopenmpi-dev) or set MMC_MPIRUN, or start the ranks yourself "
                      "(srun mmc train RUN.yaml under Slurm)",
                      getenv("MMC_MPIRUN") ? getenv("MMC_MPIRUN") : "not on PATH");
        goto out;
    }
    ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sn <= 0) snprintf(self, sizeof self, "%s", "mmc");
    else self[sn] = 0;

    size_t cap = (size_t)argc * 2 + 64;
    av = calloc(cap, sizeof *av);
    if (!av) { rc = cli_fail(MMC_ERR_OOM, "launch: out of memory"); goto out; }
    int k = 0;
    char npbuf[32];
    snprintf(npbuf, sizeof npbuf, "%lld", n);
    av[k++] = mpirun;
    av[k++] = "-np";
    av[k++] = npbuf;
    if (geteuid() == 0) av[k++] = "--allow-run-as-root";
    av[k++] = "--bind-to";
    av[k++] = "none";
    if (!hostfile && n > cores) av[k++] = "--oversubscribe";
    if (hostfile) { av[k++] = "--hostfile"; av[k++] = (char *)hostfile; }
    av[k++] = "-x";
    av[k++] = "OMP_NUM_THREADS";
    for (int i = 0; k_forward[i]; i++)
        if (getenv(k_forward[i])) { av[k++] = "-x"; av[k++] = (char *)k_forward[i]; }
    for (int i = extra_at; i < argc; i++) av[k++] = argv[i];
    av[k++] = self;
    av[k++] = "train";
    av[k++] = (char *)file;
    av[k++] = "--set";
    av[k++] = setdp;
    for (int i = 0; i < n_sets; i++) { av[k++] = "--set"; av[k++] = (char *)sets[i]; }
    if (resume) av[k++] = "--resume";
    av[k] = NULL;
    fprintf(stderr, "mmc launch:");
    for (int i = 0; i < k; i++) fprintf(stderr, " %s", av[i]);
    fprintf(stderr, "  (OMP_NUM_THREADS=%s)\n", tbuf);
    if (print_only) { rc = CLI_OK; goto out; }
    fflush(NULL);
    execv(mpirun, av);
    if (errno == ENOENT || !strchr(mpirun, '/')) execvp(mpirun, av);
    rc = cli_fail(MMC_OK, "launch: cannot run %s: %s", mpirun, strerror(errno));
out:
    free(av);
    free(setdp);
    free(sets);
    return rc;
}
