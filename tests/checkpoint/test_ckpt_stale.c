/* Stale staging directories (framework/state/checkpoint_write.c): a save killed part way leaves a
 * step-N.tmp-* directory as big as a checkpoint. zt_ckpt_remove_stale_staging removes those whose
 * writer is provably gone (this boot, this pid namespace, no such process: here a child process that
 * staged a save and exited) and leaves everything else: a live writer's, one written on another
 * machine, one without writer.json (an older zt), a damaged step directory, complete checkpoints. The
 * expected sizes are measured here with stat, the writer identity read from /proc here. */
#include "ckpt_fixture.h"

#include <signal.h>
#include <sys/wait.h>

#include "runtime/stderr_capture.h"

static uint64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* A file of n bytes in dir. */
static void put_file(const char *dir, const char *name, size_t n)
{
    char *p = path_in(dir, name);
    char *data = calloc(1, n ? n : 1);
    write_bytes(p, data, n);
    free(data);
    free(p);
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* A staging directory as zt_ckpt_stage makes it, from a process that then dies: its path. */
static char *stage_in_dead_child(const char *root, int64_t step, pid_t *child_pid)
{
    int fds[2];
    if (pipe(fds) != 0) return NULL;
    pid_t pid = fork();
    if (pid == 0) {
        zt_error err = {0};
        char *staging = NULL;
        if (zt_ckpt_stage(root, step, &staging, &err) != ZT_OK) _exit(1);
        put_file(staging, "rank-00000.bin", 5000); /* what a killed save had written */
        ssize_t ignored = write(fds[1], staging, strlen(staging) + 1);
        (void)ignored;
        _exit(0); /* no commit, no cleanup: as if killed */
    }
    close(fds[1]);
    char buf[4096] = "";
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    *child_pid = pid;
    if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return NULL;
    buf[n] = '\0';
    return strdup(buf);
}

static void test_stale_staging(void)
{
    char *root = make_scratch_dir("zt-stale");
    zt_error err = {0};

    /* this process's own save in progress: its writer is alive */
    char *live = NULL;
    ZT_CHECK_INT(zt_ckpt_stage(root, 10, &live, &err), ZT_OK);
    char *writer = path_in(live, "writer.json");
    size_t n = 0;
    char *text = (char *)read_bytes(writer, &n);
    char pid_text[64], host[256] = "", boot[64] = "";
    snprintf(pid_text, sizeof pid_text, "\"pid\": %ld}", (long)getpid());
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f && fgets(boot, sizeof boot, f)) boot[strcspn(boot, "\n")] = '\0';
    if (f) fclose(f);
    ZT_CHECK_CONTAINS(text, pid_text);
    ZT_CHECK_CONTAINS(text, host);
    ZT_CHECK_CONTAINS(text, boot);
    free(text);
    free(writer);

    /* killed saves */
    pid_t dead_pid = 0;
    char *dead = stage_in_dead_child(root, 20, &dead_pid);
    ZT_CHECK(dead != NULL);
    if (!dead) return;
    char *dead_writer = path_in(dead, "writer.json");
    uint64_t dead_bytes = file_size(dead_writer) + 5000;
    size_t wn = 0;
    char *dead_text = (char *)read_bytes(dead_writer, &wn);
    free(dead_writer);
    ZT_CHECK(kill(dead_pid, 0) != 0); /* reaped: no such process */

    /* the same dead pid on another machine (another boot id): its pids mean nothing here */
    char *other = path_in(root, "step-000030.tmp-1-abcdef");
    mkdir(other, 0777);
    char other_text[512];
    snprintf(other_text, sizeof other_text,
             "{\"host\": \"elsewhere\", \"boot_id\": \"00000000-0000-0000-0000-000000000000\", \"pid_ns\": "
             "\"pid:[1]\", \"pid\": %ld}\n",
             (long)dead_pid);
    char *p = path_in(other, "writer.json");
    write_bytes(p, other_text, strlen(other_text));
    free(p);
    put_file(other, "rank-00000.bin", 100);
    /* a staging directory without writer.json (a zt before it had one) */
    char *old = path_in(root, "step-000040.tmp-99999-zzzzzz");
    mkdir(old, 0777);
    put_file(old, "rank-00000.bin", 100);
    /* a step directory without checkpoint.json (damaged, not a staging directory), naming the dead writer */
    char *damaged = path_in(root, "step-000050");
    mkdir(damaged, 0777);
    p = path_in(damaged, "writer.json");
    write_bytes(p, dead_text, wn);
    free(p);
    /* a complete checkpoint */
    fix_model m;
    fix_model_init(&m, 0, 1, 1);
    char *complete = fix_save(&m, root, 60, 1, 0);
    char *published_writer = path_in(complete, "writer.json");
    ZT_CHECK(!file_exists(published_writer)); /* the commit removed it */
    free(published_writer);

    stderr_capture cap;
    capture_begin(&cap);
    int64_t removed = -1;
    uint64_t bytes = 0;
    ZT_CHECK_INT(zt_ckpt_remove_stale_staging(root, &removed, &bytes, &err), ZT_OK);
    const char *logged = capture_end(&cap);
    ZT_CHECK_INT(removed, 1);
    ZT_CHECK_INT(bytes, dead_bytes);
    char want[4200];
    snprintf(want, sizeof want, "removed stale checkpoint staging directory %s (%llu bytes): its writer, process %ld",
             dead, (unsigned long long)dead_bytes, (long)dead_pid);
    ZT_CHECK_CONTAINS(logged, want);
    ZT_CHECK(!is_dir(dead));
    ZT_CHECK(is_dir(live));
    ZT_CHECK(is_dir(other));
    ZT_CHECK(is_dir(old));
    ZT_CHECK(is_dir(damaged));
    zt_ckpt *c = NULL;
    ZT_CHECK_INT(zt_ckpt_open(complete, &c, &err), ZT_OK);
    zt_ckpt_close(c);
    /* nothing left to remove */
    ZT_CHECK_INT(zt_ckpt_remove_stale_staging(root, &removed, &bytes, &err), ZT_OK);
    ZT_CHECK_INT(removed, 0);
    /* a missing root is no error */
    char *missing = path_in(root, "nowhere");
    ZT_CHECK_INT(zt_ckpt_remove_stale_staging(missing, &removed, NULL, &err), ZT_OK);
    ZT_CHECK_INT(removed, 0);

    free(missing);
    free(dead_text);
    free(complete);
    free(damaged);
    free(old);
    free(other);
    free(dead);
    free(live);
    remove_tree(root);
    free(root);
}

int main(void)
{
    if (access("/proc/self/ns/pid", F_OK) != 0 || access("/proc/sys/kernel/random/boot_id", R_OK) != 0)
        ZT_SKIP("no /proc: a writer's pid cannot be checked here, so nothing is ever removed");
    test_stale_staging();
    return zt_test_result();
}
