/*
 * The device side of the otaflash OTA protocol, version 2. docs/PROTOCOL.md is the specification;
 * the section names in the comments below point into it.
 */
#include "otaflash_device.h"

#include <string.h>

#define RECORD_MAGIC 0x4f544132u /* "OTA2" */

enum { OP_BEGIN = 1, OP_CHECKPOINT = 2, OP_STATUS = 3, OP_VERIFY = 4, OP_ACTIVATE = 5, OP_ABORT = 6 };

/* Nibble table: 64 bytes of constants instead of 1 KiB, about 2x slower than a byte table. */
static const uint32_t crc_nibble[16] = {
    0x00000000u, 0x1db71064u, 0x3b6e20c8u, 0x26d930acu, 0x76dc4190u, 0x6b6b51f4u, 0x4db26158u, 0x5005713cu,
    0xedb88320u, 0xf00f9344u, 0xd6d6a3e8u, 0xcb61b38cu, 0x9b64c2b0u, 0x86d3d2d4u, 0xa00ae278u, 0xbdbdf21cu,
};

uint32_t otafd_crc32(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        crc = (crc >> 4) ^ crc_nibble[crc & 15u];
        crc = (crc >> 4) ^ crc_nibble[crc & 15u];
    }
    return ~crc;
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static size_t reply(uint8_t *out, uint8_t op, uint8_t status) {
    out[0] = 0x80;
    out[1] = op;
    out[2] = status;
    return 3;
}

static size_t reply_position(uint8_t *out, uint8_t op, uint8_t status, uint32_t offset, uint32_t crc) {
    reply(out, op, status);
    put32(out + 3, offset);
    put32(out + 7, crc);
    return 11;
}

static size_t gap_event(const otafd_device *d, uint8_t *out) {
    out[0] = 0x81;
    out[1] = 0x01;
    put32(out + 2, d->received);
    put32(out + 6, d->received_crc);
    return 10;
}

static uint32_t record_check(const otafd_record *r) {
    return otafd_crc32(0, (const uint8_t *)r, offsetof(otafd_record, check));
}

static int save(otafd_device *d) {
    d->rec.magic = RECORD_MAGIC;
    d->rec.check = record_check(&d->rec);
    return d->cfg.store.save(d->cfg.store.ctx, &d->rec);
}

/* CRC of flash [from, to), continued from `crc`, read back in small pieces. */
static int flash_crc(const otafd_device *d, uint32_t from, uint32_t to, uint32_t *crc) {
    uint8_t buf[64];
    while (from < to) {
        uint32_t n = to - from < sizeof buf ? to - from : (uint32_t)sizeof buf;
        if (d->cfg.flash.read(d->cfg.flash.ctx, from, buf, n) != 0) return -1;
        *crc = otafd_crc32(*crc, buf, n);
        from += n;
    }
    return 0;
}

static void forget_ahead(otafd_device *d) {
    d->n_ahead = 0;
    d->held = 0;
    d->gap_reported = 0;
}

/* Back to the committed offset; the units above it are erased before they are written again. */
static void roll_back(otafd_device *d) {
    d->received = d->rec.committed;
    d->received_crc = d->rec.committed_crc;
    d->erased = d->rec.committed;
    forget_ahead(d);
}

static void discard_transfer(otafd_device *d) {
    d->rec.image_size = 0;
    d->rec.image_crc = 0;
    d->rec.image_version = 0;
    d->rec.committed = 0;
    d->rec.committed_crc = 0;
    d->rec.state = OTAFD_IDLE;
    d->received = 0;
    d->received_crc = 0;
    d->erased = 0;
    d->owner = 0;
    forget_ahead(d);
}

