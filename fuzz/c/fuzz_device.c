/*
 * libFuzzer harness for the C device library's input handlers (Sources/COTADevice).
 *
 * The input is a script of writes: each step is a header byte (bits 0-1: control point, data,
 * poll or reboot; bit 2: from a second central) and a length byte, then that many bytes. The
 * device runs over the NOR flash model, which refuses any access outside the slot, any program of
 * a byte not erased since it was last programmed and any unaligned erase; the harness aborts on
 * any such violation, on a notification longer than OTAFD_NOTIFY_MAX, and on a device whose
 * `received` position passes its image size, and on an ACTIVATE that succeeds while the slot's
 * bytes do not match BEGIN's CRC. Built and run by scripts/fuzz-c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "otaflash_device.h"
#include "otaflash_nor_model.h"

#define SLOT (16u * 1024u)
#define PAGE 1024u

static uint8_t mem[SLOT], writable[SLOT];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    otafd_nor nor;
    otafd_ram_store store;
    otafd_device dev;
    memset(&store, 0, sizeof store);
    otafd_nor_init(&nor, mem, writable, SLOT, PAGE, 0, 0);
    otafd_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.flash = otafd_nor_flash(&nor);
    cfg.store = otafd_ram_store_interface(&store);
    cfg.reorder_capacity = 4096;
    cfg.reorder_ranges = 4;
    cfg.hold_ms = 300;
    if (otafd_init(&dev, &cfg) != 0) abort();
    uint32_t now = 0;
    size_t i = 0;
    while (i + 2 <= size) {
        uint8_t kind = data[i], len = data[i + 1];
        i += 2;
        if (len > size - i) len = (uint8_t)(size - i);
        const uint8_t *in = data + i;
        i += len;
        uint32_t central = (kind & 4u) ? 2u : 1u;
        uint8_t out[OTAFD_NOTIFY_MAX + 8];
        memset(out, 0xEE, sizeof out);
        size_t n = 0;
        now += 7;
        switch (kind & 3u) {
        case 0: {
            uint32_t image_size = dev.rec.image_size, image_crc = dev.rec.image_crc;
            n = otafd_control(&dev, in, len, central, now, out);
            /* Nothing is activated unless the whole image in flash matches BEGIN's CRC. */
            if (n >= 3 && out[0] == 0x80 && out[1] == 0x05 && out[2] == OTAFD_SUCCESS &&
                otafd_crc32(0, mem, image_size) != image_crc)
                abort();
            break;
        }
        case 1: n = otafd_data(&dev, in, len, central, now, out); break;
        case 2: now += 400; n = otafd_poll(&dev, now, out); break;
        default:
            if (otafd_init(&dev, &cfg) != 0) abort();
            break;
        }
        if (n > OTAFD_NOTIFY_MAX || out[OTAFD_NOTIFY_MAX] != 0xEE) abort();
        if (nor.violations != 0) abort();
        if (dev.received > dev.rec.image_size || dev.rec.committed > dev.received) abort();
        uint8_t info[OTAFD_INFO_SIZE];
        if (otafd_info(&dev, info) != OTAFD_INFO_SIZE) abort();
    }
    return 0;
}
