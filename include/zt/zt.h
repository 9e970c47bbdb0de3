/* zt SDK umbrella header: everything a plugin author needs. */
#ifndef ZT_H
#define ZT_H
#include "zt_plugin.h"
#endif