int otafd_init(otafd_device *d, const otafd_config *cfg) {
    const otafd_flash *f = &cfg->flash;
    if (!f->read || !f->program || !f->erase || !cfg->store.load || !cfg->store.save) return -1;
    if (f->erase_unit == 0 || (f->erase_unit & (f->erase_unit - 1)) != 0) return -1;
    if (f->slot_size == 0 || f->slot_size % f->erase_unit != 0) return -1;
    if (cfg->reorder_ranges > OTAFD_MAX_RANGES) return -1;
    memset(d, 0, sizeof *d);
    d->cfg = *cfg;
    otafd_record r;
    int ok = cfg->store.load(cfg->store.ctx, &r) == 0 && r.magic == RECORD_MAGIC && r.check == record_check(&r);
    if (!ok) {
        d->rec.running_version = cfg->initial_version;
        return 0;
    }
    d->rec = r;
    /* "After a reboot with a transfer pending": receiving at the committed offset, no owner. */
    int sane = r.image_size <= f->slot_size && r.committed <= r.image_size &&
               (r.committed % f->erase_unit == 0 || r.committed == r.image_size) &&
               (r.state == OTAFD_RECEIVING || r.state == OTAFD_VERIFIED);
    if (r.image_size == 0 || !sane) {
        discard_transfer(d);
        return 0;
    }
    d->rec.state = OTAFD_RECEIVING;
    roll_back(d);
    return 0;
}

/* Erases every unit from `erased` up to the one that holds byte end - 1. */
static int erase_to(otafd_device *d, uint32_t end) {
    uint32_t unit = d->cfg.flash.erase_unit;
    if (unit == 1u) {  /* memory without erase */
        if (d->erased < end) d->erased = end;
        return 0;
    }
    while (d->erased < end) {
        uint32_t start = d->erased & ~(unit - 1u);
        if (d->cfg.flash.erase(d->cfg.flash.ctx, start) != 0) return -1;
        d->erased = start + unit;
        if (d->held) d->held_deadline += d->cfg.flash.erase_ms;  /* flash time does not count */
    }
    return 0;
}

/* Programs the parts of [start, end) that no held range covers; `payload` holds byte `base`. */
static int program_uncovered(otafd_device *d, uint32_t start, uint32_t end, uint32_t base, const uint8_t *payload) {
    uint32_t pos = start;
    for (uint8_t i = 0; i <= d->n_ahead && pos < end; i++) {
        uint32_t stop = i < d->n_ahead ? d->ahead[i].start : end;
        if (stop > end) stop = end;
        if (stop > pos && d->cfg.flash.program(d->cfg.flash.ctx, pos, payload + (pos - base), stop - pos) != 0) return -1;
        if (i < d->n_ahead && d->ahead[i].end > pos) pos = d->ahead[i].end;
    }
    return 0;
}

/* Moves `received` over held ranges that now touch it, extending the CRC from flash. */
static int absorb(otafd_device *d) {
    while (d->n_ahead > 0 && d->ahead[0].start <= d->received) {
        if (d->ahead[0].end > d->received) {
            if (flash_crc(d, d->received, d->ahead[0].end, &d->received_crc) != 0) return -1;
            d->received = d->ahead[0].end;
        }
        memmove(&d->ahead[0], &d->ahead[1], (size_t)(d->n_ahead - 1u) * sizeof d->ahead[0]);
        d->n_ahead--;
    }
    return 0;
}

/* The ranges after merging [start, end) in, into `into`; returns their count. */
static uint8_t merged(const otafd_device *d, uint32_t start, uint32_t end, otafd_range *into) {
    uint8_t n = 0, placed = 0;
    for (uint8_t i = 0; i < d->n_ahead; i++) {
        otafd_range r = d->ahead[i];
        if (r.end < start) { into[n++] = r; continue; }
        if (r.start > end) {
            if (!placed) { into[n].start = start; into[n].end = end; n++; placed = 1; }
            into[n++] = r;
            continue;
        }
        if (r.start < start) start = r.start;
        if (r.end > end) end = r.end;
    }
    if (!placed) { into[n].start = start; into[n].end = end; n++; }
    return n;
}

static size_t handle_checkpoint(otafd_device *d, uint32_t offset, uint32_t crc, uint32_t now_ms, uint8_t *out);

/* A held CHECKPOINT whose data arrived, or none. */
static size_t answer_held(otafd_device *d, uint32_t now_ms, uint8_t *out) {
    if (!d->held || d->held_offset > d->received) return 0;
    d->held = 0;
    return handle_checkpoint(d, d->held_offset, d->held_crc, now_ms, out);
}

/* A packet the device cannot hold: the held CHECKPOINT's `gap`, or one GAP event. */
static size_t dropped(otafd_device *d, uint8_t *out) {
    if (d->held) {
        d->held = 0;
        d->gap_reported = 0;
        return reply_position(out, OP_CHECKPOINT, OTAFD_GAP, d->received, d->received_crc);
    }
    if (d->gap_reported) return 0;
    d->gap_reported = 1;
    return gap_event(d, out);
}

