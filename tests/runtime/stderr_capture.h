/* Capture what the code under test writes to stderr (zt's log lines), so tests can assert the
 * messages a user would see. */
#ifndef ZT_TEST_STDERR_CAPTURE_H
#define ZT_TEST_STDERR_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct stderr_capture {
    int saved_fd;
    FILE *file;
    char text[16384];
} stderr_capture;

static void capture_begin(stderr_capture *c)
{
    fflush(stderr);
    c->file = tmpfile();
    if (!c->file) {
        perror("tmpfile");
        exit(2);
    }
    c->saved_fd = dup(STDERR_FILENO);
    dup2(fileno(c->file), STDERR_FILENO);
}

/* Restores stderr and returns everything written since capture_begin. */
static const char *capture_end(stderr_capture *c)
{
    fflush(stderr);
    dup2(c->saved_fd, STDERR_FILENO);
    close(c->saved_fd);
    rewind(c->file);
    size_t n = fread(c->text, 1, sizeof c->text - 1, c->file);
    c->text[n] = '\0';
    fclose(c->file);
    fputs(c->text, stderr); /* keep it in the test log too */
    return c->text;
}

#endif
