/* cli_util.h — strict parsing of command-line numbers for the nstf tools.
 * Each parser prints one clear line on failure and returns false. */
#ifndef NSTF_TOOLS_CLI_UTIL_H
#define NSTF_TOOLS_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>

bool cli_parse_int(const char *flag, const char *s, long min, long max, int *out);
bool cli_parse_u64(const char *flag, const char *s, uint64_t *out);
bool cli_parse_float(const char *flag, const char *s, double min, double max, float *out);
bool cli_parse_double(const char *flag, const char *s, double min, double max, double *out);
/* The value after a flag, or an error if it is missing. */
const char *cli_value(int argc, char **argv, int *i);
/* A text file read whole (free it); NULL with a message on stderr naming what. */
char *cli_read_file(const char *path, const char *what);

#endif
