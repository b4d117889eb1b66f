/* Stress run, not a benchmark: six threads start threads that start
 * threads (64 KiB stacks, detached) without end, retrying after 100 us when
 * pthread_create fails; main returns after 2 s. The process reaches the
 * kernel's limit of mappings (vm.max_map_count) within a second, with
 * about 13,000 threads. Natively it exits 0 in 2.4 to 4.3 s.
 *
 *   gcc -O2 -pthread bench/src/thread_bomb.c -o /tmp/thread_bomb
 *   for i in $(seq 10); do target/release/trapline run -o /dev/shm/bomb.trace -- /tmp/thread_bomb; echo $?; done
 *
 * Under the agent of 474663d (2026-11-26) it aborted (exit 134) in
 * 4 runs of 4, the agent's allocation failing once its reserve was spent,
 * and runs that did not abort took minutes to exit. bench/README.md
 * ("Thread bomb") has the runs. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *spawn(void *arg)
{
    for (;;) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 64 << 10);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        if (pthread_create(&t, &attr, spawn, NULL) != 0) {
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL);
        }
        pthread_attr_destroy(&attr);
    }
    return arg;
}

int main(void)
{
    pthread_t t;
    for (int i = 0; i < 6; i++)
        pthread_create(&t, NULL, spawn, NULL);
    struct timespec run = {2, 0};
    nanosleep(&run, NULL);
    return 0;
}
