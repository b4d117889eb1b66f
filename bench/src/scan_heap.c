/* The reachability-scan benchmark's heap: N blocks (default 10 million) of
 * 16 to 199 bytes (1 GiB in all for 10 million), linked in two lists: one
 * from a global (reachable), one lost (every 100th block). Then main returns
 * and the agent scans at exit.
 *   scan_heap [N] */
#include <stdio.h>
#include <stdlib.h>

struct block {
    struct block *next;
};

struct block *g_reachable;

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    struct block *lost = NULL;
    size_t bytes = 0;
    for (long i = 0; i < n; i++) {
        size_t size = 16 + (size_t)(i * 37 % 184);
        struct block *b = malloc(size);
        if (!b)
            return 1;
        bytes += size;
        if (i % 100 == 0) {
            b->next = lost;
            lost = b;
        } else {
            b->next = g_reachable;
            g_reachable = b;
        }
    }
    lost = NULL;
    fprintf(stderr, "scan_heap: %ld blocks, %zu bytes\n", n, bytes);
    return 0;
}
