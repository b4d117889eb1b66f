/* A CPU-bound program with no allocation for the profiler's overhead
 * benchmark: a recursive Fibonacci (deep, call-heavy stacks), a matrix
 * product (a hot loop) and a sieve, repeated ROUNDS times.
 * Usage: cpu_bound [ROUNDS] (default 60). Prints one checksum line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The main thread's own CPU time on stderr (what sampling adds to it is the
 * overhead that matters; wall time on a shared machine is noisier). */
static void report_thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    fprintf(stderr, "thread_cpu_s %.4f\n", t.tv_sec + t.tv_nsec * 1e-9);
}

#define N 192
static double a[N][N], b[N][N], c[N][N];
static unsigned char composite[1 << 22];

__attribute__((noinline)) static unsigned long fib(int n)
{
    return n < 2 ? (unsigned long)n : fib(n - 1) + fib(n - 2);
}

__attribute__((noinline)) static double matmul(void)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < N; k++)
                s += a[i][k] * b[k][j];
            c[i][j] = s;
        }
    return c[N / 2][N / 3];
}

__attribute__((noinline)) static unsigned long sieve(void)
{
    unsigned long primes = 0;
    for (unsigned long i = 0; i < sizeof composite; i++)
        composite[i] = 0;
    for (unsigned long i = 2; i < sizeof composite; i++) {
        if (composite[i])
            continue;
        primes++;
        for (unsigned long j = i * i; j < sizeof composite; j += i)
            composite[j] = 1;
    }
    return primes;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 60;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            a[i][j] = (i * j) % 7 + 1;
            b[i][j] = (i + j) % 5 + 1;
        }
    double sum = 0;
    for (int r = 0; r < rounds; r++) {
        sum += fib(30);
        for (int m = 0; m < 8; m++)
            sum += matmul();
        sum += sieve();
    }
    printf("checksum %.0f\n", sum);
    report_thread_cpu();
    return 0;
}
