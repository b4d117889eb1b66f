/* A service that leaks 1 MiB per second from one stack, among steady
 * allocation traffic that does not leak, for bench/sampled_leak.sh.
 *
 * Every request (1,024 per second, paced against the monotonic clock):
 * - parses into 24 temporary blocks of 16 to 4,000 bytes, freed at once;
 * - keeps a session of 1 KiB through xmalloc, from remember_session, that
 *   nothing frees or points to: the leak, 1 MiB/s;
 * - refreshes a cache entry of 1 KiB, also through xmalloc (from
 *   cache_entry), freeing the entry it replaces: bounded.
 * So the leak's caller, xmalloc, is shared with a site that does not grow:
 * only the full stack names the leak. Runs until killed.
 *
 * -DSPEED=N (default 1) runs N times faster: N * 1,024 requests per second,
 * the same requests in the same order, so one second of the program is N
 * seconds of the service's (at SPEED=10, 6 s are the service's 60 s, and a
 * watcher that looks every 0.1 s looks once per second of the service's). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef SPEED
#define SPEED 1
#endif
#define RATE (1024L * SPEED)
#define CACHE 4096

static void *cache[CACHE];

__attribute__((noinline)) static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    memset(p, 0x3c, n);
    return p;
}

__attribute__((noinline)) static void remember_session(unsigned long id)
{
    unsigned long *s = xmalloc(1024);
    s[0] = id ^ 0x5bd1e995UL; /* no pointer to it is kept: leaked */
}

__attribute__((noinline)) static void cache_entry(unsigned long id)
{
    void **slot = &cache[id % CACHE];
    free(*slot);
    *slot = xmalloc(1024);
}

__attribute__((noinline)) static void parse(unsigned long id)
{
    void *tmp[24];
    for (int i = 0; i < 24; i++)
        tmp[i] = malloc(16 + (id * 7 + i * 331) % 3985);
    for (int i = 0; i < 24; i++)
        free(tmp[i]);
}

__attribute__((noinline)) static void handle_request(unsigned long id)
{
    parse(id);
    remember_session(id);
    cache_entry(id);
}

int main(void)
{
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (unsigned long id = 0;; id++) {
        handle_request(id);
        if (id % 64 == 63) {
            /* 64 requests per 1/16 s of the service's time */
            next.tv_nsec += 64 * 1000000000L / RATE;
            if (next.tv_nsec >= 1000000000L) {
                next.tv_nsec -= 1000000000L;
                next.tv_sec++;
            }
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        }
    }
}
