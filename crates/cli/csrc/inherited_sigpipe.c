/* How trapline found SIGPIPE when it started, for the command it runs.
 *
 * Rust's runtime sets SIGPIPE to SIG_IGN before main, without keeping what
 * it was, and std's Command resets it to SIG_DFL in every child. A command
 * started from a process that ignores SIGPIPE (systemd's services by
 * default, nohup'd shells, servers that spawn workers) inherits it ignored
 * natively, and under trapline it would die of the first write to a closed
 * socket. This constructor runs before Rust's runtime (constructors run
 * before main) and writes down what was inherited, in the environment,
 * where trapline reads it with std::env: "ignored" or "default". trapline
 * removes the variable from the command's environment and, when it says
 * "ignored", asks the agent to ignore SIGPIPE again before the program
 * starts (TRAPLINE_IGNORE_SIGPIPE). Always written, so that a value
 * inherited from another trapline's environment never counts. */
#include <signal.h>
#include <stdlib.h>

__attribute__((constructor)) static void trapline_note_inherited_sigpipe(void)
{
    struct sigaction old;
    int ignored = sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_IGN;
    setenv("TRAPLINE_INHERITED_SIGPIPE", ignored ? "ignored" : "default", 1);
}
