/*
 * Keeps a secret out of /proc/<pid>/cmdline, which every local user can read.
 *
 * Why hand-written: tritonserver takes its restricted-API key only on its command line
 * (getopt_long over main's argv; no file or environment form in Triton 2.51), and PyTriton's
 * own model loading needs that key. No library does this for another program's argv.
 *
 * Loaded with LD_PRELOAD, the constructor below runs before main. glibc passes constructors
 * main's argc, argv and envp. Every argv string that holds the placeholder named by
 * GPUFLEET_ARGV_PLACEHOLDER is replaced, in the argv array main will receive, by a heap copy
 * with the placeholder swapped for GPUFLEET_ARGV_SECRET. The original bytes, which /proc shows,
 * keep the placeholder. The secret's bytes in the initial environment (/proc/<pid>/environ,
 * readable by the same user only) are then zeroed, the variables removed, and LD_PRELOAD set back
 * to GPUFLEET_ARGV_LD_PRELOAD (what it was before this shim was put first), so the processes
 * tritonserver starts (Python backend stubs) inherit none of them.
 */
#include <stdlib.h>
#include <string.h>

static const char SECRET[] = "GPUFLEET_ARGV_SECRET";
static const char PLACEHOLDER[] = "GPUFLEET_ARGV_PLACEHOLDER";
static const char PRELOAD_BEFORE[] = "GPUFLEET_ARGV_LD_PRELOAD";

static char *substituted(const char *arg, const char *at, const char *mark, const char *secret)
{
    size_t head = (size_t)(at - arg), mark_len = strlen(mark), secret_len = strlen(secret);
    size_t tail = strlen(at + mark_len);
    char *copy = malloc(head + secret_len + tail + 1);
    if (copy == NULL)
        abort(); /* never start with the placeholder as the key */
    memcpy(copy, arg, head);
    memcpy(copy + head, secret, secret_len);
    memcpy(copy + head + secret_len, at + mark_len, tail + 1);
    return copy;
}

static void scrub(char **envp, const char *name)
{
    size_t len = strlen(name);
    for (char **entry = envp; entry != NULL && *entry != NULL; entry++)
        if (strncmp(*entry, name, len) == 0 && (*entry)[len] == '=')
            memset(*entry + len + 1, 0, strlen(*entry + len + 1));
}

__attribute__((constructor)) static void gpufleet_argv_shim(int argc, char **argv, char **envp)
{
    const char *mark = getenv(PLACEHOLDER);
    const char *secret = getenv(SECRET);
    if (mark != NULL && secret != NULL && mark[0] != '\0') {
        for (int i = 1; i < argc; i++) {
            char *at = strstr(argv[i], mark);
            if (at != NULL)
                argv[i] = substituted(argv[i], at, mark, secret);
        }
    }
    scrub(envp, SECRET); /* after the copies: secret points into these bytes */
    unsetenv(SECRET);
    unsetenv(PLACEHOLDER);
    const char *before = getenv(PRELOAD_BEFORE);
    if (before != NULL && before[0] != '\0')
        setenv("LD_PRELOAD", before, 1);
    else
        unsetenv("LD_PRELOAD");
    unsetenv(PRELOAD_BEFORE);
}
