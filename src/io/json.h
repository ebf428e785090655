/* json.h — strict parsing of JSON text from files we do not trust
 * (safetensors headers, model.safetensors.index.json, config.json,
 * tokenizer.json, tokenizer_config.json), over cJSON.
 *
 * On top of cJSON: the text must be valid UTF-8, hold no NUL character
 * (raw or escaped as \u0000, which would cut a C string short), and be one
 * JSON value followed only by blanks; a syntax error names the line and
 * column. cJSON bounds nesting (CJSON_NESTING_LIMIT), so hostile depth
 * cannot exhaust the stack. */
#ifndef NSTF_IO_JSON_H
#define NSTF_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

/* Parse `n` bytes (not NUL-terminated). `what` names the text in messages
 * ("x.safetensors: header"). Free *out with cJSON_Delete. */
nstf_status nstf_json_parse(const char *text, size_t n, const char *what, cJSON **out);
/* Read a whole file of at most max_bytes and parse it. */
nstf_status nstf_json_read_file(const char *path, uint64_t max_bytes, cJSON **out);

/* A JSON number that is an integer in [0, 2^53) (every such integer is
 * exact in the double cJSON keeps; larger ones are refused). */
bool nstf_json_uint(const cJSON *v, uint64_t *out);
/* The string member `key` of object `o`, or NULL (absent or not a string). */
const char *nstf_json_str(const cJSON *o, const char *key);

#endif
