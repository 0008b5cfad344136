/*
 * otaflash_device.h: the device side of the otaflash OTA protocol, version 2 (docs/PROTOCOL.md),
 * in portable C99 for microcontrollers.
 *
 * No heap, no OS, no globals: all state lives in an `otafd_device` the caller provides. The library
 * is GATT-agnostic: the port hands it the bytes a central wrote to the control point or the data
 * characteristic and sends the notification bytes it returns on the control point. Flash is reached
 * through `otafd_flash` (read, program, erase one unit), the persistent record through `otafd_store`.
 * docs/PORTING.md shows a port to Zephyr's GATT API.
 *
 * Threading: every call on one device must come from one context (or under one lock).
 */
#ifndef OTAFLASH_DEVICE_H
#define OTAFLASH_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The protocol version this library speaks. */
#define OTAFD_PROTOCOL_VERSION 2u
/** The longest notification the library returns: size `out` buffers with it. */
#define OTAFD_NOTIFY_MAX 20u
/** The info value's length (docs/PROTOCOL.md, "Info characteristic"). */
#define OTAFD_INFO_SIZE 40u
/** The most ranges beyond a hole a device can be built to hold (`reorder_ranges`). */
#define OTAFD_MAX_RANGES 16u

/** Status codes (docs/PROTOCOL.md, "Status codes"). */
enum otafd_status {
    OTAFD_SUCCESS = 0x00,
    OTAFD_UNKNOWN_OPCODE = 0x01,
    OTAFD_INVALID_LENGTH = 0x02,
    OTAFD_INVALID_STATE = 0x03,
    OTAFD_IMAGE_TOO_LARGE = 0x04,
    OTAFD_GAP = 0x05,
    OTAFD_CRC_MISMATCH = 0x06,
    OTAFD_NOT_VERIFIED = 0x07,
    OTAFD_FLASH_ERROR = 0x08,
    OTAFD_BUSY = 0x09,
    OTAFD_INCOMPLETE = 0x0A,
    OTAFD_UNSUPPORTED_PROTOCOL = 0x0B,
    OTAFD_INVALID_IMAGE = 0x0C
};

/** Transfer states, as the info value and STATUS report them. */
enum otafd_state { OTAFD_IDLE = 0, OTAFD_RECEIVING = 1, OTAFD_VERIFIED = 2 };

/**
 * The update slot's flash. Offsets are relative to the slot's start; the library never passes an
 * offset or length outside [0, slot_size). Each callback returns 0 on success, non-zero on failure.
 */
typedef struct otafd_flash {
    void *ctx;
    int (*read)(void *ctx, uint32_t offset, uint8_t *buf, uint32_t len);
    /** Programs bytes that were erased since they were last programmed (each byte once per erase).
     *  Any alignment: a flash with a write unit above one byte pads with 0xFF or buffers. */
    int (*program)(void *ctx, uint32_t offset, const uint8_t *buf, uint32_t len);
    /** Erases the one erase unit that starts at `offset` (a multiple of `erase_unit`). */
    int (*erase)(void *ctx, uint32_t offset);
    /** Slot capacity in bytes: the largest image. */
    uint32_t slot_size;
    /** Erase unit in bytes, a power of two (1 for memory that needs no erase). */
    uint32_t erase_unit;
    /** Worst-case erase time of one unit in ms, reported in the info value (0 with erases_ahead). */
    uint16_t erase_ms;
    /** Non-zero when the port erases units before the data needs them (docs/PROTOCOL.md). */
    uint8_t erases_ahead;
} otafd_flash;

/** What survives a reboot. The port stores it as an opaque blob; `check` guards against torn writes. */
typedef struct otafd_record {
    uint32_t magic;
    uint32_t running_version;
    uint32_t running_crc;
    uint32_t image_size;    /* 0: no transfer pending */
    uint32_t image_crc;
    uint32_t image_version;
    uint32_t committed;
    uint32_t committed_crc;
    uint32_t state;         /* enum otafd_state */
    uint32_t check;         /* CRC32 of the fields above */
} otafd_record;

