/* Microbenchmark: N malloc+free pairs issued from call depth 20.
 *
 * Usage: depth N
 * Prints "pairs=N ns_per_pair=X elapsed_s=Y" on stdout.
 *
 * Built -O2 -fomit-frame-pointer (like Debian binaries), so an unwinder
 * has to use CFI rather than a frame-pointer chain. The recursion functions
 * are noinline and do work after the recursive call, so the compiler
 * cannot turn them into a loop or a tail call: the 20 frames are real.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define DEPTH 20

static volatile unsigned long sink;

__attribute__((noinline)) static unsigned long hot_loop(long n)
{
    unsigned long acc = 0;
    for (long i = 0; i < n; i++) {
        /* sizes 16..256 in steps of 16, varying each iteration */
        size_t size = 16 + (size_t)((i * 7) & 15) * 16;
        unsigned char *p = malloc(size);
        if (!p) {
            perror("malloc");
            exit(1);
        }
        p[size - 1] = (unsigned char)i; /* touch it so the pair stays */
        acc += p[size - 1];
        free(p);
    }
    return acc;
}

__attribute__((noinline)) static unsigned long recurse(int depth, long n)
{
    unsigned long r;
    if (depth <= 1)
        r = hot_loop(n);
    else
        r = recurse(depth - 1, n);
    /* work after the call: no tail call, no loop conversion */
    sink = sink + (unsigned long)depth;
    return r + (unsigned long)depth;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 5000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* main -> recurse x(DEPTH-1) -> hot_loop: DEPTH frames under main */
    unsigned long r = recurse(DEPTH - 1, n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    sink = r;
    printf("pairs=%ld ns_per_pair=%.2f elapsed_s=%.6f\n", n, s * 1e9 / (double)n, s);
    return 0;
}
