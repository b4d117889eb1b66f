/* A small "service" with the bugs trapline is built to find.
 *
 * Four worker threads handle requests. Each request gets a buffer; requests
 * that fail to parse return early and forget to free it (a leak that grows
 * with traffic). The configuration loader keeps a strdup'd copy it never
 * releases. The shutdown code frees the session table twice. Everything else
 * is freed properly, so the report shows exactly these three problems.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKERS 4
#define REQUESTS_PER_WORKER 250

struct request {
    int id;
    char *body;
};

static char *config_name;

static void load_config(const char *name)
{
    config_name = strdup(name); /* never freed: one block at exit */
}

static int parse(const struct request *req)
{
    return req->id % 10 != 7; /* every tenth request is malformed */
}

static void handle(int id)
{
    struct request *req = malloc(sizeof *req);
    req->id = id;
    req->body = malloc(256);
    snprintf(req->body, 256, "request %d", id);
    if (!parse(req)) {
        free(req);
        return; /* BUG: req->body leaks on the error path */
    }
    free(req->body);
    free(req);
}

static void *worker(void *arg)
{
    int first = (int)(long)arg * REQUESTS_PER_WORKER;
    for (int i = 0; i < REQUESTS_PER_WORKER; i++)
        handle(first + i);
    return NULL;
}

static void shutdown_sessions(char **table)
{
    free(table);
}

int main(void)
{
    load_config("leaky-service.conf");
    char **sessions = calloc(64, sizeof *sessions);

    pthread_t threads[WORKERS];
    for (long t = 0; t < WORKERS; t++)
        pthread_create(&threads[t], NULL, worker, (void *)t);
    for (int t = 0; t < WORKERS; t++)
        pthread_join(threads[t], NULL);

    shutdown_sessions(sessions);
    free(sessions); /* BUG: freed twice */
    printf("served %d requests\n", WORKERS * REQUESTS_PER_WORKER);
    return 0;
}
