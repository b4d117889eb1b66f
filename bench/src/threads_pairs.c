/* malloc+free pairs in T threads at once: each thread keeps 64 blocks live
 * and replaces one per pair (sizes 16 to 271 bytes), so blocks are freed
 * by the thread that allocated them, from its own arena.
 * Usage: threads_pairs TOTAL_PAIRS THREADS; prints the wall time of the
 * threads' work. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long pairs_per_thread;

static void *work(void *arg)
{
    void *live[64] = {0};
    for (long i = 0; i < pairs_per_thread; i++) {
        int k = i & 63;
        free(live[k]);
        live[k] = malloc(16 + (i & 255));
    }
    for (int k = 0; k < 64; k++)
        free(live[k]);
    return arg;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    long total = atol(argv[1]);
    int threads = atoi(argv[2]);
    if (threads < 1 || threads > 256)
        return 2;
    pairs_per_thread = total / threads;
    pthread_t t[256];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, work, NULL) != 0)
            return 1;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("threads=%d pairs=%ld loop_s=%.6f\n", threads, pairs_per_thread * threads, s);
    return 0;
}