size_t otafd_data(otafd_device *d, const uint8_t *in, size_t len, uint32_t central, uint32_t now_ms,
                  uint8_t out[OTAFD_NOTIFY_MAX]) {
    if (d->rec.state != OTAFD_RECEIVING || len < 5) return 0;
    if (d->owner != 0 && central != 0 && central != d->owner) return 0;
    uint32_t offset = get32(in);
    const uint8_t *payload = in + 4;
    size_t n = len - 4;
    if (n > d->rec.image_size || offset > d->rec.image_size - n) return 0;
    uint32_t end = offset + (uint32_t)n;
    if (end <= d->received) return 0;  /* a duplicate of what is held */
    uint32_t start = offset > d->received ? offset : d->received;
    if (start > d->received) {
        /* Beyond a hole ("Data characteristic"): keep it if capacity and ranges allow. */
        otafd_range next[OTAFD_MAX_RANGES + 1];
        if (end - d->received > d->cfg.reorder_capacity) return dropped(d, out);
        uint8_t count = merged(d, start, end, next);
        if (count > d->cfg.reorder_ranges) return dropped(d, out);
        if (erase_to(d, end) != 0 || program_uncovered(d, start, end, offset, payload) != 0) {
            roll_back(d);
            return 0;
        }
        memcpy(d->ahead, next, (size_t)count * sizeof next[0]);
        d->n_ahead = count;
        return 0;
    }
    if (erase_to(d, end) != 0 || program_uncovered(d, start, end, offset, payload) != 0) {
        roll_back(d);
        return 0;
    }
    /* The CRC runs over what flash holds: the payload where it was written, read back where a
       range held earlier covers it (absorb). */
    while (d->received < end) {
        if (absorb(d) != 0) {
            roll_back(d);
            return 0;
        }
        if (d->received >= end) break;
        uint32_t stop = d->n_ahead > 0 && d->ahead[0].start < end ? d->ahead[0].start : end;
        d->received_crc = otafd_crc32(d->received_crc, payload + (d->received - offset), stop - d->received);
        d->received = stop;
    }
    if (absorb(d) != 0) {
        roll_back(d);
        return 0;
    }
    d->gap_reported = 0;
    return answer_held(d, now_ms, out);
}

/* A BEGIN (15 bytes) that names the pending image without *restart*: it resumes. */
static int resumes_pending(const otafd_device *d, const uint8_t *in) {
    return d->rec.state != OTAFD_IDLE && !(in[14] & 1u) && d->rec.image_size == get32(in + 2) &&
           d->rec.image_crc == get32(in + 6) && d->rec.image_version == get32(in + 10);
}

static size_t handle_begin(otafd_device *d, const uint8_t *in, uint32_t central, uint8_t *out) {
    uint32_t size = get32(in + 2), crc = get32(in + 6), version = get32(in + 10);
    if (in[1] != OTAFD_PROTOCOL_VERSION) return reply(out, OP_BEGIN, OTAFD_UNSUPPORTED_PROTOCOL);
    if (size == 0) return reply(out, OP_BEGIN, OTAFD_INVALID_IMAGE);
    if (size > d->cfg.flash.slot_size) return reply(out, OP_BEGIN, OTAFD_IMAGE_TOO_LARGE);
    if (resumes_pending(d, in)) {
        if (d->rec.state == OTAFD_VERIFIED) {
            d->rec.state = OTAFD_RECEIVING;  /* verified again before it may be activated */
            if (save(d) != 0) return reply(out, OP_BEGIN, OTAFD_FLASH_ERROR);
        }
    } else {
        discard_transfer(d);
        d->rec.image_size = size;
        d->rec.image_crc = crc;
        d->rec.image_version = version;
        d->rec.state = OTAFD_RECEIVING;
        if (save(d) != 0) {
            discard_transfer(d);
            return reply(out, OP_BEGIN, OTAFD_FLASH_ERROR);
        }
    }
    d->owner = central;
    d->held = 0;
    d->gap_reported = 0;
    return reply_position(out, OP_BEGIN, OTAFD_SUCCESS, d->received, d->received_crc);
}

