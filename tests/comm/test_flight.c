/* The flight recorder in one process (dist/flight.h): this process records as rank 0 of 2 into a
 * ring of 4 entries and dumps; rank 1's dump is written here by hand, one collective behind. The
 * analysis must name rank 1 by its pid as behind, with its last collective and the one rank 0 waits
 * in; with rank 1's dump gone it must find rank 1 by elimination; a damaged dump is an error naming
 * its file and line. The multi-rank runs are tests/train/faults.sh flight_stop and flight_kill. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/flight.h"
#include "ztest.h"

static char *analysis(const char *dir, const zt_flight_rank_state *states, zt_status *st, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    int n = 0;
    *st = zt_flight_analyze(dir, 2, states, out, "> ", &n, err);
    fclose(out);
    return text;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ZT_CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

int main(void)
{
    char dir[] = "/tmp/zt-test-flight-XXXXXX";
    ZT_CHECK(mkdtemp(dir) != NULL);
    zt_error err;
    ZT_CHECK_INT(zt_flight_init(0, 2, 4, &err), ZT_OK);
    zt_flight_set_dir(dir);
    const int32_t both[2] = {0, 1};
    int32_t dp = zt_flight_group("dp", both, 2, 0);
    ZT_CHECK_INT(dp, 0);
    /* Six collectives on 'dp': the ring keeps #3..#6; #6, a broadcast, is still in flight. */
    for (int i = 0; i < 5; i++) {
        uint64_t t = zt_flight_issue(dp, ZT_FLIGHT_ALL_REDUCE, 16, ZT_F32, 64, -1);
        ZT_CHECK_INT(t, i + 1);
        zt_flight_returned(t, 1, 0);
    }
    uint64_t open_one = zt_flight_issue(dp, ZT_FLIGHT_BROADCAST, 16, ZT_F32, 64, 1);
    ZT_CHECK_INT(zt_flight_hooks_get()->current(), open_one);
    ZT_CHECK_INT(zt_flight_dump("watchdog: timed out in broadcast #6 on group 'dp'"), 0);

    char path[256], *text = NULL;
    snprintf(path, sizeof path, "%s/rank-0%s", dir, ZT_FLIGHT_SUFFIX);
    FILE *f = fopen(path, "r");
    ZT_CHECK(f != NULL);
    size_t cap = 0;
    int lines = 0;
    while (f && getline(&text, &cap, f) > 0) {
        if (lines == 0) {
            ZT_CHECK_CONTAINS(text, "\"recorded\":6");
            ZT_CHECK_CONTAINS(text, "\"issued\":6,\"completed\":5");
        }
        if (lines == 1) ZT_CHECK_CONTAINS(text, "{\"seq\":3,\"id\":3,\"op\":\"all_reduce\",\"group\":\"dp\"");
        if (lines == 4) {
            ZT_CHECK_CONTAINS(text, "\"op\":\"broadcast\"");
            ZT_CHECK_CONTAINS(text, "\"root\":1,\"state\":\"issued\"");
            ZT_CHECK_CONTAINS(text, "\"completed_s\":null");
        }
        lines++;
    }
    if (f) fclose(f);
    free(text);
    ZT_CHECK_INT(lines, 5); /* the header and the last 4 */

    /* Rank 1 completed #5 and has not issued #6. */
    snprintf(path, sizeof path, "%s/rank-1%s", dir, ZT_FLIGHT_SUFFIX);
    write_text(path, "{\"flight_recorder\":1,\"rank\":1,\"world_size\":2,\"pid\":4242,\"reason\":\"SIGTERM\","
                     "\"dumped_s\":1.0,\"unix_s\":2.0,\"entries\":4,\"recorded\":5,\"groups\":[{\"name\":\"dp\","
                     "\"rank\":1,\"size\":2,\"ranks\":[0,1],\"issued\":5,\"completed\":5}]}\n"
                     "{\"seq\":5,\"id\":5,\"op\":\"all_reduce\",\"group\":\"dp\",\"count\":16,\"bytes\":64,"
                     "\"dtype\":\"F32\",\"state\":\"completed\",\"issued_s\":0.5,\"completed_s\":0.6}\n");
    zt_status st;
    char *said = analysis(dir, NULL, &st, &err);
    ZT_CHECK_INT(st, ZT_OK);
    ZT_CHECK_CONTAINS(said, "> rank 0: watchdog: timed out in broadcast #6 on group 'dp'\n");
    ZT_CHECK_CONTAINS(said, "> rank 1 (pid 4242) is behind in group 'dp': its last collective there is all_reduce #5 "
                            "on group 'dp' (64 bytes of F32) (completed); rank 0 waits in broadcast #6 on group 'dp' "
                            "(64 bytes of F32, root 1), which it has not issued\n");
    free(said);

    /* Without rank 1's dump: by elimination, with what a launcher saw. */
    unlink(path);
    zt_flight_rank_state states[2] = {{0}, {.pid = 4243, .killed = 1, .signal = 9}};
    said = analysis(dir, states, &st, &err);
    ZT_CHECK_INT(st, ZT_OK);
    ZT_CHECK_CONTAINS(said, "> rank 1 (pid 4243, killed by signal 9) left no dump; rank 0 waits in broadcast #6 on "
                            "group 'dp' (64 bytes of F32, root 1), which it has not completed\n");
    free(said);

    /* A damaged dump: its file and line. */
    write_text(path, "{\"flight_recorder\":1,\"rank\":1,\"world_size\":2,\"groups\":[]}\n{\"seq\":1}\n");
    said = analysis(dir, NULL, &st, &err);
    ZT_CHECK_INT(st, ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "rank-1.flight.jsonl:2: an entry lacks seq, op, group");
    free(said);

    unlink(path);
    snprintf(path, sizeof path, "%s/rank-0%s", dir, ZT_FLIGHT_SUFFIX);
    unlink(path);
    said = analysis(dir, NULL, &st, &err);
    ZT_CHECK_INT(st, ZT_ERR_NOT_FOUND);
    free(said);
    rmdir(dir);
    return zt_test_failures ? 1 : 0;
}
