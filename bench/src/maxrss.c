/* maxrss FILE CMD [ARG...]: runs CMD as a child, waits for it with wait4
 * and writes the child's peak RSS in KiB (ru_maxrss: the largest of CMD and
 * the descendants it waited for) to FILE. Exits with CMD's status, 128+N if
 * a signal N ended it. SIGINT, SIGTERM, SIGQUIT and SIGHUP are passed on to
 * CMD. Under a recorder it adds one idle process, which allocates only to
 * write FILE.
 *
 *   gcc -O2 -o maxrss bench/src/maxrss.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t child;

static void pass_on(int sig) {
    if (child > 0) kill(child, sig);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: maxrss FILE CMD [ARG...]\n");
        return 125;
    }
    int sigs[] = {SIGINT, SIGTERM, SIGQUIT, SIGHUP};
    struct sigaction sa = {0};
    sa.sa_handler = pass_on;
    sa.sa_flags = SA_RESTART;
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("maxrss: fork");
        return 125;
    }
    if (pid == 0) {
        sa.sa_handler = SIG_DFL;
        for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
        execvp(argv[2], argv + 2);
        perror("maxrss: exec");
        _exit(127);
    }
    child = pid;
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("maxrss: wait4");
            return 125;
        }
    }
    FILE *f = fopen(argv[1], "w");
    if (f) {
        fprintf(f, "%ld\n", ru.ru_maxrss);
        fclose(f);
    }
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
