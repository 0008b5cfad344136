#ifndef OTAFLASH_CZLIB_SHIM_H
#define OTAFLASH_CZLIB_SHIM_H
#include <zlib.h>
#endif