static size_t handle_checkpoint(otafd_device *d, uint32_t offset, uint32_t crc, uint32_t now_ms, uint8_t *out) {
    if (d->rec.state != OTAFD_RECEIVING) return reply(out, OP_CHECKPOINT, OTAFD_INVALID_STATE);
    if (offset < d->rec.committed)
        return reply_position(out, OP_CHECKPOINT, OTAFD_SUCCESS, d->rec.committed, d->rec.committed_crc);
    if (offset > d->received) {
        /* Data beyond a hole is the normal case: hold the command while its data may still come. */
        if (d->cfg.hold_ms > 0 && offset <= d->rec.image_size && offset - d->received <= d->cfg.reorder_capacity) {
            d->held = 1;
            d->held_offset = offset;
            d->held_crc = crc;
            d->held_deadline = now_ms + d->cfg.hold_ms;
            return 0;
        }
        d->gap_reported = 0;
        return reply_position(out, OP_CHECKPOINT, OTAFD_GAP, d->received, d->received_crc);
    }
    /* Compare with what flash holds up to `offset`: the committed CRC extended by a read-back. */
    uint32_t unit = d->cfg.flash.erase_unit;
    uint32_t boundary = offset == d->rec.image_size ? offset : offset & ~(unit - 1u);
    uint32_t at_boundary = d->rec.committed_crc;
    if (flash_crc(d, d->rec.committed, boundary, &at_boundary) != 0) return reply(out, OP_CHECKPOINT, OTAFD_FLASH_ERROR);
    uint32_t at_offset = at_boundary;
    if (offset == d->received) {
        at_offset = d->received_crc;
    } else if (flash_crc(d, boundary, offset, &at_offset) != 0) {
        return reply(out, OP_CHECKPOINT, OTAFD_FLASH_ERROR);
    }
    d->gap_reported = 0;
    if (at_offset != crc) {
        roll_back(d);
        return reply_position(out, OP_CHECKPOINT, OTAFD_CRC_MISMATCH, d->received, d->received_crc);
    }
    if (boundary > d->rec.committed) {
        d->rec.committed = boundary;
        d->rec.committed_crc = at_boundary;
        if (save(d) != 0) return reply(out, OP_CHECKPOINT, OTAFD_FLASH_ERROR);
    }
    return reply_position(out, OP_CHECKPOINT, OTAFD_SUCCESS, offset, crc);
}

static size_t handle_verify(otafd_device *d, uint8_t *out) {
    if (d->rec.state == OTAFD_IDLE) return reply(out, OP_VERIFY, OTAFD_INVALID_STATE);
    uint32_t crc = 0;
    uint8_t status;
    if (d->received < d->rec.image_size) {
        crc = d->received_crc;
        status = OTAFD_INCOMPLETE;
    } else if (flash_crc(d, 0, d->rec.image_size, &crc) != 0) {
        return reply(out, OP_VERIFY, OTAFD_FLASH_ERROR);
    } else if (crc == d->rec.image_crc) {
        d->rec.state = OTAFD_VERIFIED;
        status = save(d) == 0 ? OTAFD_SUCCESS : OTAFD_FLASH_ERROR;
    } else {
        /* Never resume onto data that failed verification. */
        discard_transfer(d);
        status = save(d) == 0 ? OTAFD_CRC_MISMATCH : OTAFD_FLASH_ERROR;
    }
    reply(out, OP_VERIFY, status);
    if (status == OTAFD_FLASH_ERROR) return 3;
    put32(out + 3, crc);
    return 7;
}

static size_t handle_activate(otafd_device *d, uint8_t *out) {
    if (d->rec.state != OTAFD_VERIFIED) return reply(out, OP_ACTIVATE, OTAFD_NOT_VERIFIED);
    /* Checked once more right before booting: nothing boots without a whole-image match. */
    uint32_t crc = 0;
    if (flash_crc(d, 0, d->rec.image_size, &crc) != 0) return reply(out, OP_ACTIVATE, OTAFD_FLASH_ERROR);
    if (crc != d->rec.image_crc) {
        discard_transfer(d);
        (void)save(d);
        return reply(out, OP_ACTIVATE, OTAFD_CRC_MISMATCH);
    }
    uint32_t version = d->rec.image_version;
    discard_transfer(d);
    d->rec.running_crc = crc;
    d->rec.running_version = version;
    if (save(d) != 0) return reply(out, OP_ACTIVATE, OTAFD_FLASH_ERROR);
    d->reboot_requested = 1;
    return reply(out, OP_ACTIVATE, OTAFD_SUCCESS);
}

