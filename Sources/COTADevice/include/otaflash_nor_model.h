/*
 * otaflash_nor_model.h: a NOR flash and a record store in RAM, for host tests, the fuzzer and the
 * simulator. Not part of a device build.
 *
 * The flash enforces what real NOR does: a byte can be programmed only once after its page was
 * erased (a second program, or a program of a never-erased byte, is a violation and fails), erase
 * works on whole aligned pages, and every access must lie inside the slot. It reports its timing:
 * each erase adds `erase_us` and each 4-byte word programmed adds `word_us` to `busy_us`.
 */
#ifndef OTAFLASH_NOR_MODEL_H
#define OTAFLASH_NOR_MODEL_H

#include "otaflash_device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct otafd_nor {
    uint8_t *mem;        /* size bytes */
    uint8_t *writable;   /* size bytes: 1 where erased and not programmed since */
    uint32_t size, page;
    uint32_t erase_us, word_us;
    uint64_t busy_us;
    uint32_t erases, programs;
    /** Accesses the model refused: outside the slot, unaligned erase, program of a byte not erased. */
    uint32_t violations;
    /** Fails the next program or erase once this many more have succeeded (-1: never). */
    int32_t fail_after;
} otafd_nor;

/** Sets up a model over caller-provided buffers. The flash starts as never erased (programmed
 *  with stale data), so a device must erase before it writes. */
void otafd_nor_init(otafd_nor *m, uint8_t *mem, uint8_t *writable, uint32_t size, uint32_t page,
                    uint32_t erase_us, uint32_t word_us);

/** The `otafd_flash` interface over the model (erase_ms rounded up from erase_us). */
otafd_flash otafd_nor_flash(otafd_nor *m);

/** A record store in RAM: `valid` is 0 until the first save. */
typedef struct otafd_ram_store {
    otafd_record record;
    int valid;
    uint32_t saves;
} otafd_ram_store;

otafd_store otafd_ram_store_interface(otafd_ram_store *s);

#ifdef __cplusplus
}
#endif
#endif
