/* Lock micro-benchmarks for bench/locks.sh.
 *
 *   locks pair N         N uncontended pthread_mutex_lock+unlock pairs on one
 *                        thread; prints "ns_per_pair X"
 *   locks contended T N [IN OUT]
 *                        T threads each take one shared mutex N times around
 *                        a critical section of IN steps of work (default 20)
 *                        with OUT steps outside it (default 200); prints
 *                        "ops_per_sec X"
 *
 * Times are taken inside the program (CLOCK_MONOTONIC around the loop), so
 * tool start-up and trace finalisation are not counted. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile unsigned long shared_counter;
static long rounds;
static int work_in = 20, work_out = 200;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Work outside the lock, so that threads sometimes meet at it. */
static unsigned long spin_work(unsigned long x, int n) {
    for (int i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

static void *contender(void *arg) {
    unsigned long x = (unsigned long)arg;
    for (long i = 0; i < rounds; i++) {
        pthread_mutex_lock(&lock);
        shared_counter = spin_work(shared_counter, work_in);
        pthread_mutex_unlock(&lock);
        x = spin_work(x, work_out);
    }
    return (void *)x;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "pair")) {
        long n = atol(argv[2]);
        double t0 = now();
        for (long i = 0; i < n; i++) {
            pthread_mutex_lock(&lock);
            pthread_mutex_unlock(&lock);
        }
        double t1 = now();
        printf("ns_per_pair %.2f\n", (t1 - t0) * 1e9 / n);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "contended")) {
        int threads = atoi(argv[2]);
        rounds = atol(argv[3]);
        if (argc >= 6) {
            work_in = atoi(argv[4]);
            work_out = atoi(argv[5]);
        }
        pthread_t t[64];
        if (threads < 1 || threads > 64) return 2;
        double t0 = now();
        for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, contender, (void *)(long)(i + 1));
        for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
        double t1 = now();
        printf("ops_per_sec %.0f\n", threads * rounds / (t1 - t0));
        return 0;
    }
    fprintf(stderr, "usage: %s pair N | contended THREADS N [IN OUT]\n", argv[0]);
    return 2;
}
