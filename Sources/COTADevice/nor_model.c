#include "otaflash_nor_model.h"

#include <string.h>

void otafd_nor_init(otafd_nor *m, uint8_t *mem, uint8_t *writable, uint32_t size, uint32_t page,
                    uint32_t erase_us, uint32_t word_us) {
    memset(m, 0, sizeof *m);
    m->mem = mem;
    m->writable = writable;
    m->size = size;
    m->page = page;
    m->erase_us = erase_us;
    m->word_us = word_us;
    m->fail_after = -1;
    memset(mem, 0xA5, size);
    memset(writable, 0, size);
}

static int injected_failure(otafd_nor *m) {
    if (m->fail_after < 0) return 0;
    if (m->fail_after == 0) {
        m->fail_after = -1;
        return 1;
    }
    m->fail_after--;
    return 0;
}

static int inside(const otafd_nor *m, uint32_t offset, uint32_t len) {
    return offset <= m->size && len <= m->size - offset;
}

static int nor_read(void *ctx, uint32_t offset, uint8_t *buf, uint32_t len) {
    otafd_nor *m = ctx;
    if (!inside(m, offset, len)) {
        m->violations++;
        return -1;
    }
    memcpy(buf, m->mem + offset, len);
    return 0;
}

static int nor_program(void *ctx, uint32_t offset, const uint8_t *buf, uint32_t len) {
    otafd_nor *m = ctx;
    if (!inside(m, offset, len) || len == 0) {
        m->violations++;
        return -1;
    }
    for (uint32_t i = 0; i < len; i++) {
        if (!m->writable[offset + i]) {
            m->violations++;
            return -1;
        }
    }
    if (injected_failure(m)) return -1;
    for (uint32_t i = 0; i < len; i++) {
        m->mem[offset + i] &= buf[i];
        m->writable[offset + i] = 0;
    }
    uint32_t words = (offset + len + 3u) / 4u - offset / 4u;
    m->busy_us += (uint64_t)words * m->word_us;
    m->programs++;
    return 0;
}

static int nor_erase(void *ctx, uint32_t offset) {
    otafd_nor *m = ctx;
    if (offset % m->page != 0 || !inside(m, offset, m->page)) {
        m->violations++;
        return -1;
    }
    if (injected_failure(m)) return -1;
    memset(m->mem + offset, 0xFF, m->page);
    memset(m->writable + offset, 1, m->page);
    m->busy_us += m->erase_us;
    m->erases++;
    return 0;
}

otafd_flash otafd_nor_flash(otafd_nor *m) {
    otafd_flash f;
    memset(&f, 0, sizeof f);
    f.ctx = m;
    f.read = nor_read;
    f.program = nor_program;
    f.erase = nor_erase;
    f.slot_size = m->size;
    f.erase_unit = m->page;
    f.erase_ms = (uint16_t)((m->erase_us + 999u) / 1000u);
    return f;
}

static int ram_load(void *ctx, otafd_record *r) {
    otafd_ram_store *s = ctx;
    if (!s->valid) return -1;
    *r = s->record;
    return 0;
}

static int ram_save(void *ctx, const otafd_record *r) {
    otafd_ram_store *s = ctx;
    s->record = *r;
    s->valid = 1;
    s->saves++;
    return 0;
}

otafd_store otafd_ram_store_interface(otafd_ram_store *s) {
    otafd_store st;
    st.ctx = s;
    st.load = ram_load;
    st.save = ram_save;
    return st;
}
