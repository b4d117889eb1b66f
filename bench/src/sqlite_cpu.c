/* A CPU-bound real workload for the profiler benchmarks: SQLite (the
 * amalgamation, compiled in) builds a table of N rows in memory, indexes it,
 * and runs scans, a LIKE filter, grouping and sorting over it.
 * Usage: sqlite_cpu [N] (default 1500000). Prints one checksum line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "sqlite3.h"

/* The main thread's own CPU time on stderr (what sampling adds to it is the
 * overhead that matters; wall time on a shared machine is noisier). */
static void report_thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    fprintf(stderr, "thread_cpu_s %.4f\n", t.tv_sec + t.tv_nsec * 1e-9);
}

static sqlite3 *db;

static void exec(const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "sqlite: %s\n", err);
        exit(1);
    }
}

static double scalar(const char *sql)
{
    sqlite3_stmt *st;
    double v = 0;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "sqlite: %s\n", sqlite3_errmsg(db));
        exit(1);
    }
    while (sqlite3_step(st) == SQLITE_ROW)
        v += sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    return v;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1500000;
    char sql[512];
    sqlite3_open(":memory:", &db);
    exec("CREATE TABLE t(a INTEGER, b TEXT, c REAL)");
    snprintf(sql, sizeof sql,
             "WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < %d) "
             "INSERT INTO t SELECT x, printf('%%08x%%08x', (x * 2654435761) %% 4294967296, x * 40503), x * 1.5 FROM s",
             n);
    exec(sql);
    exec("CREATE INDEX tb ON t(b)");
    double sum = scalar("SELECT count(*) FROM t WHERE b LIKE '%ab%'");
    sum += scalar("SELECT sum(c) FROM t WHERE a % 7 = 3");
    sum += scalar("SELECT avg(c) FROM (SELECT a % 1000 AS g, sum(c) AS c FROM t GROUP BY g ORDER BY c DESC)");
    sum += scalar("SELECT count(*) FROM t AS x JOIN t AS y ON y.b = x.b WHERE x.a % 3 = 0");
    sum += scalar("SELECT length(group_concat(b)) FROM (SELECT b FROM t ORDER BY b DESC LIMIT 100000)");
    printf("checksum %.1f\n", sum);
    sqlite3_close(db);
    report_thread_cpu();
    return 0;
}
