/*
 * crc32c.h — CRC-32C (Castagnoli), the checksum of TensorFlow's record files (TFRecord, the
 * TensorBoard event files of tb.c). Internal to the library (ddp__ names).
 */
#ifndef DDP_CRC32C_H
#define DDP_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC-32C over n bytes of p: pass 0 to start, the previous result to go on, so
 * crc(ab) == ddp__crc32c(ddp__crc32c(0, a), b). Reflected polynomial 0x82F63B78, initial value
 * and final xor 0xFFFFFFFF (the iSCSI / SSE4.2 convention): ddp__crc32c(0, "123456789", 9) is
 * 0xE3069283. */
uint32_t ddp__crc32c(uint32_t crc, const void *p, size_t n);

/* TFRecord's masked form of a CRC, ((crc >> 15) | (crc << 17)) + 0xa282ead8: a record that holds
 * its own CRC (a record of records) then does not check itself by accident. */
uint32_t ddp__crc32c_mask(uint32_t crc);

#endif /* DDP_CRC32C_H */