/** Non-volatile storage for the record (a settings entry, a flash page, EEPROM). */
typedef struct otafd_store {
    void *ctx;
    /** Fills `r` with the stored record; non-zero when there is none. */
    int (*load)(void *ctx, otafd_record *r);
    /** Stores `r` durably before returning; non-zero on failure. */
    int (*save)(void *ctx, const otafd_record *r);
} otafd_store;

typedef struct otafd_config {
    otafd_flash flash;
    otafd_store store;
    /** Bytes beyond `received` the device keeps when they arrive early (>= 16384 for BlueZ). */
    uint32_t reorder_capacity;
    /** Separate ranges beyond a hole it can track, 0...OTAFD_MAX_RANGES (8 bytes of RAM each). */
    uint8_t reorder_ranges;
    /** How long a CHECKPOINT that overtook its data is held, in ms (300; 0 answers `gap` at once). */
    uint16_t hold_ms;
    /** The running firmware's version (packed major<<24 | minor<<16 | patch) when no record exists. */
    uint32_t initial_version;
} otafd_config;

typedef struct otafd_range { uint32_t start, end; } otafd_range;

/** A device. Treat as opaque; allocate statically. */
typedef struct otafd_device {
    otafd_config cfg;
    otafd_record rec;
    uint32_t received, received_crc;
    uint32_t erased;                 /* units below this (from `committed`) were erased for this transfer */
    otafd_range ahead[OTAFD_MAX_RANGES];
    uint8_t n_ahead;
    uint8_t gap_reported;
    uint8_t held;                    /* a CHECKPOINT waits for its data */
    uint8_t reboot_requested;
    uint32_t held_offset, held_crc, held_deadline;
    uint32_t owner;                  /* 0: none or unknown */
} otafd_device;

/**
 * Sets up `d` from `cfg` and the stored record (a reboot is another call to this).
 * Returns 0, or -1 when the configuration is unusable (missing callbacks, an erase unit that is
 * not a power of two, a slot that is not a whole number of units, too many reorder ranges).
 */
int otafd_init(otafd_device *d, const otafd_config *cfg);

/**
 * A write to the control point from `central` (a port-chosen non-zero token per peer identity;
 * 0 when the stack cannot tell centrals apart). `now_ms` is a monotonic millisecond clock.
 * Writes the notification to send into `out` and returns its length; 0 when nothing is sent now
 * (a CHECKPOINT held for its data). A reply with status OTAFD_BUSY (out[2]) may instead be turned
 * into ATT error 0x89 on the write by a stack that notifies every central (docs/PROTOCOL.md).
 */
size_t otafd_control(otafd_device *d, const uint8_t *in, size_t len, uint32_t central, uint32_t now_ms,
                     uint8_t out[OTAFD_NOTIFY_MAX]);

/** A write to the data characteristic. Returns the length of a notification to send (a GAP event,
 *  or the reply to a held CHECKPOINT), or 0. */
size_t otafd_data(otafd_device *d, const uint8_t *in, size_t len, uint32_t central, uint32_t now_ms,
                  uint8_t out[OTAFD_NOTIFY_MAX]);

/** Call when the hold deadline passes (see otafd_hold_deadline): the `gap` reply of an expired
 *  held CHECKPOINT, or 0. */
size_t otafd_poll(otafd_device *d, uint32_t now_ms, uint8_t out[OTAFD_NOTIFY_MAX]);

/** Non-zero while a CHECKPOINT is held; `*deadline_ms` is when otafd_poll must run. */
int otafd_hold_deadline(const otafd_device *d, uint32_t *deadline_ms);

/** The link to the central dropped: a held CHECKPOINT is forgotten; everything else stays. */
void otafd_link_lost(otafd_device *d);

/** Writes the info value (OTAFD_INFO_SIZE bytes); returns its length. */
size_t otafd_info(const otafd_device *d, uint8_t out[OTAFD_INFO_SIZE]);

/** Non-zero after a successful ACTIVATE: boot the slot's image 100 ms to 2 s after sending its reply. */
int otafd_reboot_requested(const otafd_device *d);

/** CRC-32/ISO-HDLC (zlib's crc32) continued from `crc` (0 to start). */
uint32_t otafd_crc32(uint32_t crc, const uint8_t *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
