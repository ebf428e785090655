/* mapfile.h — map a whole regular file read-only (the GGUF and safetensors
 * readers), with the messages every reader gives for a missing file, a
 * folder, a device, an empty or an unmappable file. */
#ifndef NSTF_IO_MAPFILE_H
#define NSTF_IO_MAPFILE_H

#include <stdint.h>

#include "core/status.h"

/* On success *base and *size describe the mapping (size > 0). An empty file is
 * NSTF_ERR_FORMAT "PATH: empty file (0 bytes); not a KIND file". */
nstf_status nstf_map_file(const char *path, const char *kind, const uint8_t **base, uint64_t *size);
void nstf_unmap_file(const uint8_t *base, uint64_t size);

#endif
