#ifndef OTAFLASH_CDBUS_SHIM_H
#define OTAFLASH_CDBUS_SHIM_H
#include <dbus/dbus.h>
#endif
