/* Process and thread churn: what a tool adds to starting and ending them.
 *
 *   spawn procs N [PROGRAM]   fork and exec PROGRAM (default /bin/true) N
 *                             times, one at a time, waiting for each
 *   spawn threads N           start and join N threads one at a time; each
 *                             allocates and frees one block
 *
 * Prints loop_s=<seconds the loop took>, timed inside the program. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    void *volatile p = malloc(64 + (size_t)arg % 64);
    free(p);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spawn procs|threads N [PROGRAM]\n");
        return 2;
    }
    long n = atol(argv[2]);
    const char *program = argc > 3 ? argv[3] : "/bin/true";
    double t0 = now();
    for (long i = 0; i < n; i++) {
        if (strcmp(argv[1], "procs") == 0) {
            pid_t pid = fork();
            if (pid == 0) {
                execl(program, program, (char *)NULL);
                _exit(127);
            }
            int status;
            if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
                return 1;
        } else {
            pthread_t t;
            if (pthread_create(&t, NULL, worker, (void *)i) != 0)
                return 1;
            pthread_join(t, NULL);
        }
    }
    printf("loop_s=%.6f\n", now() - t0);
    return 0;
}
