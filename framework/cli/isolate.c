/* Plugin code that zt-run runs only to inspect a plugin (probe for --list-plugins and --env; probe,
 * init and fini for --check) runs in a forked child process. A plugin that crashes, aborts (an
 * uncaught C++ exception ends in std::terminate) or hangs there is reported by name and zt-run
 * exits normally with status 1, instead of dying with it. Loading (dlopen and the entry call) stays
 * in zt-run itself: it runs no plugin logic by contract, and the registry's crash guard names the
 * plugin if it does crash.
 *
 * The child writes "key<TAB>value" lines as it goes (flushed, so they survive a crash), and last
 * "status<TAB>N" followed by the message up to the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "cli/cli.h"

/* Values travel on one line each: control characters become spaces. */
void zt_child_report_line(FILE *report, const char *key, const char *value)
{
    fprintf(report, "%s\t", key);
    for (const char *c = value; *c; c++) fputc((unsigned char)*c < 0x20 ? ' ' : *c, report);
    fputc('\n', report);
    fflush(report);
}

void zt_child_report_call(FILE *report, const char *call, const zt_loaded_plugin *lp)
{
    char text[192];
    snprintf(text, sizeof text, "%s of plugin '%s'", call, lp->desc.name);
    zt_child_report_line(report, "library", lp->desc.library);
    zt_child_report_line(report, "call", text);
}

void zt_child_report_final(FILE *report, zt_status status, const char *message)
{
    fprintf(report, "status\t%d\n%s", (int)status, message ? message : "");
    fflush(report);
}

static void parse_report(char *text, child_result *r)
{
    char *line = text;
    while (line && *line) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *tab = strchr(line, '\t');
        if (tab) {
            *tab = '\0';
            const char *key = line, *value = tab + 1;
            if (!strcmp(key, "status")) {
                r->completed = 1;
                r->status = (zt_status)atoi(value);
                snprintf(r->message, sizeof r->message, "%s", next ? next : "");
                return;
            }
            if (!strcmp(key, "call")) snprintf(r->call, sizeof r->call, "%s", value);
            else if (!strcmp(key, "library")) snprintf(r->library, sizeof r->library, "%s", value);
            else if (!strcmp(key, "version")) snprintf(r->version, sizeof r->version, "%s", value);
            else if (!strcmp(key, "description")) snprintf(r->description, sizeof r->description, "%s", value);
            else if (!strcmp(key, "caps")) snprintf(r->caps, sizeof r->caps, "%s", value);
            else if (!strcmp(key, "abi")) sscanf(value, "%d.%d", &r->abi_major, &r->abi_minor);
            else if (!strcmp(key, "model_hidden")) r->model_hidden = strtoll(value, NULL, 10);
        }
        line = next;
    }
}

void zt_run_isolated(child_body body, void *arg, int quiet, int timeout_s, child_result *r)
{
    memset(r, 0, sizeof *r);
    int fds[2];
    if (pipe(fds) != 0) {
        r->completed = 1;
        r->status = ZT_ERR_INTERNAL;
        snprintf(r->message, sizeof r->message, "cannot create a pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        r->completed = 1;
        r->status = ZT_ERR_INTERNAL;
        snprintf(r->message, sizeof r->message, "cannot start a child process: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        int sink = quiet ? open("/dev/null", O_WRONLY) : STDERR_FILENO;
        if (sink >= 0) {
            dup2(sink, STDOUT_FILENO);
            dup2(sink, STDERR_FILENO);
        }
        FILE *report = fdopen(fds[1], "w");
        if (report) body(arg, report);
        _exit(0); /* no atexit handlers: they belong to the parent */
    }
    close(fds[1]);

    char *text = NULL;
    size_t len = 0, cap = 0;
    double deadline = timeout_s > 0 ? zt_now_s() + timeout_s : 0;
    for (;;) {
        int wait_ms = -1;
        if (timeout_s > 0) {
            double left = deadline - zt_now_s();
            if (left <= 0) {
                r->timed_out = 1;
                kill(pid, SIGKILL);
                break;
            }
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int ready = poll(&pfd, 1, wait_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) continue; /* the deadline check above ends the wait */
        char chunk[4096];
        ssize_t got = read(fds[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (len + (size_t)got + 1 > cap) {
            size_t bigger_cap = (len + (size_t)got + 1) * 2;
            char *bigger = realloc(text, bigger_cap);
            if (!bigger) continue; /* keep what fits; the report is then cut short, not wrong */
            text = bigger;
            cap = bigger_cap;
        }
        memcpy(text + len, chunk, (size_t)got);
        len += (size_t)got;
    }
    close(fds[0]);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(wstatus) && !r->timed_out) r->term_signal = WTERMSIG(wstatus);
    if (WIFEXITED(wstatus)) r->exit_code = WEXITSTATUS(wstatus);
    if (text) {
        text[len] = '\0';
        parse_report(text, r);
        free(text);
    }
    if (r->timed_out || r->term_signal) r->completed = 0;
}

void zt_child_failure(const child_result *r, const char *fallback_call, int timeout_s,
                                   zt_error *err)
{
    const char *call = r->call[0] ? r->call : fallback_call;
    const char *library = r->library[0] ? r->library : "unknown";
    if (r->timed_out) {
        zt_error_set(err, ZT_ERR_TIMEOUT,
                     "%s did not return within %d s, so zt-run stopped it. Library: %s. A probe must be "
                     "quick; report the hang to the plugin's author, or leave the plugin out of --plugins",
                     call, timeout_s, library);
    } else if (r->term_signal) {
        zt_error_set(err, ZT_ERR_INTERNAL,
                     "%s crashed (%s, signal %d)%s. Library: %s. zt-run ran it in a child process and is "
                     "unharmed; the plugin has a bug: report it to its author, or leave it out of --plugins",
                     call, strsignal(r->term_signal), r->term_signal,
                     r->term_signal == SIGABRT ? ": an assert failed or a C++ exception escaped the plugin" : "",
                     library);
    } else if (!r->completed) {
        zt_error_set(err, ZT_ERR_INTERNAL, "%s ended its process (exit status %d) instead of returning. Library: %s",
                     call, r->exit_code, library);
    } else {
        zt_error_set(err, r->status, "%s", r->message);
    }
}
