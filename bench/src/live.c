/* Memory benchmark: allocate K small blocks, keep them all live, then
 * report this process's resident set size.
 *
 * Usage: live K
 * Prints "blocks=K rss_kib=X rss_before_kib=Y" on stdout, where rss_before
 * is read at start (before any allocation) and rss after all K blocks are
 * allocated and touched. The blocks are freed only at exit (never: the
 * process just exits), so under a tracer they are all live when RSS is read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = atol(line + 6);
            break;
        }
    }
    fclose(f);
    return kib;
}

int main(int argc, char **argv)
{
    long k = argc > 1 ? atol(argv[1]) : 1000000;
    long before = rss_kib();
    void **blocks = malloc((size_t)k * sizeof *blocks);
    if (!blocks) {
        perror("malloc");
        return 1;
    }
    for (long i = 0; i < k; i++) {
        size_t size = 8 + (size_t)(i & 3) * 8; /* 8..32 bytes */
        unsigned char *p = malloc(size);
        if (!p) {
            perror("malloc");
            return 1;
        }
        p[0] = (unsigned char)i;
        blocks[i] = p;
    }
    long after = rss_kib();
    printf("blocks=%ld rss_kib=%ld rss_before_kib=%ld\n", k, after, before);
    fflush(stdout);
    /* deliberately no free: all K blocks are live until exit */
    return 0;
}