size_t otafd_control(otafd_device *d, const uint8_t *in, size_t len, uint32_t central, uint32_t now_ms,
                     uint8_t out[OTAFD_NOTIFY_MAX]) {
    static const uint8_t lengths[7] = {0, 15, 9, 1, 1, 1, 1};
    if (len == 0) return reply(out, 0, OTAFD_INVALID_LENGTH);
    uint8_t op = in[0];
    /* Malformed writes are answered first, whoever wrote ("Commands"). */
    if (op < OP_BEGIN || op > OP_ABORT) return reply(out, op, OTAFD_UNKNOWN_OPCODE);
    if (len != lengths[op]) return reply(out, op, OTAFD_INVALID_LENGTH);
    /* "One transfer at a time": another central may read STATUS and resume the pending image
       (it may be the owner under a new address), nothing else. */
    if (op != OP_STATUS && !(op == OP_BEGIN && resumes_pending(d, in)) && d->rec.state != OTAFD_IDLE &&
        d->owner != 0 && central != 0 && central != d->owner)
        return reply(out, op, OTAFD_BUSY);
    d->held = 0;  /* a new command replaces a held CHECKPOINT, which is never answered */
    switch (op) {
    case OP_BEGIN:
        return handle_begin(d, in, central, out);
    case OP_CHECKPOINT:
        return handle_checkpoint(d, get32(in + 1), get32(in + 5), now_ms, out);
    case OP_STATUS:
        reply(out, OP_STATUS, OTAFD_SUCCESS);
        out[3] = (uint8_t)d->rec.state;
        put32(out + 4, d->received);
        put32(out + 8, d->received_crc);
        put32(out + 12, d->rec.image_size);
        put32(out + 16, d->rec.image_crc);
        return 20;
    case OP_VERIFY:
        return handle_verify(d, out);
    case OP_ACTIVATE:
        return handle_activate(d, out);
    default: /* OP_ABORT */
        discard_transfer(d);
        return reply(out, OP_ABORT, save(d) == 0 ? OTAFD_SUCCESS : OTAFD_FLASH_ERROR);
    }
}

size_t otafd_poll(otafd_device *d, uint32_t now_ms, uint8_t out[OTAFD_NOTIFY_MAX]) {
    if (!d->held || (int32_t)(now_ms - d->held_deadline) < 0) return 0;
    d->held = 0;
    d->gap_reported = 0;
    return reply_position(out, OP_CHECKPOINT, OTAFD_GAP, d->received, d->received_crc);
}

int otafd_hold_deadline(const otafd_device *d, uint32_t *deadline_ms) {
    if (d->held) *deadline_ms = d->held_deadline;
    return d->held;
}

void otafd_link_lost(otafd_device *d) { d->held = 0; }

size_t otafd_info(const otafd_device *d, uint8_t out[OTAFD_INFO_SIZE]) {
    memset(out, 0, OTAFD_INFO_SIZE);
    out[0] = OTAFD_PROTOCOL_VERSION;
    out[1] = (uint8_t)d->rec.state;
    out[2] = d->cfg.flash.erases_ahead ? 1u : 0u;
    out[3] = d->cfg.reorder_ranges;
    put32(out + 4, d->cfg.flash.slot_size);
    put32(out + 8, d->rec.running_version);
    put32(out + 12, d->received);
    put32(out + 16, d->rec.image_size);
    put32(out + 20, d->rec.running_crc);
    put32(out + 24, d->cfg.flash.erase_unit);
    put32(out + 28, d->cfg.reorder_capacity);
    out[32] = (uint8_t)(d->cfg.flash.erases_ahead ? 0u : d->cfg.flash.erase_ms);
    out[33] = (uint8_t)(d->cfg.flash.erases_ahead ? 0u : d->cfg.flash.erase_ms >> 8);
    put32(out + 36, d->rec.committed);
    return OTAFD_INFO_SIZE;
}

int otafd_reboot_requested(const otafd_device *d) { return d->reboot_requested; }
